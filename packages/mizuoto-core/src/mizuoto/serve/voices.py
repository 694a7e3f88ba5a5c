"""Named voices: ``<name>.safetensors`` files (``Voice.save``) in one directory,
``$MIZUOTO_HOME/voices`` by default.

A name is 1 to 64 letters, digits, ``_`` or ``-``, starting with a letter or digit: it can
never hold a path separator or ``..``, so no client-chosen name reaches outside the directory.
``default`` is reserved: every model's own voice (F5-TTS: its bundled reference; VoxCPM:
zero-shot). A voice belongs to the model it was built with (its fingerprint); using it with
another model is refused by the engine.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from mizuoto.errors import InvalidRequest
from mizuoto.output_paths import is_device_name
from mizuoto.serve.errors import APIError, bad_request, not_found, quoted

DEFAULT_VOICE = "default"
#: Most voices stored, and their bytes together, unless the server is told otherwise: an
#: F5-TTS voice holds its clip (60 s at 24 kHz: 5.8 MB), so 100 of them fit in 512 MB.
DEFAULT_MAX_VOICES = 100
DEFAULT_MAX_VOICES_BYTES = 512 << 20
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_SUFFIX = ".safetensors"


def check_name(name: str, param: str = "name") -> str:
    """``name`` if it is a valid voice name, else a 400 naming ``param``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise bad_request(f"voice name {quoted(name)} is not valid: use 1 to 64 letters, "
                          "digits, '_' or '-', starting with a letter or digit", param=param)
    if is_device_name(name):
        raise bad_request(f"voice name {name!r} is a device name on Windows: pick another",
                          param=param)
    return name


def _store_full(message: str, code: str) -> APIError:
    # 409 (the store's state), never retried: the SDK would retry a 409 unless told not to
    return APIError(409, message, param="name", code=code, headers={"x-should-retry": "false"})


class VoiceStore:
    """The voice directory; at most ``max_count`` voices of ``max_bytes`` together (more: a
    409 naming the cap, before the clip is decoded or the voice built where it can be)."""

    def __init__(self, directory: Path, *, max_count: int = DEFAULT_MAX_VOICES,
                 max_bytes: int = DEFAULT_MAX_VOICES_BYTES) -> None:
        self.directory = Path(directory)
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._saving = threading.Lock()  # two uploads at once must not both take the last room

    def _usage(self) -> tuple[int, int]:
        """The voices stored and their bytes."""
        if not self.directory.is_dir():
            return 0, 0
        sizes = [path.stat().st_size for path in self.directory.glob(f"*{_SUFFIX}")
                 if path.is_file()]
        return len(sizes), sum(sizes)

    def check_room(self, adding: int = 0) -> None:
        """A 409 unless one more voice of ``adding`` bytes fits under both caps."""
        count, size = self._usage()
        if count >= self.max_count:
            raise _store_full(f"{count} voices are stored, the most this server keeps "
                              f"({self.max_count}): delete one (DELETE /v1/audio/voices/NAME) "
                              "or start the server with a higher --max-voices",
                              "too_many_voices")
        if size + adding > self.max_bytes:
            raise _store_full(f"the stored voices take {size} bytes; with this one "
                              f"({adding} bytes) they would pass the server's "
                              f"{self.max_bytes}: delete some or start the server with a "
                              "higher --max-voices-size", "voices_too_large")

    def path(self, name: str, param: str = "voice") -> Path:
        path = self.directory / f"{check_name(name, param)}{_SUFFIX}"
        # the name's pattern already rules it out; this says so where it matters
        if path.resolve().parent != self.directory.resolve():
            raise bad_request(f"voice name {name!r} is not valid", param=param)
        return path

    def load(self, name: str):
        """The saved voice ``name`` (a :class:`~mizuoto.Voice`); 404 when there is none."""
        from mizuoto.contracts.voice import Voice

        path = self.path(name)
        if not path.is_file():
            raise not_found(f"no voice named {quoted(name)}: every model has {DEFAULT_VOICE!r}, "
                            "and GET /v1/audio/voices lists the saved ones", "voice",
                            "voice_not_found")
        try:
            return Voice.load(path)
        except InvalidRequest as exc:  # named by the voice: the server's paths stay its own
            raise bad_request(f"voice {name!r} cannot be used: "
                              f"{exc.problem.replace(str(path), 'its file')}; build it again",
                              param="voice", code="voice_damaged") from None

    async def saved(self, name: str):
        """The voice a request names: None for ``default``, else the saved voice (the
        engine's plan checks it against the model)."""
        import asyncio

        if name == DEFAULT_VOICE:
            return None
        return await asyncio.to_thread(self.load, name)

    def save(self, name: str, voice) -> None:
        path = self.path(name, "name")
        with self._saving:
            # names that differ only in case are one file on macOS and Windows
            taken = next((other for other in (DEFAULT_VOICE, *self._names())
                          if other.casefold() == name.casefold()), None)
            if taken is not None:
                same = "" if taken == name else f" ({taken!r}: names differ in case only)"
                raise APIError(409, f"a voice named {name!r} exists{same}: delete it first or "
                               "pick another name", param="name", code="voice_exists")
            self.check_room(_voice_bytes(voice))
            self.directory.mkdir(parents=True, exist_ok=True)
            voice.save(path)

    def _names(self) -> list[str]:
        if not self.directory.is_dir():
            return []
        return [path.name[:-len(_SUFFIX)] for path in self.directory.glob(f"*{_SUFFIX}")]

    def delete(self, name: str) -> None:
        path = self.path(name, "name")
        if name == DEFAULT_VOICE:
            raise bad_request("the default voice cannot be deleted", param="name")
        if not path.is_file():
            raise not_found(f"no voice named {quoted(name)}", "name", "voice_not_found")
        path.unlink()

    def list(self) -> list[dict[str, str]]:
        """Each saved voice: ``name``, ``engine`` and ``fingerprint`` (from its header)."""
        from safetensors import safe_open

        found = []
        if not self.directory.is_dir():
            return found
        for path in sorted(self.directory.glob(f"*{_SUFFIX}")):
            name = path.name[:-len(_SUFFIX)]
            if not _NAME.fullmatch(name):
                continue
            try:
                with safe_open(str(path), framework="pt") as handle:
                    header = handle.metadata() or {}
            except Exception:  # a damaged file is skipped, not fatal
                continue
            found.append({"name": name, "engine": header.get("engine", ""),
                          "fingerprint": header.get("model_fingerprint", "")})
        return found


def _voice_bytes(voice) -> int:
    """About the size of ``voice``'s file: its tensors and texts (the header's framing is a
    few hundred bytes more)."""
    tensors = sum(t.numel() * t.element_size() for t in voice.tensors.values())
    texts = sum(len(str(v).encode("utf-8", "replace")) for v in (*voice.texts.values(),
                                                                 *voice.meta.values()))
    return tensors + texts
