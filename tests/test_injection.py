"""Escape, markup, Markdown and HTML payloads in every string field of a dump, through every output.

No raw ESC/OSC/C1 byte reaches text, Markdown, info or an error line; JSON keeps the strings as
data (escaped by the encoder, read back unchanged); the Markdown report renders with no image,
link, raw HTML or mention that the payload brought; the terminal app's builders give escaped text.
"""

from __future__ import annotations

import json
import pickle
import re

import pytest
from markdown_it import MarkdownIt

from oomdoctor.cli import main

MIB = 1 << 20
BASE = 0x7F0000000000

PAYLOADS = {
    "escape": "\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b]8;;https://evil.example\x1b\\\x9b31m\u202e",
    "markup": "[@click=app.screenshot('victim.txt','.')]click[/] [/bold] [link=file:///etc/passwd]x[/link]",
    "markdown": "x`` </details> ![i](https://evil.example/p.png) [l](https://evil.example) @someone ``\n```\n# heading",
    "html": "<img src=https://evil.example/p.png><script>alert(1)</script></details>",
}
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]")


def _dump(payload: str) -> dict:
    """A small dump that runs out of memory, with `payload` in every string field torch or
    oomdoctor writes (frames, segment type, annotations, event metadata, every metadata text)."""

    def v(field):
        return f"{field}:{payload}:end"

    frames = [
        {"filename": v("filename") + ".py", "line": 7, "name": v("function")},
        {"filename": "train.py", "line": 3, "name": "main"},
    ]
    blocks, events = [], []
    for i in range(3):
        address = BASE + i * 2 * MIB
        blocks.append(
            {
                "address": address,
                "size": 2 * MIB,
                "requested_size": 2 * MIB,
                "state": "active_allocated",
                "frames": frames,
            }
        )
        events.append({
            "action": "alloc", "addr": address, "size": 2 * MIB, "stream": 0, "time_us": i + 1, "frames": frames,
            "compile_context": v("compile_context"), "user_metadata": v("user_metadata"),
        })  # fmt: skip
    events.append({
        "action": "oom", "addr": 0, "size": 1 << 30, "stream": 0, "time_us": 9, "frames": frames, "device_free": 0,
        "compile_context": v("compile_context"), "user_metadata": v("user_metadata"),
    })  # fmt: skip
    segment = {
        "device": 0,
        "address": BASE,
        "total_size": 6 * MIB,
        "stream": 0,
        "segment_type": v("segment_type"),
        "blocks": blocks,
        "frames": frames,
    }
    tensors = [
        {
            "address": BASE,
            "device": 0,
            "component": "parameter",
            "name": v("tensor"),
            "shape": [512, 1024],
            "dtype": v("dtype"),
            "size_bytes": 2 * MIB,
        },
        {"address": BASE + 2 * MIB, "device": 0, "component": "gradient", "name": v("gradient"), "size_bytes": 2 * MIB},
        {
            "address": BASE + 4 * MIB,
            "device": 0,
            "component": "optimizer_state",
            "name": v("optimizer_state"),
            "size_bytes": 2 * MIB,
        },
    ]
    meta = {
        "schema_version": 1, "argv": ["train.py", v("argv")], "host": v("host"), "pid": 4242,
        "versions": {"torch": v("torch"), "cuda": v("cuda"), "python": v("python"), "oomdoctor": v("oomdoctor")},
        "device": {"index": 0, "name": v("device"), "total_memory_bytes": 6 * MIB},
        "exception": {"type": v("exception_type"), "message": v("exception_message"), "traceback": v("traceback")},
        "alloc_conf": {"PYTORCH_CUDA_ALLOC_CONF": v("alloc_conf")},
        "recording": {"max_entries": 100, "stacks": v("stacks"), "context": v("context")},
        "reason": v("reason"), "oom": {"device": 0, "alloc_bytes": 1 << 30}, "tensors": tensors,
        "markers": [{"phase": v("phase"), "edge": v("edge"), "step": 0, "time_us": 1}],
        v("extra_key"): v("extra_value"),
    }  # fmt: skip
    return {
        "segments": [segment],
        "device_traces": [events],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": v("settings_conf"),
            "max_split_size": -1,
            v("settings_key"): v("settings_value"),
        },
        "external_annotations": [{"name": v("annotation"), "stage": "START", "device": 0, "time_us": 2}],
        "oomdoctor": meta,
    }


def _write(tmp_path, payload):
    name = f"dump-{list(PAYLOADS.values()).index(payload)}.pickle"
    path = tmp_path / name
    path.write_bytes(pickle.dumps(_dump(payload), protocol=4))
    return path


