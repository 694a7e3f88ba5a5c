# Long on purpose: one concept, the engine contract (its base class and its public calls)
"""The engine contract: load a model directory, declare capabilities, synthesize.

The base class does the work every engine shares (simonw/llm's ``Model.prompt()`` is concrete
and a plugin writes ``execute()``): the public :meth:`Engine.synthesize`, :meth:`Engine.stream`,
:meth:`Engine.edit` and :meth:`Engine.build_voice` check the capability, validate the params,
resolve the seed and make the generator, run the call under the engine's scheduling object
(:mod:`mizuoto.contracts.scheduling`: one request at a time, turns per chunk, or the core's
scheduler, as the engine declares: :attr:`Engine.takes_turns_per`), call the engine's own
``_synthesize`` / ``_stream`` / ``_edit`` / ``_build_voice``, and build the
:class:`~mizuoto.contracts.results.Applied` record from what that returns
(:class:`~mizuoto.contracts.results.Rendered`) and what the base knows. Results and chunks
refuse non-finite audio on construction.
"""

from __future__ import annotations

import abc
import functools
import inspect
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from mizuoto.contracts.api import API_VERSION, PluginAPIDeprecation, deprecated
from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.engine_support import join_stream, one_chunk
from mizuoto.contracts.features import stepping_engine
from mizuoto.contracts.model_defaults import read_model_defaults, taken_defaults
from mizuoto.contracts.model_info import ModelInfo
from mizuoto.contracts.plan import RequestPlan
from mizuoto.contracts.progress import ProgressCallback
from mizuoto.contracts.request_lock import Stream
from mizuoto.contracts.requests import EditRequest, Reference, SynthesisRequest
from mizuoto.contracts.results import Applied, AudioChunk, Rendered, SynthesisResult
from mizuoto.contracts.scheduling import (
    RequestScheduling,
    check_scheduling_declared,
    scheduling_for,
)
from mizuoto.contracts.turns import ChunkTurns
from mizuoto.contracts.voice import Voice
from mizuoto.errors import InvalidOption, InvalidRequest, UnsupportedCapability
from mizuoto.options import Options
from mizuoto.runtime.in_effect import compute_in_effect
from mizuoto.runtime.seeds import resolve_seed
from mizuoto.runtime.startup import check_startup_options
from mizuoto.validation import check_known_keys, parse_attrs

if TYPE_CHECKING:  # it imports torch, which ``import mizuoto`` does not
    from mizuoto.contracts.placement import Placement

#: ``compute.*`` values every engine honours by doing nothing, so that one settings file can
#: serve all engines: ``prepack=off`` is what an engine that packs no weights already runs. An
#: engine that does not implement the option accepts them and reports them in
#: ``applied.compute`` (``prepack: {"mode": "off"}``, as an engine that packs reports off).
NO_OP_COMPUTE: Mapping[str, Any] = {"prepack": "off"}
_NO_OP_REPORTED: Mapping[str, Any] = {"prepack": {"mode": "off"}}


