"""Plain-text views wrapped to a width: what every text output does when it goes to a terminal.

The views write whole lines; `wrap_text(text, width)` fits each line longer than `width` into
several, keeping what the line's shape says:

- prose breaks between words, its continuation at the line's own indent;
- a list item (`- `, `* `, `1. `) continues under its text (a hanging indent);
- an aligned row (cells apart by two or more spaces: a table row, `label   value  (note)`) keeps
  its cells where they are and wraps its last cell under that cell's start when the rest fits;
  rows too wide even for that break between two cells, at a column all the rows of their table
  agree on (so the table stays aligned), never between a label and the figure after it, and
  continue further in, under the row.

A break never falls inside a word, between a number and its unit ("16.00 MiB") or inside a path; a
token longer than the width stands whole on a line of its own. Blank lines and lines that fit are
left as they are, so a text is only ever changed where it was too wide. `fill` words one paragraph
with given prefixes (`oomdoctor explain`); `reflow` fits a `--help` text, paragraphs rejoined.
"""

from __future__ import annotations

import re

# a number and the unit after it wrap as one token
_UNIT = re.compile(r"^(?:bytes?|[KMGTPE]i?B|B)(?=$|[,.;:)\]\"'!?])")
_ENDS_IN_NUMBER = re.compile(r"\d$")
_TOKEN = re.compile(r"(\s*)(\S+)")
_GAP = re.compile(r" {2,}")
_ITEM = re.compile(r"^(?:[-*] |\d{1,3}[.)] )")
_FIGURE = re.compile(r"^[-+~≈]?\d")
# the least room an aligned row's last cell is wrapped into at its own column; with less, the row
# breaks between cells instead
MIN_LAST_CELL = 24
# how much further in than its row the rest of a row too wide for its cells continues
ROW_CONTINUATION = 4


def wrap_text(text: str, width: int | None) -> str:
    """`text` with each line longer than `width` wrapped (None: `text` as it is)."""
    if width is None or width <= 0:
        return text
    lines = text.split("\n")
    if all(len(line) <= width for line in lines):
        return text
    return "\n".join(wrap_lines(lines, width))


def wrap_lines(lines: list[str], width: int) -> list[str]:
    """The lines, each too wide one wrapped to `width`; rows of one table are broken alike."""
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if _is_row(line):
            end = index + 1
            indent = _indent(line)
            while end < len(lines) and _is_row(lines[end]) and _indent(lines[end]) == indent:
                end += 1
            out += _wrap_rows(lines[index:end], width)
            index = end
            continue
        out += wrap_line(line, width)
        index += 1
    return out


def wrap_line(line: str, width: int) -> list[str]:
    """One line as one or more lines of at most `width` (but for a token longer than that)."""
    if len(line) <= width:
        return [line]
    indent = " " * _indent(line)
    body = line[len(indent) :]
    item = _ITEM.match(body)
    if item is not None:
        prefix = indent + item.group(0)
        return fill(body[item.end() :], width, prefix, " " * len(prefix))
    if _is_row(line):
        return _wrap_rows([line], width)
    return fill(body, width, indent, indent)


def fill(text: str, width: int, first: str = "", rest: str = "") -> list[str]:
    """`text` in lines of at most `width`, the first after `first`, the others after `rest`, broken
    only between tokens; runs of spaces inside a line are kept."""
    lines: list[str] = []
    current, empty = first, True
    for space, token in _tokens(text):
        if empty:
            current, empty = current + token, False
        elif len(current) + len(space) + len(token) <= width:
            current += space + token
        else:
            lines.append(current)
            current = rest + token
    lines.append(current if not empty else current.rstrip())
    return lines


def reflow(text: str, width: int) -> str:
    """A `--help` text fitted to `width`: each paragraph's unindented lines rejoined and wrapped as
    one, indented lines (examples, tables) kept as lines and wrapped only where too wide; a table
    row's last cell that goes on under it (lines indented to that cell, without cells of their own)
    is rejoined and wrapped as one."""
    out: list[str] = []
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            out.extend(fill(" ".join(paragraph), width))
            paragraph.clear()

    for line in text.split("\n"):
        if line and not line[0].isspace():
            paragraph.append(line.strip())
            continue
        flush()
        if out and line.strip() and not _is_row(line) and _is_row(out[-1]):
            column = _cells(out[-1])[-1][0]
            if _indent(line) == column > _indent(out[-1]):
                out[-1] = out[-1].rstrip() + " " + line.strip()
                continue
        out.append(line)
    flush()
    return "\n".join(wrap_lines(out, width))


