"""What the client prints for people: text relayed by the gateway, made inert."""

from __future__ import annotations

import unicodedata

_HIDDEN = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))


def printable(text: str) -> str:
    """``text`` with every control, formatting (bidi, zero-width) or separator character
    but newline and tab written as an escape: what the gateway relays (names, consents,
    job states, error details) cannot move the cursor, recolour or reorder what a
    terminal shows."""
    return "".join(
        ch if ch in "\n\t" or unicodedata.category(ch) not in _HIDDEN
        else ch.encode("unicode_escape").decode("ascii")
        for ch in text
    )
