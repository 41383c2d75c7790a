"""How a value is shown: abridged inside a message, so no message carries a whole (maybe huge) value, and as printable
text wherever it came from (stdlib only)."""

from __future__ import annotations

import re
import time

SHOWN_CHARS = 60  # a value in a message is cut to this many characters

# Not characters at all: a lone surrogate (JSON's "\ud800" decodes to one, and no UTF-8 encoder takes it) and the
# two non-characters XML 1.0 refuses.
_NOT_CHARACTERS = re.compile("[\ud800-\udfff\ufffe\uffff]")
# Control characters but tab (C0, DEL, C1): XML 1.0 refuses most of them even escaped, ESC drives a terminal, and a
# newline would start a forged line in a log or a table.
_CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def brief(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text``, cut to ``limit`` characters with an ellipsis where it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def printable(text: str) -> str:
    """``text`` as one line of printable text any encoder and XML take: what is not a character becomes U+FFFD, a
    control character but tab its escape as Python writes it (``\\x00``, ``\\n``), so that it is seen, not obeyed."""
    text = _NOT_CHARACTERS.sub("\ufffd", text)
    return _CONTROLS.sub(lambda control: repr(control.group())[1:-1], text)


def abridged(value: object, limit: int = SHOWN_CHARS) -> str:
    """repr(value), cut to ``limit`` characters."""
    return brief(repr(value), limit)


def show(value: object) -> str:
    """What a value is and, abridged, what it holds: ``a string '15 minutes'``, ``a list [1]``."""
    kinds = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}
    kind = kinds.get(type(value), type(value).__name__)
    return f"{kind} {abridged(value)}"


def utc_text(seconds: float | None, pattern: str = "%Y-%m-%d %H:%M:%S UTC") -> str:
    """A Unix time as UTC text; "unknown" for None or a time no calendar holds (a damaged record)."""
    if seconds is None:
        return "unknown"
    try:
        return time.strftime(pattern, time.gmtime(seconds))
    except (OverflowError, ValueError, OSError):
        return "unknown"


def took_text(started: float | None, finished: float | None, unit: str = "s") -> str:
    """How long a run took, or "?" where either end is unknown."""
    if started is None or finished is None:
        return "?"
    return f"{finished - started:.1f}{unit}"