class Engine(abc.ABC):
    """A text-to-speech engine bound to one loaded model.

    A subclass sets ``name`` and implements :meth:`load`, :attr:`info` and ``_synthesize``,
    plus ``_stream``, ``_edit`` and ``_build_voice`` for the capabilities it declares; the
    public methods of the same names (without the underscore) are the base class's.
    ``params_class`` (an attrs class) validates ``request.params``; ``options_class`` validates
    the ``engines.<name>.*`` options. ``load`` sets :attr:`placement` (what
    :func:`mizuoto.contracts.placement.place` applied: device, dtype, warnings, compilation).
    """

    name: ClassVar[str]
    params_class: ClassVar[type | None] = None
    options_class: ClassVar[type | None] = None
    #: The ``compute.*`` options this engine implements. Any other one set to a value other
    #: than its default is refused at load (:meth:`check_compute`): an option that silently
    #: does nothing is a defect. Add a name here only once ``load`` honours it (a subclass
    #: extends the base set: ``Engine.compute_options | {"oom_fallback"}``). The allocator,
    #: thread pinning and wait policy act on the whole process, not on an engine: the base class checks them
    #: at every load (:func:`mizuoto.runtime.startup.check_startup_options`).
    compute_options: ClassVar[frozenset[str]] = frozenset(
        {"device", "dtype", "cpu_threads", "cpu_allocator", "cpu_pinning", "cpu_wait_policy"})
    #: How the engine's requests share it (the base class schedules them, the engine writes no
    #: lock: :mod:`mizuoto.contracts.scheduling`). ``"request"`` (the default): a request's
    #: state is in the instance (a KV cache), so one request runs at a time, first chunk to
    #: last; a second from the thread of an unfinished stream is a
    #: :class:`~mizuoto.errors.RequestConflict`. ``"chunk"``: a request's state is in its own
    #: call, so requests alternate chunks of ``_stream`` (``synthesize`` joins them). An
    #: engine with the step interface is the core scheduler's instead.
    takes_turns_per: ClassVar[str] = "request"
    #: Plugin API 1.1's opt-out of the base class's scheduling, still honoured: ``True`` calls
    #: the engine from any number of threads at once; whatever it shares is its own to guard.
    concurrent_requests: ClassVar[bool] = False
    #: The sampler settings of :class:`SynthesisRequest` / :class:`EditRequest` this engine
    #: uses. A request that sets another one is refused by the base class, naming the field
    #: (an engine without a sampler declares ``frozenset()``): a setting that silently does
    #: nothing is a defect, as for compute options.
    request_settings: ClassVar[frozenset[str]] = frozenset({"steps", "guidance"})
    #: The ``compute.device`` types this engine runs on (``frozenset({"cpu"})``), or ``None``
    #: for any. Another one is refused at load, before any weights are read, with
    #: :class:`InvalidOption` naming ``compute.device`` and the devices it supports.
    devices: ClassVar[frozenset[str] | None] = None
    #: The ``compute.dtype`` values this engine runs in (``frozenset({"float32"})``), or
    #: ``None`` for any; another one is refused at load as for :attr:`devices`.
    dtypes: ClassVar[frozenset[str] | None] = None
    #: The plugin API the class is written against: ``"1.0"`` for one that overrides the
    #: public calls itself (see :mod:`mizuoto.contracts.api`), else the current version.
    plugin_api: ClassVar[str] = API_VERSION
    #: What ``load`` applied (:func:`mizuoto.contracts.placement.place`); ``None`` for an engine
    #: that does not use it (then ``applied.compute`` holds the process-wide settings only).
    placement: Placement | None = None

    def __init_subclass__(cls, **kwargs) -> None:
        """Check compute options at every ``load``; wrap a public call a subclass written for
        API 1.0 defines itself (it did the shared work itself) so that it still runs under the
        lock and its result gets what the base class now fills in."""
        super().__init_subclass__(**kwargs)
        check_scheduling_declared(cls)
        load = cls.__dict__.get("load")
        if isinstance(load, classmethod) and not getattr(load.__func__, "_mizuoto_checked", 0):
            cls.load = classmethod(_checking_compute(load.__func__))
        for name in _PUBLIC_CALLS:
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, "_mizuoto_serialized", False):
                cls.plugin_api = "1.0"
                warnings.warn(PluginAPIDeprecation(
                    f"{cls.__module__}.{cls.__qualname__} overrides Engine.{name}(): since "
                    f"plugin API 1.1 the base class does the shared work (params, seed, lock, "
                    f"Applied) and calls {_HOOKS[name]}(); overriding {name}() still works "
                    "(see docs/changelog.md)"), stacklevel=3)
                setattr(cls, name, _serialized(method))

    @classmethod
    def check_compute(cls, options: Options | None) -> None:
        """Raise :class:`InvalidOption` naming the option and the engine for a ``compute.*``
        option this engine does not implement, set to a non-default value (other than the
        no-op values of :data:`NO_OP_COMPUTE`), and for a
        ``compute.device`` / ``compute.dtype`` outside :attr:`devices` / :attr:`dtypes`.

        Every subclass's ``load`` runs it first (the base class wraps ``load``), so neither
        ``mizuoto.load`` nor a direct ``SomeEngine.load(...)`` can skip it.
        """
        if options is None:
            return
        device = options.compute.device.partition(":")[0]
        for setting, value, supported, verb in (
                ("device", device, cls.devices, "runs on"),
                ("dtype", options.compute.dtype, cls.dtypes, "runs in")):
            if supported is not None and value != "auto" and value not in supported:
                raise InvalidOption(
                    f"compute.{setting}",
                    f"the {cls.name} engine {verb} {', '.join(sorted(supported))} only; set "
                    f"compute.{setting} to auto or {sorted(supported)[0]}")
        compute_class = type(options.compute)  # ComputeOptions, without importing options
        defaults = compute_class()
        for field in attrs.fields(compute_class):
            if field.name in cls.compute_options:
                continue
            value, default = getattr(options.compute, field.name), getattr(defaults, field.name)
            if value != default and (field.name, value) not in NO_OP_COMPUTE.items():
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

    @classmethod
    def check_request(cls, request: SynthesisRequest, model_dir: Path) -> None:
        """Raise :class:`InvalidRequest` for a request this engine would refuse whatever the
        weights, before they load (a reference without the transcript the engine needs): a
        command fails in milliseconds instead of after the load. Reads at most small files."""
        return None

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

    # -- the public calls: the shared work, then the engine's own method ---------------------

    def synthesize(self, request: SynthesisRequest | RequestPlan, *,
                   progress: ProgressCallback | None = None) -> SynthesisResult:
        """Speak ``request.text`` (``request``, or its :meth:`plan`); see
        :meth:`_synthesize`."""
        self._implemented("_synthesize", None, "synthesize")
        call = self._planned(request)
        request = call.request
        generator = self.make_generator(call.seed)
        if isinstance(self.scheduling, ChunkTurns) and _implements(type(self), "_stream"):
            # a turn per chunk of _stream, as a stream's: the engine's chunks, joined
            pieces = self._scheduled(call, generator, progress)
            rendered = join_stream(pieces, self.info.sample_rate)
        else:
            with self.scheduling:
                rendered = self._synthesize(request, call.params, generator, progress)
        return SynthesisResult(rendered.audio, self._applied(call, rendered))

    def stream(self, request: SynthesisRequest | RequestPlan, *,
               progress: ProgressCallback | None = None) -> Iterator[AudioChunk]:
        """The audio in chunks, each as soon as it is made; the last carries ``applied``.
        The request is checked now (or was, by :meth:`plan`); the chunks come as the engine's
        scheduling object allows (:attr:`takes_turns_per`): a request holding the engine from
        its first chunk to its last (or until the stream is closed), a turn per chunk, or a
        row of the core's scheduler."""
        self._implemented("_stream", Capability.STREAM, "stream")
        call = self._planned(request)
        request = call.request
        generator = self.make_generator(call.seed)
        index = iter(range(2**63))

        def chunk(rendered: Rendered) -> AudioChunk:
            applied = self._applied(call, rendered) if rendered.last else None
            return AudioChunk(rendered.audio, next(index), is_last=rendered.last,
                              applied=applied)

        return self._scheduled(call, generator, progress, chunk)

    def _scheduled(self, call: RequestPlan, generator: Any, progress: ProgressCallback | None,
                   each=lambda chunk: chunk) -> Stream:
        """The request's chunks, each mapped by ``each``, as the engine's scheduling hands
        them out; what ``_stream`` runs before its first chunk (its checks) is run now."""
        with self.scheduling:  # an engine may plan (and refuse) eagerly in _stream
            pieces = iter(self._pieces(call.request, call.params, generator, progress))
        return self.scheduling.stream(pieces, each)

    def edit(self, request: EditRequest | RequestPlan, *,
             progress: ProgressCallback | None = None) -> SynthesisResult:
        """Regenerate ``request.segments`` of the recording so it says ``request.text``."""
        self._implemented("_edit", Capability.EDIT, "edit")
        call = self._planned(request)
        request = call.request
        generator = self.make_generator(call.seed)
        with self.scheduling:
            rendered = self._edit(request, call.params, generator, progress)
        return SynthesisResult(rendered.audio, self._applied(call, rendered))

    def build_voice(self, reference: Reference) -> Voice:
        """A reusable voice from ``reference`` (``Voice.save`` writes it)."""
        self._implemented("_build_voice", Capability.VOICE_CACHE, "build_voice")
        with self.scheduling:
            return self._build_voice(reference)

    # -- what an engine implements ----------------------------------------------------------

    def _synthesize(self, request: SynthesisRequest, params: Any, generator: Any,
                    progress: ProgressCallback | None) -> Rendered:
        """Make the audio for a checked request: ``params`` parsed from ``request.params``,
        ``generator`` from :meth:`make_generator` seeded with the request's (or a drawn)
        seed. Return the audio and the facts only the engine knows (sampler settings,
        retries, fallbacks, warnings, chunks, extra).

        An engine implements this or :meth:`_stream` (or both): by default it is the join of
        ``_stream``'s chunks, with the last chunk's facts."""
        _check_implements_one(type(self))
        return join_stream(self._pieces(request, params, generator, progress),
                           self.info.sample_rate)

    def _stream(self, request: SynthesisRequest, params: Any, generator: Any,
                progress: ProgressCallback | None) -> Iterator[Rendered]:
        """Yield a :class:`Rendered` per chunk, the last with ``last=True``; a generator
        function, or a function that checks the request and returns an iterator.

        By default one chunk: the whole of :meth:`_synthesize`, made when the stream opens."""
        _check_implements_one(type(self))
        return one_chunk(self._synthesize(request, params, generator, progress))

    def _pieces(self, request: SynthesisRequest, params: Any, generator: Any,
                progress: ProgressCallback | None) -> Iterator[Rendered]:
        """The chunks of a planned request: for an engine that declares the step interface,
        its row in the core's scheduler (:mod:`mizuoto.contracts.scheduler`), stepped
        together with the other open requests; else the engine's :meth:`_stream`."""
        if stepping_engine(self) is not None:
            from mizuoto.contracts.scheduler import scheduler_for

            return scheduler_for(self).submit(request, params, generator, progress=progress)
        return self._stream(request, params, generator, progress)

    def _edit(self, request: EditRequest, params: Any, generator: Any,
              progress: ProgressCallback | None) -> Rendered:
        raise NotImplementedError

    def _build_voice(self, reference: Reference) -> Voice:
        raise NotImplementedError

    def make_voice(self, tensors: Mapping[str, Any], *, texts: Mapping[str, str] | None = None,
                   meta: Mapping[str, Any] | None = None) -> Voice:
        """A :class:`Voice` of ``tensors`` for this engine: its name, the weights' fingerprint
        (``info.fingerprint``, which :meth:`Voice.check` compares) and its sample rate."""
        return Voice(engine=self.name, model_fingerprint=self.info.fingerprint,
                     sample_rate=self.info.sample_rate, tensors=tensors, texts=texts or {},
                     meta=meta or {})

    def make_generator(self, seed: int) -> Any:
        """The random generator a request draws from: a ``torch.Generator`` on the model's
        device seeded with ``seed`` (its ``initial_seed()`` gives the seed back). An engine
        that draws elsewhere (numpy, an external program) overrides it."""
        import torch

        return torch.Generator(device=self.info.device).manual_seed(seed)

    def compute_in_effect(self) -> dict[str, Any]:
        """``applied.compute``: the process-wide CPU settings now, and what ``placement``
        applied (``compile``, ``oom_fallback``, an engine's own ``attention``...)."""
        settings = dict(self.placement.in_effect) if self.placement is not None else {}
        for name, report in _NO_OP_REPORTED.items():
            if name not in type(self).compute_options:
                settings.setdefault(name, report)
        return compute_in_effect(**settings)

    def sampler_defaults(self) -> dict[str, int | float]:
        """The ``steps`` and ``guidance`` a request gets when it leaves them unset, for those
        this engine uses (empty: it takes neither). Shown by clients such as the server's page."""
        return {}

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

    # -- the shared work ----------------------------------------------------------------------

    def _implemented(self, hook: str, capability: Capability | None, method: str) -> None:
        """The capability is declared (else UnsupportedCapability) and the engine implements
        its method (declaring a capability without it is a plugin bug, named as such)."""
        if capability is not None:
            self.require(capability)
        if hook in _RENDER_HOOKS:
            _check_implements_one(type(self))
        elif getattr(type(self), hook) is getattr(Engine, hook):
            declares = f"declares {capability.value} but " if capability is not None else ""
            raise UnsupportedCapability(
                f"{self.name} model {self.info.model} {declares}the engine does not implement "
                f"{method}() (its {hook}()); this is a bug in the {self.name} plugin")

    def plan(self, request: SynthesisRequest | EditRequest) -> RequestPlan:
        """The pre-flight: ``request`` checked against the capabilities (and its saved
        voice against the weights), its params parsed and its seed resolved (drawn here
        when unset), without running it. Pass the plan to :meth:`synthesize`,
        :meth:`stream` or :meth:`edit` to run it as planned: a front end refuses a bad
        request before it queues, and knows the seed before the first byte."""
        if isinstance(request, SynthesisRequest):
            if request.instruction is not None:
                _require_planned(self, Capability.DESIGN)
            if request.voice is not None:
                _require_planned(self, Capability.VOICE_CACHE)
                request.voice.check(self.name, self.info.fingerprint)
            elif request.reference is not None:
                _require_planned(self, Capability.CLONE)
            elif request.instruction is None:
                _require_planned(self, Capability.ZERO_SHOT)
        for setting in _SAMPLER_SETTINGS - self.request_settings:
            if getattr(request, setting) is not None:
                raise InvalidRequest(setting, f"the {self.name} engine has no such setting",
                                     "leave it unset")
        check_param_keys(type(self), request.params)
        # an API 1.0 plugin without a params_class may read request.params itself
        reads_its_own = type(self).parse_params is Engine.parse_params \
            and not parses_params_by_class(type(self))
        params = None if reads_its_own else self.parse_params(request.params)
        seed, drawn = resolve_seed(request.seed)
        return RequestPlan(request, params, seed, drawn, self.name, self.info.fingerprint,
                           tuple(getattr(request, "notices", ())),
                           taken_defaults(self.model_defaults, request.params))

    def _planned(self, request: SynthesisRequest | EditRequest | RequestPlan) -> RequestPlan:
        """``request``'s plan: the one given, if this model made it, else planned now."""
        if not isinstance(request, RequestPlan):
            return self.plan(request)
        if (request.engine, request.fingerprint) != (self.name, self.info.fingerprint):
            raise InvalidRequest("request", f"was planned by another model ({request.engine} "
                                 f"{request.fingerprint[:12]})", "plan it with this engine")
        return request

    def _applied(self, call: RequestPlan, rendered: Rendered) -> Applied:
        info, placement = self.info, self.placement
        load_warnings = placement.warnings if placement is not None else ()
        load_fallbacks = placement.fallbacks if placement is not None else ()
        warned = load_warnings + rendered.warnings
        return Applied(
            engine=self.name, model=info.model, seed=call.seed, seed_drawn=call.seed_drawn,
            dtype=info.dtype, device=info.device, sampler=rendered.sampler,
            retries=rendered.retries, fallbacks=rendered.fallbacks + load_fallbacks,
            warnings=warned + tuple(n for n in call.notices if n not in warned),
            license=info.license, non_commercial=info.non_commercial, chunks=rendered.chunks,
            compute=self.compute_in_effect(), extra=rendered.extra,
            model_defaults=call.model_defaults)

    @property
    def scheduling(self) -> RequestScheduling:
        """The engine's one scheduling object (:mod:`mizuoto.contracts.scheduling`): it runs
        the requests, and says its ``capacity``, what is ``active`` and ``waiting``, ``idle``."""
        return scheduling_for(self)


