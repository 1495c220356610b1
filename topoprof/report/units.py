"""Figures and lists in the words a sentence reads them in: a duration in the unit its size
reads in, so that a 7B model's step on CPU ranks reads "6.7 h", not 24,000,000 ms (tables keep
their own column's unit); a list joined with "and"."""
from __future__ import annotations


def duration(seconds: float, ms_digits: int = 1) -> str:
    """`seconds` in ms below a second (`ms_digits` decimals), else in s, min or h (one decimal)."""
    # each unit while its rounded figure stays below the next unit's (no "1000 ms", no "100.0 min")
    if abs(round(seconds * 1e3, ms_digits)) < 1000:
        return f"{seconds * 1e3:.{ms_digits}f} ms"
    if abs(round(seconds, 1)) < 100:
        return f"{seconds:.1f} s"
    if abs(round(seconds / 60, 1)) < 100:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:,.1f} h"


def listed(items: list[str]) -> str:
    """`items` as a sentence lists them: "a", "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
