"""Load, analyse, render: the one place the layers are put together for one file. The verbs
(oomdoctor/commands) call these; the terminal app runs `load_and_analyse` in its worker, handed to
it by `open` and `demo`.

    snapshot, analysis = load_and_analyse(path, device=None, max_bytes=None, enter_stage=print)
    report_file(path, "md", redact=True)         # bytes: `oomdoctor report FILE`
    render_report(snapshot, "json", source=...)  # bytes: the report of a loaded snapshot
    info_file(path, "text")                      # str: `oomdoctor info FILE`

Heavy or large modules (the analysis, the views, redaction) are imported when a function needs them.
"""

from __future__ import annotations

from collections.abc import Callable

from oomdoctor.errors import OomdoctorError


def require_device(snapshot, device: int | None, source: str) -> None:
    """Refuse a --device the snapshot has no memory of (None: the failing one, always there)."""
    if device is not None and (device < 0 or device not in snapshot.devices):
        known = ", ".join(str(d) for d in snapshot.devices) or "none"
        raise OomdoctorError(f"{source}: no device {device} in this snapshot (devices: {known})")


def load_snapshot(path, *, device: int | None = None, max_bytes: int | None = None):
    """The snapshot in `path`, refused when it has no `device` (None: the failing one)."""
    from oomdoctor.load import load

    snapshot = load(path, max_bytes=max_bytes)
    require_device(snapshot, device, str(path))
    return snapshot


def load_and_analyse(
    path,
    *,
    device: int | None = None,
    max_bytes: int | None = None,
    enter_stage: Callable[[str], None] | None = None,
):
    """(snapshot, analysis of `device`): what the terminal app shows. `enter_stage` hears of each
    stage after reading the file ("analysing")."""
    from oomdoctor.analysis import analyse

    snapshot = load_snapshot(path, device=device, max_bytes=max_bytes)
    if enter_stage is not None:
        enter_stage("analysing")
    return snapshot, analyse(snapshot, device=device)


def render_report(
    snapshot, output_format: str, *, source: str | None = None, redact: bool = False, device: int | None = None
) -> bytes:
    """The report of a loaded snapshot in one format ("text", "md", "json"), as `report` prints it."""
    from oomdoctor.analysis import analyse
    from oomdoctor.analysis.environment import environment_of

    analysis = analyse(snapshot, device=device)
    environment = environment_of(snapshot)
    if redact:
        from oomdoctor.redact import Redactor, redact_analysis, redact_environment

        redactor = Redactor.from_snapshot(snapshot)
        analysis = redact_analysis(analysis, redactor)
        environment = redact_environment(environment, redactor)
        source = redactor.source(source) if source else source
    if output_format == "json":
        from oomdoctor.views.json_report import render as render_json

        return render_json(analysis, environment=environment)
    if output_format == "md":
        from oomdoctor.views.markdown_report import render as render_markdown

        return render_markdown(analysis, source=source, environment=environment).encode()
    from oomdoctor.views.text_report import render as render_text

    return render_text(analysis, source=source).encode()


def report_file(
    path: str, output_format: str, *, redact: bool = False, device: int | None = None, max_bytes: int | None = None
) -> bytes:
    """`oomdoctor report FILE` in "text", "md" or "json"."""
    snapshot = load_snapshot(path, device=device, max_bytes=max_bytes)
    return render_report(snapshot, output_format, source=str(path), redact=redact, device=device)


def info_file(path: str, output_format: str, *, max_bytes: int | None = None) -> str:
    """`oomdoctor info FILE` in "text" or "json"."""
    from oomdoctor.analysis.contents import describe
    from oomdoctor.views.info import to_json, to_text

    contents = describe(load_snapshot(path, max_bytes=max_bytes), path)
    return to_json(contents) + "\n" if output_format == "json" else to_text(contents)