_SAMPLER_SETTINGS = frozenset({"steps", "guidance"})
_RENDER_HOOKS = ("_synthesize", "_stream")  # each has a default built from the other
_PUBLIC_CALLS = ("synthesize", "stream", "edit", "build_voice")
_HOOKS = {name: f"_{name}" for name in _PUBLIC_CALLS}


def _require_planned(engine: Engine, capability: Capability) -> None:
    """``engine.require(capability)``, except that an API 1.0 plugin, which checked its
    requests in its own public calls (and `say` handed them over unplanned), still takes what
    it took then, with a warning. A function, not a method: a Ray ingress's proxy runs
    :meth:`Engine.plan` without the engine's private members."""
    if engine.plugin_api == "1.0" and capability not in engine.capabilities:
        deprecated(f"{type(engine).__qualname__} was sent a request that needs "
                   f"{capability.value!r} without declaring it in its ModelInfo's "
                   "capabilities: declare it (API 1.1 refuses such a request)", stacklevel=3)
        return
    engine.require(capability)


def _check_implements_one(cls: type[Engine]) -> None:
    if stepping_engine(cls) is not None:  # its stream is the scheduler's rows
        return
    if not any(_implements(cls, hook) for hook in _RENDER_HOOKS):
        raise TypeError(f"{cls.__module__}.{cls.__qualname__} implements neither _synthesize() "
                        "nor _stream(): implement one of them (the base class builds the "
                        "other from it)")


