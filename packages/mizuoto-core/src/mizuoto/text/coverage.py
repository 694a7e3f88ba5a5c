"""What an engine says when its model cannot speak some characters of a text.

An engine whose tokenizer maps characters it does not know to a filler (F5-TTS's id 0, a BPE's
``<unk>``) keeps its upstream's arithmetic, and reports what it dropped in
``applied.warnings`` with :func:`dropped_characters_warning`: the caller (the CLI prints result
warnings, the contract suite checks them) learns that part of the text was not spoken.
"""

from __future__ import annotations

from collections.abc import Iterable

#: the most distinct characters a warning lists
SHOWN = 12


def dropped_characters_warning(dropped: Iterable[str], text: str, read_as: str) -> str | None:
    """A warning naming the characters (or tokens) of ``text`` the model cannot speak and their
    share of its non-space characters; ``read_as`` says what the engine reads them as
    (``"spaces (id 0, as upstream does)"``). ``None`` when nothing was dropped."""
    dropped = [piece for piece in dropped if piece.strip()]
    if not dropped:
        return None
    spoken = sum(1 for char in text if not char.isspace()) or 1
    distinct = list(dict.fromkeys(dropped))
    shown = " ".join(distinct[:SHOWN]) + (f" and {len(distinct) - SHOWN} more"
                                          if len(distinct) > SHOWN else "")
    share = min(len(dropped) / spoken, 1.0)
    count = (f"{len(dropped)} characters of the text are" if len(dropped) > 1
             else "1 character of the text is")
    return (f"{count} not in the model's vocabulary and read as {read_as}, not spoken "
            f"({share:.0%} of the text): {shown}")
