"""The model catalog and model resolution: a model is a local directory or a catalog id.

A catalog id (``f5tts/v1-base``) maps each file of the model directory to a file in a Hugging
Face repository. With ``huggingface_hub`` installed and a network, missing files are downloaded
into its cache and linked into ``$MIZUOTO_HOME/models/<id>``; offline, the error lists what is
missing and how to pass a local directory instead.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import attrs

from mizuoto.contracts.progress import ProgressCallback, report
from mizuoto.errors import ModelFilesMissing, ModelNotFound

log = logging.getLogger(__name__)


@attrs.frozen
class HubFile:
    """A file in a Hugging Face repository. ``alternatives`` are other names the same file may
    have there (e.g. ``pytorch_model.bin`` for ``model.safetensors``); the first one found is
    used, and linked into the model directory under its own base name."""

    repo: str
    filename: str
    revision: str | None = None
    alternatives: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    def candidates(self, name: str) -> list[tuple[str, str]]:
        """``(local name, filename in the repo)`` pairs, in order of preference."""
        folder = Path(name).parent
        pairs = [(name, self.filename)]
        for alternative in self.alternatives:
            pairs.append((str(folder / Path(alternative).name), alternative))
        return pairs


@attrs.frozen
class CatalogEntry:
    """A named model: where each of its files comes from, and under which license."""

    id: str  # "<engine>/<name>"
    engine: str
    files: Mapping[str, HubFile] = attrs.field(converter=lambda v: MappingProxyType(dict(v)))
    license: str
    non_commercial: bool = False
    description: str = ""
    variant: str = ""
    # Files the engine can do without (e.g. a vocab it ships itself).
    optional: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)


@attrs.frozen
class ResolvedModel:
    path: Path
    entry: CatalogEntry | None = None

    @property
    def id(self) -> str:
        return self.entry.id if self.entry else str(self.path)


def mizuoto_home() -> Path:
    return Path(os.environ.get("MIZUOTO_HOME", Path.home() / ".cache" / "mizuoto"))


def model_cache_dir(entry: CatalogEntry) -> Path:
    return mizuoto_home() / "models" / entry.id.replace("/", "--")


def downloaded_files(entry: CatalogEntry) -> dict[str, tuple[str, Path] | None]:
    """Each file of ``entry``: ``(local name, path)`` once downloaded, else ``None``."""
    directory = model_cache_dir(entry)
    found: dict[str, tuple[str, Path] | None] = {}
    for name, hub_file in entry.files.items():
        found[name] = None
        for local_name, filename in hub_file.candidates(name):
            local = directory / local_name
            cached = local if local.exists() else _hub_cached(hub_file, filename)
            if cached is not None:
                found[name] = (local_name, cached)
                break
    return found


def _hub_cache_dir() -> Path:
    """huggingface_hub's cache folder, found as it finds it (``HF_HUB_CACHE``, ``HF_HOME``)."""
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # already imported: it read the environment once, at import
        return Path(constants.HF_HUB_CACHE)
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return Path(cache).expanduser()
    home = os.environ.get("HF_HOME") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def hub_endpoint() -> str:
    """The hub's address as huggingface_hub uses it: ``HF_ENDPOINT`` (a mirror) or
    ``https://huggingface.co``."""
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # already imported: it read the environment once, at import
        return str(constants.ENDPOINT).rstrip("/")
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def hub_url(hub_file: HubFile, filename: str | None = None) -> str:
    """The address a browser, ``curl`` or ``wget`` downloads ``hub_file`` from."""
    return (f"{hub_endpoint()}/{hub_file.repo}/resolve/{hub_file.revision or 'main'}/"
            f"{filename or hub_file.filename}")


def _hub_cached(hub_file: HubFile, filename: str) -> Path | None:
    # A repository never downloaded has no folder in the hub cache: say so without importing
    # huggingface_hub (a tenth of a second, on every `mizuoto models`).
    if not (_hub_cache_dir() / f"models--{hub_file.repo.replace('/', '--')}").is_dir():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    cached = try_to_load_from_cache(hub_file.repo, filename, revision=hub_file.revision)
    return Path(cached) if isinstance(cached, str) else None


def _hub_reachable(timeout: float = 5.0) -> bool:
    """One quick request to the hub (``HF_ENDPOINT`` where set) through huggingface_hub's own
    HTTP session, so that offline runs fail in seconds, not after its retries. The session
    takes the proxies the environment names (``HTTPS_PROXY``, ``NO_PROXY``) as the download
    would: any answer, even an error status, means the hub can be tried."""
    try:
        from huggingface_hub import constants
        from huggingface_hub.utils import get_session
    except ImportError:
        return False
    try:
        get_session().head(constants.ENDPOINT, timeout=timeout)  # neither follows redirects
    except Exception as exc:  # requests' and httpx's errors: no answer
        log.debug("the hub at %s did not answer: %s", constants.ENDPOINT, exc)
        return False
    return True


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False") or \
        os.environ.get("MIZUOTO_OFFLINE", "0") not in ("0", "", "false", "False")