def _implements(cls: type[Engine], hook: str) -> bool:
    return getattr(cls, hook) is not getattr(Engine, hook)


def parses_params_by_class(engine_cls: type[Engine]) -> bool:
    """Whether the engine's params are its ``params_class``'s fields, as the base class parses
    them: an engine with its own ``parse_params``, or an API 1.0 plugin without a
    ``params_class`` (it may read ``request.params`` itself), is asked at the request."""
    if engine_cls.parse_params is not Engine.parse_params:
        return False
    return engine_cls.params_class is not None or engine_cls.plugin_api != "1.0"


def check_param_keys(engine_cls: type[Engine], params: Mapping[str, Any] | None) -> None:
    """Raise :class:`InvalidRequest` naming the first key of a request's ``params`` that
    ``engine_cls`` does not take, with the closest one it does (every key, for an engine
    that takes none). The one rule for every path: before the model loads
    (``mizuoto.load(request=...)``, batch's ``ModelLoader.check``, ``mizuoto edit``) and in
    :meth:`Engine.plan`. An engine that parses its params itself
    (:func:`parses_params_by_class` false) is asked at the request instead."""
    if parses_params_by_class(engine_cls):
        check_known_keys(engine_cls.params_class, params, "params")


def engine_lock(engine: Engine) -> RequestScheduling:
    """``engine``'s scheduling object (:attr:`Engine.scheduling`): for an engine that runs one
    request at a time, the lock that serializes them."""
    return scheduling_for(engine)


