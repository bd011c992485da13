"""`oomdoctor report --format md` is safe to paste into a GitHub issue whatever the dump holds.

Every string field a dump can carry into the Markdown report (argv, host, versions, device name,
exception type, alloc conf, recording, reason, frame file and function names, registry tensor
names, the file's own name) is filled with one hostile payload at a time: runs of backticks that
would close a code span, a fence break-out that would close the <details> section and inject a
heading, raw HTML, Markdown images and links, an @mention, a #reference and terminal escapes. The
report is rendered with markdown-it (CommonMark with raw HTML on, plus GFM tables) and judged on
its token stream: only the report's own HTML, headings and fences, no image, no link, no mention
outside code, no control character; and each payload is still there, as text.
"""

from __future__ import annotations

import re

import pytest
from markdown_it import MarkdownIt

from oomdoctor.cli import main
from oomdoctor.safetext import printable
from oomdoctor.views.markdown_report import code_block, code_span, inline_text
from tests.builders import payload_dump, tagged, write_pickle

PAYLOADS = {
    "backtick": "a`b",
    "two-backticks": 'x`` </details><img src="https://evil.example/p.png"> @someone [click](https://evil.example) ``',
    "three-backticks": "```\n<b>injected</b>\n```",
    "edge-backticks": "`` <b>injected</b> ``",
    "fence-breakout": "\n```\n</details>\n\n# injected heading\n",
    "leading-heading": "# injected heading",
    "html-image": "<img src=https://evil.example/p.png>",
    "markdown-image": "![x](https://evil.example/p.png)",
    "link": "[click](https://evil.example)",
    "autolink": "<https://evil.example>",
    "reference-link": "[click]\n\n[click]: https://evil.example",
    "mention": "@someone",
    "team-mention": "hi @org/team and #12",
    "emphasis": "**bold** _it_ ~~gone~~ \\",
    "entity": "&lt;img src=x&gt; &#64;someone",
    "terminal": "\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07\x1b[2J\x9b31m\u202e",
}

# the fields a payload is put in, each under its own tag so that its text can be found again
# (the tags payload_dump gives them; the allocator settings' conf is shown rather than the metadata's)
FIELDS = (
    "argv", "host", "torch", "cuda", "python", "oomdoctor", "device", "exception_type", "settings_conf",
    "stacks", "context", "reason", "filename", "function", "tensor", "gradient", "optimizer_state",
)  # fmt: skip


def _report(tmp_path, capsysbinary, data: dict, *options: str, name: str = "dump.pickle") -> str:
    path = write_pickle(tmp_path / name, data)
    assert main(["report", str(path), "--format", "md", *options]) == 0
    return capsysbinary.readouterr().out.decode("utf-8")


_MD = MarkdownIt("commonmark", {"html": True}).enable("table")
_HTML_ALLOWED = re.compile(
    r"<details>\n<summary>The \d+ largest live blocks \(of \d+\) and where they were allocated</summary>\n|</details>\n|<br>|</?sub>"
)
_HEADINGS = re.compile(
    r"oomdoctor: \S+ \(confidence \d+%\)|Evidence|What to change|Memory (at the OOM|at the peak|when the dump was written)|Live memory by component"
    r"|Fragmentation|What if the batch \(or sequence\) were scaled|OOM events on this device|Steps|Also found|Not determined from this file|Environment"
)


def _walk(tokens):
    for token in tokens:
        yield token
        if token.children:
            yield from _walk(token.children)


def _visible(tokens) -> str:
    """What a reader sees: text, code and fenced code, in order."""
    return "".join(t.content for t in _walk(tokens) if t.type in ("text", "code_inline", "fence", "code_block"))


def _assert_safe(markdown: str, clean: str) -> list:
    for character in markdown:
        assert character == "\n" or printable(character) == character, f"control character {character!r} in the report"
    tokens = _MD.parse(markdown)
    clean_tokens = _MD.parse(clean)
    kinds = [t.type for t in _walk(tokens)]
    assert "image" not in kinds and "link_open" not in kinds
    for token in _walk(tokens):
        if token.type in ("html_inline", "html_block"):
            assert _HTML_ALLOWED.fullmatch(token.content), token.content
        if token.type == "text":
            assert not re.search(r"[@#]\w", token.content), f"a mention or reference outside code: {token.content!r}"
    html = lambda ts: [t.content for t in _walk(ts) if t.type in ("html_inline", "html_block")]  # noqa: E731
    assert html(tokens) == html(clean_tokens)
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings and all(_HEADINGS.fullmatch(h) for h in headings), headings
    assert len(headings) == len([t for t in clean_tokens if t.type == "heading_open"])
    shape = lambda ts: [  # noqa: E731
        t.type for t in _walk(ts) if t.type.endswith("_open") or t.type in ("fence", "html_block", "hr")
    ]  # noqa: E731
    assert shape(tokens) == shape(clean_tokens), "the report's structure changed (blocks, emphasis, code fences)"
    for token in _walk(tokens):  # tables: every row has as many cells as the header
        if token.type == "table_open":
            rows, cells = [], 0
        elif token.type in ("th_open", "td_open"):
            cells += 1
        elif token.type == "tr_close":
            rows.append(cells)
            cells = 0
        elif token.type == "table_close":
            assert len(set(rows)) == 1, rows
    return tokens


