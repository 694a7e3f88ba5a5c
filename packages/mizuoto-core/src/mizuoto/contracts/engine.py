"""The engine contract: load a model directory, declare capabilities, synthesize."""

from __future__ import annotations

import abc
import functools
import inspect
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.model_defaults import read_model_defaults, taken_defaults
from mizuoto.contracts.progress import ProgressCallback
from mizuoto.contracts.requests import EditRequest, Reference, SynthesisRequest
from mizuoto.contracts.results import AudioChunk, SynthesisResult
from mizuoto.contracts.voice import Voice
from mizuoto.errors import InvalidOption, UnsupportedCapability
from mizuoto.validation import parse_attrs

if TYPE_CHECKING:
    from mizuoto.options import Options


@attrs.frozen
class ModelInfo:
    """What a loaded model is, and how it runs."""

    engine: str
    model: str  # catalog id or directory
    variant: str  # e.g. "v1_base", "voxcpm2"
    sample_rate: int
    dtype: str
    device: str
    capabilities: frozenset[Capability]
    license: str | None = None
    non_commercial: bool = False
    fingerprint: str = ""  # identity of the weights, for voice files


class Engine(abc.ABC):
    """A text-to-speech engine bound to one loaded model.

    Subclasses set ``name`` and implement :meth:`load`, :attr:`info` and :meth:`synthesize`,
    plus :meth:`stream`, :meth:`edit` and :meth:`build_voice` for the capabilities they declare.
    ``params_class`` (an attrs class) validates ``request.params``; ``options_class`` validates
    the ``engines.<name>.*`` options.
    """

    name: ClassVar[str]
    params_class: ClassVar[type | None] = None
    options_class: ClassVar[type | None] = None
    #: The ``compute.*`` options this engine implements. Any other one set to a value other
    #: than its default is refused at load (:meth:`check_compute`): an option that silently
    #: does nothing is a defect. Add a name here only once ``load`` honours it (a subclass
    #: extends the base set: ``Engine.compute_options | {"oom_fallback"}``). The allocator and
    #: thread pinning act on the whole process, not on an engine: the base class checks them
    #: at every load (:func:`mizuoto.runtime.startup.check_startup_options`).
    compute_options: ClassVar[frozenset[str]] = frozenset(
        {"device", "dtype", "cpu_threads", "cpu_allocator", "cpu_pinning"})
    #: ``True`` for an engine that keeps every request's generation state (caches, generators,
    #: progress) in the request, not on the engine: a stream then holds the engine lock only
    #: while it computes its next chunk, not from its first chunk to its last, so other
    #: requests (another thread's, or the same thread's between two chunks) run in between.
    #: Leave it ``False`` while any per-request state lives on the engine or its modules.
    per_request_state: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs) -> None:
        """Serialize each engine's requests: the public calls a subclass defines run under the
        instance's lock, so two threads sharing one loaded engine never mix per-request state
        (model caches, noise generators). Different engines run in parallel."""
        super().__init_subclass__(**kwargs)
        load = cls.__dict__.get("load")
        if isinstance(load, classmethod) and not getattr(load.__func__, "_mizuoto_checked", 0):
            cls.load = classmethod(_checking_compute(load.__func__))
        for name in _SERIALIZED:
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, "_mizuoto_serialized", False):
                setattr(cls, name, _serialized(method))

    @classmethod
    def check_compute(cls, options: Options | None) -> None:
        """Raise :class:`InvalidOption` naming the option and the engine for a ``compute.*``
        option this engine does not implement, set to a non-default value.

        Every subclass's ``load`` runs it first (the base class wraps ``load``), so neither
        ``mizuoto.load`` nor a direct ``SomeEngine.load(...)`` can skip it.
        """
        if options is None:
            return
        compute_class = type(options.compute)  # ComputeOptions, without importing options
        defaults = compute_class()
        for field in attrs.fields(compute_class):
            if field.name in cls.compute_options:
                continue
            default = getattr(defaults, field.name)
            if getattr(options.compute, field.name) != default:
                implemented = ", ".join(f"compute.{n}" for n in sorted(cls.compute_options))
                raise InvalidOption(
                    f"compute.{field.name}",
                    f"the {cls.name} engine does not implement it; leave it at {default!r} "
                    f"(this engine implements {implemented})")

    @classmethod
    @abc.abstractmethod
    def load(cls, model_dir: Path, *, options: Options | None = None,
             model_id: str | None = None, progress: ProgressCallback | None = None) -> Engine:
        """Load the model in ``model_dir``; raise ModelFilesMissing / CheckpointMismatch."""

    @classmethod
    def recognizes(cls, model_dir: Path) -> bool:
        """True when ``model_dir`` looks like one of this engine's models (for auto-detection)."""
        return False

    @property
    @abc.abstractmethod
    def info(self) -> ModelInfo: ...

    @property
    def capabilities(self) -> frozenset[Capability]:
        return self.info.capabilities

    def supports(self, capability: Capability) -> bool:
        return capability in self.capabilities

    def require(self, capability: Capability) -> None:
        if capability not in self.capabilities:
            raise UnsupportedCapability(
                f"{self.name} model {self.info.model} does not support {capability.value}"
            )

    @abc.abstractmethod
    def synthesize(self, request: SynthesisRequest, *,
                   progress: ProgressCallback | None = None) -> SynthesisResult: ...

    # The defaults below are what an engine without the capability gets: UnsupportedCapability,
    # whether or not the model declares it (declaring a capability without implementing its
    # method is a plugin bug, named as such).

    def stream(self, request: SynthesisRequest, *,
               progress: ProgressCallback | None = None) -> Iterator[AudioChunk]:
        self._not_implemented(Capability.STREAM, "stream")

    def edit(self, request: EditRequest, *,
             progress: ProgressCallback | None = None) -> SynthesisResult:
        self._not_implemented(Capability.EDIT, "edit")

    def build_voice(self, reference: Reference) -> Voice:
        self._not_implemented(Capability.VOICE_CACHE, "build_voice")

    def _not_implemented(self, capability: Capability, method: str):
        self.require(capability)
        raise UnsupportedCapability(
            f"{self.name} model {self.info.model} declares {capability.value} but the engine "
            f"does not implement {method}(); this is a bug in the {self.name} plugin")

    @property
    def model_defaults(self) -> Mapping[str, Any]:
        """The request params the model directory sets (its ``mizuoto-defaults.json``, read
        at load: :mod:`mizuoto.contracts.model_defaults`); a request's own params win."""
        return self.__dict__.get("_mizuoto_model_defaults") or {}

    def parse_params(self, params) -> Any:
        """Validate ``request.params``, over the model's defaults, into ``params_class``;
        unknown keys are named."""
        return parse_attrs(self.params_class, {**self.model_defaults, **dict(params or {})},
                           "params")