def _checking_compute(load):
    @functools.wraps(load)
    def checked(cls, model_dir, *args, options=None, **kwargs):
        cls.check_compute(options)
        if options is not None:
            check_startup_options(options.compute)
        defaults = read_model_defaults(model_dir, cls.params_class)  # a bad file fails first
        engine = load(cls, model_dir, *args, options=options, **kwargs)
        if defaults:
            engine.__dict__["_mizuoto_model_defaults"] = defaults
        return engine

    checked._mizuoto_checked = True
    return checked


def _serialized(method):
    """A public call a subclass defines itself (plugin API 1.0), under the engine's lock; its
    result gets what the base class fills in for its own calls: the request's notices in
    ``applied.warnings`` and ``applied.compute`` when the plugin left it out."""
    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def stream(self, *args, **kwargs):
            return self.scheduling.stream(method(self, *args, **kwargs),
                                       functools.partial(_completed, self, args))

        wrapper = stream
    else:
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            with self.scheduling:
                result = method(self, *args, **kwargs)
            if inspect.isgenerator(result) or isinstance(result, Stream):  # a stream
                return self.scheduling.stream(result, functools.partial(_completed, self, args))
            return _completed(self, args, result)

        wrapper = call
    wrapper._mizuoto_serialized = True
    return wrapper


def _completed(engine: Engine, args, value):
    """``value`` with what the base class records for its own calls: the request's notices
    (what validation changed, e.g. control characters dropped) in ``warnings``, the model
    directory's defaults it took in ``model_defaults``, and ``compute`` when the plugin left
    it out (API 1.0 plugins built ``Applied`` without it)."""
    applied = getattr(value, "applied", None)
    if applied is None or not isinstance(value, (SynthesisResult, AudioChunk)):
        return value
    request = args[0] if args else None
    notices = getattr(request, "notices", ())
    missing = tuple(n for n in notices if n not in applied.warnings)
    changes: dict[str, Any] = {}
    if missing:
        changes["warnings"] = applied.warnings + missing
    taken = taken_defaults(engine.model_defaults, getattr(request, "params", None))
    if taken and not applied.model_defaults:
        changes["model_defaults"] = taken
    if not applied.compute:
        changes["compute"] = engine.compute_in_effect()
    if not changes:
        return value
    return attrs.evolve(value, applied=attrs.evolve(applied, **changes))
