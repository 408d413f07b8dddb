"""Text for one-line error messages: a value shown bounded and escaped, a message kept to one
printable line."""

from __future__ import annotations


def short(value: object, limit: int = 200) -> str:
    """``repr``-like text of ``value`` for an error message: bounded length, control characters escaped.

    Never recurses into deep containers (a value nested 1,000 deep would overflow ``repr``).
    """
    if isinstance(value, (dict, list, tuple)):
        text = f"<{type(value).__name__} of {len(value)}>"
    elif isinstance(value, str):
        text = repr(value[: limit + 1])  # repr escapes control characters
    elif isinstance(value, (int, float, bool)) or value is None:
        text = repr(value) if not isinstance(value, int) or value.bit_length() < 700 else "<huge int>"
    else:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clean_message(text: str, limit: int = 300) -> str:
    """One printable line of at most ``limit`` characters: control characters escaped, the middle cut."""
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    if len(text) > limit:
        text = text[: limit - 40] + " … " + text[-37:]
    return text