@pytest.fixture(scope="module")
def clean_dump() -> dict:
    return payload_dump("plain")


@pytest.mark.parametrize("redact", [False, True], ids=["plain", "redacted"])
@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_no_payload_escapes_into_markdown(tmp_path, capsysbinary, clean_dump, payload, redact):
    options = ("--redact",) if redact else ()
    clean = _report(tmp_path, capsysbinary, clean_dump, *options)
    markdown = _report(tmp_path, capsysbinary, payload_dump(payload), *options)
    tokens = _assert_safe(markdown, clean)
    if redact:
        return
    seen = _visible(tokens)
    for field in FIELDS:
        # still there as the reader sees it: nothing dropped, controls shown as \\x escapes
        assert printable(tagged(field, payload)) in seen, field


def test_the_fields_reach_the_report(tmp_path, capsysbinary):
    """Each field tested above does appear in the report (else the test would prove nothing)."""
    markdown = _report(tmp_path, capsysbinary, payload_dump("plain"))
    for field in FIELDS:
        assert tagged(field, "plain") in markdown, field
    evidence = markdown.split("### Evidence", 1)[1].split("###", 1)[0]
    assert tagged("optimizer_state", "plain") in evidence  # a registry name in the running text
    assert (
        f"`{tagged('filename', 'plain')}.py:7 in {tagged('function', 'plain')}`" in evidence
    )  # a frame in a code span
    stack = markdown.split("<details>", 1)[1]
    assert f"\n```\n{tagged('filename', 'plain')}.py:7 in {tagged('function', 'plain')}\n" in stack


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_hostile_file_name(tmp_path, capsysbinary, clean_dump, payload):
    name = printable(payload).replace("/", "%") + ".pickle"
    clean = _report(tmp_path, capsysbinary, clean_dump)
    markdown = _report(tmp_path, capsysbinary, clean_dump, name=name)
    tokens = _assert_safe(markdown, clean.replace("dump.pickle", name))
    assert printable(str(tmp_path / name)) in _visible(tokens)


def test_code_span_fence_outlasts_every_backtick_run():
    for text in ("a", "a`b", "``", "x`` y ``", "`start", "end`", " both ", "```fence```", "a\nb", "   "):
        span = code_span(text)
        [inline] = [t for t in _MD.parse(span) if t.type == "inline"]
        [code] = inline.children
        assert code.type == "code_inline" and code.content == printable(text), (text, span)
    assert code_span("a|b", cell=True) == "`a\\|b`"


def test_code_block_fence_outlasts_every_backtick_run():
    lines = ["plain", "````", "x ``` y", "```"]
    [fence] = _MD.parse("\n".join(code_block(lines)) + "\n</details>\n")[:1]
    assert fence.type == "fence" and fence.content == "\n".join(lines) + "\n"
    assert code_block(["a.py:1 in f"]) == ["```", "a.py:1 in f", "```"]


@pytest.mark.parametrize(
    "text",
    [
        "optimizer state alive at the OOM (largest: body.2.weight.exp_avg)",
        "Pass foreach=False (or fused=True) to the optimizer.step() call: 100.22 MiB, 3 of 4",
        "MLP.forward arg 0; user@host; __init__ in models.py",
    ],
)
def test_ordinary_text_is_left_as_it_is(text):
    assert inline_text(text) == text.replace("@host", "`@`host").replace("__init__", "\\_\\_init\\_\\_")


def test_math_and_strikethrough_are_escaped():
    assert inline_text("$x$ ~~y~~ *z*") == "\\$x\\$ \\~\\~y\\~\\~ \\*z\\*"


def test_mentions_and_references_never_notify():
    for text in ("@someone", "cc @org/team", "see #12", "owner/repo#12", "(@a)"):
        tokens = _MD.parse(inline_text(text))
        assert not any(re.search(r"[@#]\w", t.content) for t in _walk(tokens) if t.type == "text"), text
        assert _visible(tokens) == text


@pytest.mark.parametrize("text", ["# heading", "- item", "+ item", "1. item", "12) item", "  # heading"])
def test_text_cannot_start_a_block_inside_a_list_item(text):
    tokens = _MD.parse(f"- {inline_text(text)}\n")
    assert [t.type for t in tokens if t.type.endswith("_open")] == [
        "bullet_list_open",
        "list_item_open",
        "paragraph_open",
    ], text
    assert _visible(tokens) == text.lstrip()


def test_the_changes_own_code_is_code_in_markdown():
    """oomdoctor's own sentences keep their code spans in the Markdown table (they were escaped into
    literal backticks); only text from the file is escaped."""
    from oomdoctor.views.markdown_report import _own_cell

    cell = _own_cell("accumulate `loss.item()`, not `loss`")
    assert cell == "accumulate `loss.item()`, not `loss`"
    assert "\\`" not in _own_cell("a `x|y` b")  # a pipe inside stays inside its code span
    assert _own_cell("an unpaired ` tick") == _cell_of("an unpaired ` tick")


def _cell_of(text: str) -> str:
    from oomdoctor.views.markdown_report import _cell

    return _cell(text)
