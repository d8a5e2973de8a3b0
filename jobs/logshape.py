"""What a log line shows: the one rule the server's search and the page's log viewer both follow.

A trainer's line is shown as a terminal would show it: only the text after the last carriage
return (a trailing empty part, as in "50%\\r", does not count), colours and styles from SGR
escapes kept as CSS class names, every other escape sequence and control character dropped.
The server shapes each line it sends the viewer (`segments`), searches the text that shaping
leaves (`shown_text`), and says where a hit is in it (`find`); the viewer renders what it is
given and keeps no escape table of its own.

Text is compared with `str.casefold`; the page gets the few characters whose folding differs
from lowercasing (`casefold_exceptions`) so that its highlighting of loaded lines agrees.
"""

import re
import sys
from collections.abc import Sequence
from functools import cache

# CSI (ESC [ ... final byte), OSC (ESC ] ... BEL or ST), DCS/SOS/PM/APC strings, other ESC
# sequences, 8-bit CSI, and every other control character but tab and newline.
ESCAPES = re.compile(
    r"\x1b\[([0-?]*)[ -/]*([@-~])"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[ -/]*[0-~]?"
    r"|\x9b[0-?]*[ -/]*[@-~]"
    r"|[\x00-\x08\x0b-\x1a\x1c-\x1f\x7f-\x9f]"
)
# Nothing to interpret (the common case): the line shows as it is.
_PLAIN = re.compile(r"[^\x00-\x08\x0b-\x1f\x7f-\x9f]*")
_PLAIN_ASCII = bytes(b for b in range(128) if _PLAIN.fullmatch(chr(b)))
_SGR_PARAMS = re.compile(r"[\d;:]*")

COLOURS = ("black", "red", "green", "yellow", "blue", "magenta", "cyan", "white")

Segment = tuple[str, str]  # (text, CSS classes: "" or e.g. "ansi-green ansi-bold")


def _colour_name(n: int) -> str:
    return COLOURS[n] if n < 8 else f"bright-{COLOURS[n - 8]}"


class _Style:
    __slots__ = ("bg", "bold", "dim", "fg", "italic", "underline")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.fg: int | None = None
        self.bg: int | None = None
        self.bold = self.dim = self.italic = self.underline = False

    def apply(self, params: str) -> None:
        """An SGR sequence's parameters ("1;32"; "" is a reset)."""
        codes = [_leading_int(p) for p in params.split(";")] if params else [0]
        i = 0
        while i < len(codes):
            c = codes[i]
            if c == 0:
                self.reset()
            elif c in (1, 2, 3, 4):
                setattr(self, ("bold", "dim", "italic", "underline")[c - 1], True)
            elif c == 22:
                self.bold = self.dim = False
            elif c == 23:
                self.italic = False
            elif c == 24:
                self.underline = False
            elif 30 <= c <= 37:
                self.fg = c - 30
            elif c == 39:
                self.fg = None
            elif 40 <= c <= 47:
                self.bg = c - 40
            elif c == 49:
                self.bg = None
            elif 90 <= c <= 97:
                self.fg = c - 90 + 8
            elif 100 <= c <= 107:
                self.bg = c - 100 + 8
            elif c in (38, 48):
                # 256 colours: the first 16 are the named ones; other palettes and RGB are skipped.
                value = None
                kind = codes[i + 1] if i + 1 < len(codes) else None
                if kind == 5:
                    n = codes[i + 2] if i + 2 < len(codes) else None
                    value = n if n is not None and n < 16 else None
                    i += 2
                elif kind == 2:
                    i += 4
                if c == 38:
                    self.fg = value
                else:
                    self.bg = value
            i += 1

    def css(self) -> str:
        cls = []
        if self.fg is not None:
            cls.append(f"ansi-{_colour_name(self.fg)}")
        if self.bg is not None:
            cls.append(f"ansi-bg-{_colour_name(self.bg)}")
        for name in ("bold", "dim", "italic", "underline"):
            if getattr(self, name):
                cls.append(f"ansi-{name}")
        return " ".join(cls)


def _leading_int(param: str) -> int:
    """A parameter's number ("38:5" reads as 38; anything else as 0, as terminals do)."""
    head = param.split(":")[0]
    return int(head) if head.isdigit() else 0


def is_plain(text: str) -> bool:
    """Whether the line shows exactly as it is written."""
    return _PLAIN.fullmatch(text) is not None


def all_plain(texts: Sequence[str]) -> bool:
    """Whether every one of the lines shows exactly as it is written: one match over them
    joined by a newline (itself plain), not one per line (a websocket frame of a thousand
    lines spent a third of the web process's time in the per-line calls)."""
    joined = "\n".join(texts)
    if joined.isascii():  # most logs: a byte table deletes what is plain, in C
        return not joined.encode("ascii").translate(None, _PLAIN_ASCII)
    return _PLAIN.fullmatch(joined) is not None


def segments(text: str) -> list[Segment]:
    """The line as the viewer shows it: runs of text, each with its CSS classes."""
    if is_plain(text):
        return [(text, "")] if text else []
    parts = text.split("\r")
    shown = len(parts) - 1
    while shown > 0 and ESCAPES.sub("", parts[shown]) == "":
        shown -= 1
    style = _Style()
    out: list[Segment] = []

    def emit(s: str) -> None:
        if not s:
            return
        cls = style.css()
        if out and out[-1][1] == cls:
            out[-1] = (out[-1][0] + s, cls)
        else:
            out.append((s, cls))

    # Colours set in the overwritten parts still hold for the part shown.
    for p in range(shown + 1):
        part = parts[p]
        at = 0
        for m in ESCAPES.finditer(part):
            if p == shown:
                emit(part[at : m.start()])
            at = m.end()
            if m.group(2) == "m" and _SGR_PARAMS.fullmatch(m.group(1)):
                style.apply(m.group(1))
        if p == shown:
            emit(part[at:])
    return out


def shown_text(text: str) -> str:
    """The characters the viewer shows for this line."""
    return text if is_plain(text) else "".join(s for s, _ in segments(text))


def contains(needle: str, shown: str) -> bool:
    """Whether the shown text holds the needle, case folded."""
    folded = needle.casefold()
    return bool(folded) and folded in shown.casefold()


def find(needle: str, shown: str) -> list[tuple[int, int]]:
    """Where the needle is in the shown text, case folded: [start, end) in code points of the
    shown text, without overlaps. A character that folds to several ("ß" to "ss") is inside a
    hit if any part of its folding is."""
    folded_needle = needle.casefold()
    if not folded_needle:
        return []
    pieces: list[str] = []
    origin: list[int] = []  # origin[i]: the shown character folded character i came from
    for i, ch in enumerate(shown):
        f = ch.casefold()
        pieces.append(f)
        origin.extend([i] * len(f))
    folded = "".join(pieces)
    hits = []
    at = folded.find(folded_needle)
    while at >= 0:
        end = at + len(folded_needle)
        hits.append((origin[at], origin[end - 1] + 1))
        at = folded.find(folded_needle, end)
    return hits


@cache
def casefold_exceptions() -> dict[str, str]:
    """The characters whose case folding is not their lowercase ("ß" folds to "ss", a final
    sigma to a sigma): with these a page folds text as `str.casefold` does."""
    chars = map(chr, range(sys.maxunicode + 1))
    return {ch: ch.casefold() for ch in chars if ch.casefold() != ch.lower()}
