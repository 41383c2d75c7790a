"""How a value is shown inside a message: abridged, so no message carries a whole (maybe huge) value (stdlib only)."""

from __future__ import annotations

import time

SHOWN_CHARS = 60  # a value in a message is cut to this many characters


def brief(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text``, cut to ``limit`` characters with an ellipsis where it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
