"""Reading text files users give (``--text-file``, manifests): UTF-8 or a named error.

A file in another encoding used to end in a traceback; here it is an ``InvalidRequest`` naming
the file, the byte offset and the bytes, and how to convert it. Checking streams through the
file in blocks, so a multi-GB text costs no memory.
"""

from __future__ import annotations

import codecs
from pathlib import Path

from mizuoto.errors import InvalidRequest
from mizuoto.regular_files import NotARegularFile, open_regular

_BLOCK = 1 << 20


def check_utf8(path: str | Path, field: str) -> None:
    """Raise :class:`InvalidRequest` for ``field`` unless the file is valid UTF-8 (and a
    regular file: ``/dev/zero`` or a ``/proc`` file would be read without end)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    try:
        with open_regular(path) as handle:
            while block := handle.read(_BLOCK):
                try:
                    decoder.decode(block)
                except UnicodeDecodeError as exc:
                    raise _not_utf8(path, field, offset + exc.start - len(decoder.getstate()[0]),
                                    exc) from None
                offset += len(block)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:  # the file ends inside a multi-byte character
        raise _not_utf8(path, field, offset - len(exc.object) + exc.start, exc) from None
    except NotARegularFile as exc:
        raise InvalidRequest(field, str(exc)) from None
    except OSError as exc:
        raise InvalidRequest(field, f"cannot read {path}: {exc.strerror or exc}") from None


def read_utf8(path: str | Path, field: str) -> str:
    """The whole file as text (a leading byte order mark, as Windows editors write, is not
    part of it); a file that is not UTF-8 raises :class:`InvalidRequest`."""
    check_utf8(path, field)
    return Path(path).read_text(encoding="utf-8-sig")


#: Byte order marks of the encodings a "Unicode" save writes (Excel's "Unicode Text" and
#: Notepad's "Unicode" are UTF-16 LE): longest first, as UTF-32 LE starts like UTF-16 LE.
_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32LE"), (codecs.BOM_UTF32_BE, "UTF-32BE"),
         (codecs.BOM_UTF16_LE, "UTF-16LE"), (codecs.BOM_UTF16_BE, "UTF-16BE"))


def _not_utf8(path, field: str, offset: int, exc: UnicodeDecodeError) -> InvalidRequest:
    with open(path, "rb") as handle:
        head = handle.read(4)
    for bom, encoding in _BOMS:
        if head.startswith(bom):  # the usual iconv hint (from latin1) would garble it
            return InvalidRequest(
                field, f"{path} is not UTF-8 text: it is {encoding} (its byte order mark "
                "says so)",
                f"convert it to UTF-8, e.g. iconv -f {encoding} -t utf-8 FILE > NEW")
    bad = exc.object[exc.start:exc.end].hex(" ")
    return InvalidRequest(
        field, f"{path} is not UTF-8 text: byte {max(offset, 0)} ({bad}) cannot be decoded "
        f"({exc.reason})", "convert it to UTF-8, e.g. iconv -f latin1 -t utf-8 FILE > NEW")
