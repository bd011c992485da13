"""Escape, markup, Markdown and HTML payloads in every string field of a dump, through every output.

No raw ESC/OSC/C1 byte reaches text, Markdown, info or an error line; JSON keeps the strings as
data (escaped by the encoder, read back unchanged); the Markdown report renders with no image,
link, raw HTML or mention that the payload brought; the terminal app's builders give escaped text.
"""

from __future__ import annotations

import json
import re

import pytest
from markdown_it import MarkdownIt

from oomdoctor.cli import main
from tests.builders import payload_dump, write_pickle

PAYLOADS = {
    "escape": "\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b]8;;https://evil.example\x1b\\\x9b31m\u202e",
    "markup": "[@click=app.screenshot('victim.txt','.')]click[/] [/bold] [link=file:///etc/passwd]x[/link]",
    "markdown": "x`` </details> ![i](https://evil.example/p.png) [l](https://evil.example) @someone ``\n```\n# heading",
    "html": "<img src=https://evil.example/p.png><script>alert(1)</script></details>",
}
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]")


def _write(tmp_path, payload):
    name = f"dump-{list(PAYLOADS.values()).index(payload)}.pickle"
    return write_pickle(tmp_path / name, payload_dump(payload))


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
    clean = write_pickle(tmp_path / "clean.pickle", payload_dump("plain"))
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