_SERIALIZED = ("synthesize", "stream", "edit", "build_voice")
_LOCKS_GUARD = threading.Lock()


class RequestLock:
    """Re-entrant for the thread that holds it (an engine's ``edit`` may call its own
    ``synthesize``), and releasable from another thread: a server may resume a stream's
    generator on any worker thread, which ``threading.RLock`` forbids."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._depth = 0

    def __enter__(self) -> RequestLock:
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return self
        self._lock.acquire()
        self._owner, self._depth = me, 1
        return self

    def __exit__(self, *exc_info) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._lock.release()


def engine_lock(engine: Engine) -> RequestLock:
    """The lock that serializes ``engine``'s requests (created on first use)."""
    lock = engine.__dict__.get("_mizuoto_lock")
    if lock is None:
        with _LOCKS_GUARD:
            lock = engine.__dict__.setdefault("_mizuoto_lock", RequestLock())
    return lock


def _checking_compute(load):
    @functools.wraps(load)
    def checked(cls, model_dir, *args, options=None, **kwargs):
        cls.check_compute(options)
        if options is not None:
            from mizuoto.runtime.startup import check_startup_options

            check_startup_options(options.compute)
        defaults = read_model_defaults(model_dir, cls.params_class)  # a bad file fails first
        engine = load(cls, model_dir, *args, options=options, **kwargs)
        if defaults:
            engine.__dict__["_mizuoto_model_defaults"] = defaults
        return engine

    checked._mizuoto_checked = True
    return checked


def _serialized(method):
    """The public call under the engine's lock; the request's notices (what validation
    changed, e.g. control characters dropped) join the result's ``applied.warnings``."""
    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def stream(self, *args, **kwargs):
            if self.per_request_state:
                yield from _locked_iteration(self, method(self, *args, **kwargs), args)
                return
            # held from the first chunk to the last (or until the consumer closes the stream)
            with engine_lock(self):
                for chunk in method(self, *args, **kwargs):
                    yield _recorded(self, args, chunk)

        wrapper = stream
    else:
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            with engine_lock(self):
                result = method(self, *args, **kwargs)
            if inspect.isgenerator(result):  # a stream built by a helper generator
                return _locked_iteration(self, result, args)
            return _recorded(self, args, result)

        wrapper = call
    wrapper._mizuoto_serialized = True
    return wrapper


def _locked_iteration(engine: Engine, chunks, args):
    if not engine.per_request_state:
        with engine_lock(engine):
            for chunk in chunks:
                yield _recorded(engine, args, chunk)
        return
    yield from _stepwise(engine, chunks, args)


def _stepwise(engine: Engine, chunks, args):
    """Each chunk computed under the engine's lock, handed on without it: between two chunks
    of this stream the engine serves other requests (their state is their own)."""
    lock = engine_lock(engine)
    try:
        while True:
            with lock:
                try:
                    chunk = next(chunks)
                except StopIteration:
                    return
            yield _recorded(engine, args, chunk)
    finally:
        with lock:  # a stream closed early frees its state (cache slot) under the lock too
            chunks.close()


def _recorded(engine: Engine, args, value):
    """``value`` with what the request got besides its own settings in its applied record:
    the request's notices (what validation changed, e.g. control characters dropped) in
    ``warnings``, and the model directory's defaults it took in ``model_defaults``."""
    applied = getattr(value, "applied", None)
    if applied is None or not isinstance(value, (SynthesisResult, AudioChunk)):
        return value
    request = args[0] if args else None
    notices = getattr(request, "notices", ())
    missing = tuple(n for n in notices if n not in applied.warnings)
    taken = taken_defaults(engine.model_defaults, getattr(request, "params", None))
    if not missing and (not taken or applied.model_defaults):
        return value
    return attrs.evolve(value, applied=attrs.evolve(
        applied, warnings=applied.warnings + missing,
        model_defaults=applied.model_defaults or taken))