def _nearest(model: str, path: Path, catalog: Mapping[str, CatalogEntry]) -> str | None:
    """The catalog id or the directory beside ``path`` closest to a mistyped ``model``."""
    import difflib

    names = {model_id: model_id for model_id in catalog}
    parent = path.parent
    try:
        if parent.is_dir():
            prefix = model[:len(model) - len(path.name)]  # the parent as the user wrote it
            names.update({item.name: prefix + item.name for item in parent.iterdir()
                          if item.is_dir() and not item.name.startswith(".")})
    except OSError:
        pass  # an unreadable parent: no suggestion from it
    found = difflib.get_close_matches(path.name, [n for n in names if n not in catalog], 1, 0.6)
    found += difflib.get_close_matches(model, list(catalog), 1, 0.6)
    return names[found[0]] if found else None


def resolve_in(model: str | Path, catalog: Mapping[str, CatalogEntry], *,
               download: bool = True, progress: ProgressCallback | None = None
               ) -> ResolvedModel:
    """Turn a directory or an id of ``catalog`` into a local directory, downloading when
    possible. :func:`mizuoto.resolve_model` is the same with the installed plugins' catalog."""
    path = Path(model).expanduser()
    if path.is_dir():
        return ResolvedModel(path.resolve())
    entry = catalog.get(str(model))
    if entry is None:
        known = ", ".join(sorted(catalog)) or "none (no engine installed)"
        near = _nearest(str(model), path, catalog)
        hint = f" (did you mean {near}?)" if near else ""
        raise ModelNotFound(f"{model!r} is neither a directory nor a catalog id: no such "
                            f"directory{hint}; known ids: {known}")
    directory = model_cache_dir(entry)
    files = downloaded_files(entry)
    missing = [name for name, local in files.items()
               if local is None and name not in entry.optional]
    why = "downloading is off"
    if missing and download:
        why = _cannot_download()
        if why is None:
            files.update(_download(entry, missing, progress))
            why = "the download failed (run with --debug to see why)"
        missing = [name for name, local in files.items()
                   if local is None and name not in entry.optional]
    if missing:
        raise ModelFilesMissing(
            entry.id, [f"{name} (repository {entry.files[name].repo}, file "
                       f"{entry.files[name].filename})" for name in missing],
            hint=(f"{why[0].upper()}{why[1:]}. `mizuoto models {entry.id}` names each file's "
                  f"URL and where it goes ({directory}); or put the files in a directory and "
                  f"pass it instead of the id, e.g. --model /path/to/"
                  f"{entry.id.replace('/', '-')}"),
        )
    for found in files.values():
        if found is None:
            continue
        local_name, local = found
        link = directory / local_name
        if not link.exists():
            if link.is_symlink():  # dangling: its hub-cache blob was deleted
                link.unlink()
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(Path(local).resolve())
    # an entry with no files (a rule-based engine) still resolves to a directory that exists
    directory.mkdir(parents=True, exist_ok=True)
    return ResolvedModel(directory, entry)


def _cannot_download() -> str | None:
    """Why nothing can be downloaded here, or None when the hub can be tried."""
    if _offline():
        return "downloads are off (HF_HUB_OFFLINE or MIZUOTO_OFFLINE is set)"
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        return "the huggingface_hub package is not installed (pip install 'mizuoto-core[hub]')"
    if not _hub_reachable():
        return (f"no model hub is reachable from here ({hub_endpoint()} did not answer "
                "within seconds; set HTTPS_PROXY for a proxy or HF_ENDPOINT for a mirror)")
    return None


def _download(entry: CatalogEntry, names: list[str], progress
              ) -> dict[str, tuple[str, Path] | None]:
    from huggingface_hub import hf_hub_download

    # Shown once: after the download the files are cached and this path is not taken again.
    log.warning("Downloading %s (%d files). License: %s%s", entry.id, len(names), entry.license,
                " — non-commercial use only" if entry.non_commercial else "")
    fetched: dict[str, tuple[str, Path] | None] = {}
    for index, name in enumerate(names):
        hub_file = entry.files[name]
        report(progress, "download", index, len(names), name)
        fetched[name] = None
        for local_name, filename in hub_file.candidates(name):
            try:
                path = hf_hub_download(hub_file.repo, filename, revision=hub_file.revision)
            except Exception as exc:  # not found, or the network went away: try the next name
                log.debug("download of %s/%s failed: %s", hub_file.repo, filename, exc)
                continue
            fetched[name] = (local_name, Path(path))
            break
    report(progress, "download", len(names), len(names))
    return fetched
