"""Text streamed in chunks (``synthesize-chunk``), cut into sentences as each one completes,
so that speech starts before the client has sent the last chunk."""

from __future__ import annotations

import re

# a sentence ends at . ! ? (or their CJK forms) followed by white space; CJK ones end it at
# once, since those scripts put no space after them
_END = re.compile(r"[.!?…]+[\"')\]]*\s+|[。！？]+")


class SentenceSplitter:
    """Feed chunks with :meth:`add`; it returns the sentences they completed. :meth:`finish`
    returns what is left (the last sentence, which need not end with a stop)."""

    def __init__(self) -> None:
        self._pending = ""

    def add(self, chunk: str) -> list[str]:
        self._pending += chunk
        sentences = []
        start = 0
        for match in _END.finditer(self._pending):
            sentence = self._pending[start:match.end()].strip()
            if sentence:
                sentences.append(sentence)
            start = match.end()
        self._pending = self._pending[start:]
        return sentences

    def finish(self) -> str:
        rest, self._pending = self._pending.strip(), ""
        return rest
