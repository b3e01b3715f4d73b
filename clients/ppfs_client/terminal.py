"""What the client prints for people: text relayed by the gateway, made inert."""

from __future__ import annotations

import unicodedata

_HIDDEN = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))


def printable(text: str, keep: str = "\n\t") -> str:
    """``text`` with every control, formatting (bidi, zero-width) or separator character
    but those in ``keep`` (newline and tab) written as an escape: what the gateway relays
    (names, consents, job states, error details) cannot move the cursor, recolour or
    reorder what a terminal shows."""
    return "".join(
        ch if ch in keep or unicodedata.category(ch) not in _HIDDEN
        else ch.encode("unicode_escape").decode("ascii")
        for ch in text
    )


def inline(text: object) -> str:
    """One relayed field within a line the client writes: newline and tab escaped too, so
    that a party's error or phase cannot start a line that reads as the client's own."""
    return printable(str(text), keep="")