# --- tokens and rows ------------------------------------------------------------------------------


def _tokens(text: str) -> list[tuple[str, str]]:
    """(the spaces before it, token) for each token of `text`; a number and its unit are one."""
    tokens: list[tuple[str, str]] = []
    for match in _TOKEN.finditer(text):
        space, word = match.group(1), match.group(2)
        if space.strip(" "):  # a newline or a tab between words: one space
            space = " "
        if tokens and space == " " and _UNIT.match(word) and _ENDS_IN_NUMBER.search(tokens[-1][1]):
            before, number = tokens.pop()
            tokens.append((before, f"{number} {word}"))
        else:
            tokens.append((space, word))
    return tokens


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _is_row(line: str) -> bool:
    """An aligned row: two cells or more apart by a gap of two spaces or more (a list item is prose)."""
    body = line.lstrip(" ")
    return bool(body) and _ITEM.match(body) is None and _GAP.search(body.rstrip()) is not None


def _cells(line: str) -> list[tuple[int, str]]:
    """(column, text) of each cell of an aligned row."""
    cells, start = [], _indent(line)
    body = line.rstrip()
    for gap in _GAP.finditer(body, start):
        cells.append((start, body[start : gap.start()]))
        start = gap.end()
    cells.append((start, body[start:]))
    return cells


def _wrap_rows(rows: list[str], width: int) -> list[str]:
    """Rows of one table (or one aligned row) fitted to `width`."""
    return [line for lines in _row_lines(rows, width) for line in lines]


def _row_lines(rows: list[str], width: int, pad: int | None = None) -> list[list[str]]:
    """The lines each row of one table becomes at `width`; `pad`: the indent of a row's rest."""
    if all(len(row) <= width for row in rows):
        return [[row] for row in rows]
    if all(len(row) <= width or _last_cell_fits(row, width) for row in rows):
        out = []
        for row in rows:
            column, last = _cells(row)[-1]
            out.append([row] if len(row) <= width else fill(last, width, row[:column], " " * column))
        return out
    if pad is None:
        pad = _indent(rows[0]) + ROW_CONTINUATION
    cut = _common_break(rows, width, pad)
    if cut is None:
        if len(rows) > 1:  # no column the rows agree on: each row breaks where it can
            return [_row_lines([row], width, pad)[0] for row in rows]
        indent = " " * _indent(rows[0])
        return [fill(rows[0].strip(), width, indent, " " * pad)]
    out = [[row[:cut].rstrip()] for row in rows]
    live = [index for index, row in enumerate(rows) if row[cut:].strip()]
    shift = min(_indent(rows[index][cut:]) for index in live)
    rests = [" " * pad + rows[index][cut + shift :] for index in live]
    for index, lines in zip(live, _row_lines(rests, width, pad)):
        out[index] += lines
    return out


def _last_cell_fits(row: str, width: int) -> bool:
    """Whether the row's last cell can be wrapped at its own column: room enough, every token in it."""
    column, last = _cells(row)[-1]
    room = width - column
    return room >= MIN_LAST_CELL and all(len(token) <= room for _, token in _tokens(last))


def _common_break(rows: list[str], width: int, pad: int) -> int | None:
    """The rightmost column at most `width` where every row that reaches it has a gap between two
    cells (not one that parts a label from its figure), that leaves each row too wide at least half
    the width before it and a shorter rest after it; None when there is none."""
    wide = [row for row in rows if len(row) > width]
    for cut in range(min(width, max(len(row) for row in rows) - 1), _indent(rows[0]) + 1, -1):
        if not all(len(row[:cut].rstrip()) >= width // 2 for row in wide):
            return None
        if all(_breaks_at(row, cut) for row in rows):
            if all(pad + len(row[cut:].lstrip(" ")) < len(row) for row in wide):
                return cut
    return None


def _breaks_at(row: str, cut: int) -> bool:
    """Whether `row` may be cut at column `cut`: past its end, or inside a gap of two spaces or more
    that does not part a label (words without a digit) from the figure after it."""
    if cut >= len(row.rstrip()):
        return True
    if row[cut - 1 : cut + 1] != "  ":
        return False
    before, after = row[:cut].rstrip(), row[cut:].lstrip(" ")
    if not before.strip():
        return False
    left = _GAP.split(before.strip())[-1]
    return not (_FIGURE.match(after) and not any(ch.isdigit() for ch in left))
