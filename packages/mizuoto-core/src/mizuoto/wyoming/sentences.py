"""Text streamed in chunks (``synthesize-chunk``), cut into sentences as each one completes,
so that speech starts before the client has sent the last chunk.

Each chunk is scanned once (from where the last sentence end could still begin), and the text
waiting for a sentence end is bounded: a client streaming megabytes without a stop is refused
by name instead of growing the server and re-scanning its buffer at every chunk."""

from __future__ import annotations

import re

from mizuoto.serve.errors import bad_request

# a sentence ends at . ! ? (or their CJK forms) followed by white space; CJK ones end it at
# once, since those scripts put no space after them. The look-behind starts a match only at
# the first stop of a run, and the possessive runs never backtrack: linear in the text,
# where "......" x 100,000 would otherwise be tried from each of its dots
_STOPS = ".!?…"
_CLOSERS = "\"')]"
_END = re.compile(r"(?<![.!?…])[.!?…]++[\"')\]]*+\s+|[。！？]+")


class SentenceSplitter:
    """Feed chunks with :meth:`add`; it returns the sentences they completed. :meth:`finish`
    returns what is left (the last sentence, which need not end with a stop)."""

    def __init__(self) -> None:
        self._pending = ""

    def add(self, chunk: str, max_pending: int | None = None) -> list[str]:
        """The sentences ``chunk`` completed; more than ``max_pending`` characters left
        waiting for a sentence end is a 400 naming ``synthesize-chunk``."""
        # a sentence end found in the new text may begin in the old one's trailing stops
        scan_from = len(self._pending.rstrip(_STOPS + _CLOSERS))
        self._pending += chunk
        sentences = []
        start = 0
        for match in _END.finditer(self._pending, scan_from):
            sentence = self._pending[start:match.end()].strip()
            if sentence:
                sentences.append(sentence)
            start = match.end()
        self._pending = self._pending[start:]
        if max_pending is not None and len(self._pending) > max_pending:
            waiting, self._pending = len(self._pending), ""
            raise bad_request(f"synthesize-chunk: {waiting:,} characters of streamed text "
                              f"wait for a sentence end, more than {max_pending:,}: end "
                              "sentences with . ! ? or send the text in parts",
                              param="text", code="string_above_max_length")
        return sentences

    def finish(self) -> str:
        rest, self._pending = self._pending.strip(), ""
        return rest