def _run(capsysbinary, *arguments):
    code = main(list(arguments))
    captured = capsysbinary.readouterr()
    return code, captured.out.decode("utf-8"), captured.err.decode("utf-8")


@pytest.mark.parametrize("kind", sorted(PAYLOADS))
@pytest.mark.parametrize("output", ["text", "md", "info", "redact-text", "redact-md"])
def test_no_raw_control_character_in_any_text_output(tmp_path, capsysbinary, kind, output):
    path = _write(tmp_path, PAYLOADS[kind])
    arguments = {
        "text": ["report", str(path)],
        "md": ["report", str(path), "--format", "md"],
        "info": ["info", str(path)],
        "redact-text": ["report", str(path), "--redact"],
        "redact-md": ["report", str(path), "--format", "md", "--redact"],
    }[output]
    code, out, err = _run(capsysbinary, *arguments)
    assert code == 0, err
    assert not RAW_CONTROL.search(out), RAW_CONTROL.search(out)
    assert not RAW_CONTROL.search(err)
    if kind == "escape" and output in ("text", "md"):
        assert "\\x1b]0;pwned\\x07" in out  # shown, escaped, not dropped


@pytest.mark.parametrize("kind", sorted(PAYLOADS))
def test_json_keeps_strings_as_data(tmp_path, capsysbinary, kind):
    path = _write(tmp_path, PAYLOADS[kind])
    code, out, _ = _run(capsysbinary, "report", str(path), "--format", "json")
    assert code == 0
    assert not RAW_CONTROL.search(out)  # the encoder escapes them: \u001b
    report = json.loads(out)
    assert report["environment"]["host"] == f"host:{PAYLOADS[kind]}:end"  # read back unchanged
    code, out, _ = _run(capsysbinary, "info", str(path), "--format", "json")
    assert code == 0 and not RAW_CONTROL.search(out)


@pytest.mark.parametrize("kind", sorted(PAYLOADS))
def test_markdown_brings_no_live_construct(tmp_path, capsysbinary, kind):
    path = _write(tmp_path, PAYLOADS[kind])
    _, markdown, _ = _run(capsysbinary, "report", str(path), "--format", "md")
    clean = tmp_path / "clean.pickle"
    clean.write_bytes(pickle.dumps(_dump("plain"), protocol=4))
    _, plain, _ = _run(capsysbinary, "report", str(clean), "--format", "md")
    parser = MarkdownIt("commonmark", {"html": True}).enable("table")

    def kinds(text):
        found = []
        stack = list(parser.parse(text))
        while stack:
            token = stack.pop()
            found.append((token.type, token.content if token.type.startswith("html") else ""))
            stack.extend(token.children or ())
            if token.type == "text" and re.search(r"(?<![\w`])@someone", token.content):
                found.append(("mention", token.content))
        return sorted(found)

    hostile, reference = kinds(markdown), kinds(plain)
    for token_type in ("image", "link_open", "mention", "html_inline", "html_block", "heading_open", "fence"):
        assert [t for t in hostile if t[0] == token_type] == [t for t in reference if t[0] == token_type], token_type


@pytest.mark.parametrize("kind", sorted(PAYLOADS))
def test_redacted_dump_carries_no_raw_control_to_its_reports(tmp_path, capsysbinary, kind):
    path = _write(tmp_path, PAYLOADS[kind])
    out = tmp_path / "shared.pickle"
    code, _, err = _run(capsysbinary, "redact", str(path), str(out))
    assert code == 0, err
    assert not RAW_CONTROL.search(err)
    code, text, _ = _run(capsysbinary, "report", str(out))
    assert code == 0 and not RAW_CONTROL.search(text)


@pytest.mark.parametrize("kind", sorted(PAYLOADS))
def test_terminal_app_builders_give_escaped_text(tmp_path, kind):
    from oomdoctor.analysis import analyse, replayer
    from oomdoctor.load import load
    from oomdoctor.tui import content

    snapshot = load(_write(tmp_path, PAYLOADS[kind]))
    analysis = analyse(snapshot)
    texts = []
    for section in content.overview_sections(analysis, source="dump.pickle"):
        texts.append(section.title)
        texts.extend(section.lines)
    state = replayer(snapshot, analysis.device).state_at(analysis.replay.target_index)
    for segment in state.segments:
        texts.append(content.segment_pool(segment))
    for block in analysis.live_blocks:
        texts.extend(content.stack_lines(block.frames))
    joined = "\n".join(str(t) for t in texts)
    assert not RAW_CONTROL.search(joined.replace("\n", " "))
