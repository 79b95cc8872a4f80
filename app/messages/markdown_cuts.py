"""Where a growing reply's Markdown is settled: offsets in its text before which nothing
appended later can change how the text parses. markdown_stream.py keeps what lies before
the last such cut rendered and parses only the rest again at each push.

A cut is the start of a complete line L after a blank line, where L, at column 0, begins
a block that continues nothing above it. Everything above is then closed, in CommonMark's
terms: a paragraph or indented code ends at the blank line, and every list item and quote
ends at L, which is neither indented, nor lazy continuation (a blank line precedes it),
nor a list marker, a quote, a fence or HTML. What a blank line does not end is followed
here line by line: a fenced code block at the top level, with md4c's rules for opening
and closing fences, and the list items that decide whether an indented fence is inside
one (then it closes with the item at the latest) or at the top level.

Qt's reader also carries state from one block to the next, which the part after a cut,
read on its own, would not have. So the search stops at the first of these, and no cut
follows it: HTML (an unclosed tag's text is carried across blocks; an HTML block may span
blank lines), a task item (its checkbox is kept for the blocks after it), a list item
that may hold no text (the list is then never closed: every block after it is indented
as in a list), and a fence it cannot place for sure (one in a list item that may be
closed, or one right under a line with a "|", which md4c may read as a table's row). L
is no table row or rule either: those read a flag that the block before sets (a code
block or quote before a table gives its first cell a paragraph's margins). Formulas
spanning blank lines and link reference definitions are markdown_stream.py's to check.
Whatever is unsure ends the search: a missed cut renders more, never differently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# After a line's indentation: a list marker and the spaces after it (none at the end).
LIST_MARKER = re.compile(r"(?P<mark>[-+*]|(?P<number>\d{1,9})[.)])(?P<space>[ \t]*)")
FENCE = re.compile(r"(?P<fence>`{3,}|~{3,})(?P<info>.*)")
THEMATIC_BREAK = re.compile(r"(?:(?:-[ \t]*){3,}|(?:\*[ \t]*){3,}|(?:_[ \t]*){3,})")
HTML = re.compile(r"<[A-Za-z/!?]")
TASK_ITEM = re.compile(r"[ \t>]*(?:[-+*]|\d{1,9}[.)])[ \t]+\[[ xX]\]")
CONTAINERS = re.compile(r"[ \t>]*")  # indentation and quote markers before a list marker
# An item's first characters that surely give Qt's reader text (not a rule, a heading,
# an image or a display formula alone): a letter or digit, or emphasis, code, a link or a
# quotation mark before one.
TEXT_FIRST = re.compile(r"(?:\*{1,2}|_{1,2}|`|\[|\(|\"|')?[^\W_]")
NOT_A_CUT = "><["  # L's first character: a quote, HTML, a link definition


@dataclass(frozen=True)
class Item:
    """A list item that may be open, by the column its content starts at (only those with
    content at column 3 or less: a fence indented 1-3 columns may be inside them)."""

    column: int
    is_sure: bool  # open for certain, not only possibly (lazy continuation lines)


def settled_cuts(text: str, start: int = 0) -> list[int]:
    """The cuts in `text` after `start`, in order. `start` is 0 or itself a cut, so that
    the search may begin there as at the start of a document."""
    cuts: list[int] = []
    fence: tuple[str, int] | None = None  # char and length of the open top-level fence
    items: list[Item] = []
    after_blank, after_text = True, False  # the line before: blank, or possibly paragraph
    after_row = False  # the line before holds a "|": it may be a table's row
    at = start
    while at < len(text):
        end = text.find("\n", at)
        is_complete = end >= 0
        end = end if is_complete else len(text)
        line, line_start, at = text[at:end], at, end + 1
        if fence is not None:
            if _closes(line, fence):
                fence, after_blank, after_text = None, False, False
            continue
        body = line.lstrip(" \t")
        if not body:
            after_blank, after_text, after_row = True, False, False
            continue
        indent = len(line[: len(line) - len(body)].expandtabs(4))
        if indent == 0 and after_blank and is_complete and line_start > 0 and _begins(body):
            cuts.append(line_start)
        if HTML.search(line) or TASK_ITEM.match(line) or not _has_text_if_item(line):
            break
        opened = _opening_fence(body) if indent <= 3 else None
        if opened is not None and after_row:
            break  # md4c may read a fence right under a table's row as one more row
        after_row = "|" in line
        if opened is not None:
            inside = [item for item in items if item.column <= indent]
            if any(item.is_sure for item in inside):
                items = inside  # a fence in a list item: it ends with the item at the latest
            elif inside:
                break  # in a list item or at the top level: unsure
            else:
                fence, items = opened, []
            after_blank, after_text = False, False
            continue
        marker = _list_marker(body) if indent <= 3 else None
        is_sure_item = marker is not None and _is_sure_item(marker, body, after_blank, after_text)
        closes = after_blank or is_sure_item  # else the line may be lazy continuation
        items = [
            item if indent >= item.column else Item(item.column, False)
            for item in items
            if indent >= item.column or not closes
        ]
        if marker is not None:
            column = indent + marker.end("mark") + max(1, len(marker.group("space")))
            if column <= 3:
                items.append(Item(column, is_sure_item))
        after_blank, after_text = False, True
    return [cut for cut in cuts if cut > start]


def _begins(body: str) -> bool:
    """Whether a column-0 line after a blank line begins a block that continues nothing,
    and reads nothing left from the block before it."""
    if body[0] in NOT_A_CUT or "|" in body or FENCE.match(body):
        return False
    return not THEMATIC_BREAK.fullmatch(body) and _list_marker(body) is None


def _list_marker(body: str) -> re.Match | None:
    """The list marker a line begins with after its indentation, if any ("-5", "2.5" and
    a rule such as "- - -" have none)."""
    marker = LIST_MARKER.match(body)
    if marker is None or THEMATIC_BREAK.fullmatch(body):
        return None
    if not marker.group("space") and marker.end() < len(body):
        return None
    return marker


def _has_text_if_item(line: str) -> bool:
    """False for a list item's line whose content may give Qt's reader no text."""
    body = line[CONTAINERS.match(line).end() :]
    marker = _list_marker(body)
    return marker is None or TEXT_FIRST.match(body, marker.end()) is not None


def _opening_fence(body: str) -> tuple[str, int] | None:
    match = FENCE.match(body)
    if match is None or (body[0] == "`" and "`" in match.group("info")):
        return None  # md4c: a backtick fence's info string has no backtick
    return body[0], len(match.group("fence"))


def _closes(line: str, fence: tuple[str, int]) -> bool:
    body = line.lstrip(" ")
    char, length = fence
    if len(line) - len(body) > 3 or not body.startswith(char * length):
        return False
    return not body.lstrip(char).strip(" \t")


def _is_sure_item(marker: re.Match, body: str, after_blank: bool, after_text: bool) -> bool:
    """A list marker line that starts a list item for certain, with its content column
    known: it has content, no tab before it, at most 4 spaces after the marker, and it
    cannot be a paragraph's lazy continuation (an ordered item interrupts a paragraph
    only when numbered 1)."""
    space = marker.group("space")
    if marker.end() == len(body) or "\t" in space or not 1 <= len(space) <= 4:
        return False
    number = marker.group("number")
    return after_blank or not after_text or number is None or number == "1"
