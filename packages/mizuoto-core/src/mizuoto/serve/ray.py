"""``mizuoto serve --ray``: the same server on Ray Serve (``pip install "mizuoto-core[ray]"``).

One Ray Serve application:

- one deployment per model (:class:`ModelReplica`): each replica loads its engine once and runs
  it on a :class:`~mizuoto.serve.worker.ModelWorker`, as the single-process server does (so
  ``--max-batch`` batches inside each replica);
- with ``lora_dirs``, one deployment for the LoRA exports found there (:class:`AdapterReplica`;
  found as the single-process server finds them, :func:`~mizuoto.adapters.find_adapters` by
  the formats installed engines declare, or an engine's own ``is_lora_export``): each adapter
  is a model named by its directory, loaded on demand through ``serve.multiplexed`` (at most
  ``max_adapters`` per replica, least recently used unloaded), requests routed to a replica
  that has it loaded when one does;
- the ingress (:class:`Ingress`): the application of :func:`~mizuoto.serve.app.create_app`,
  routes, page, authentication, limits and metrics unchanged, whose models are
  :class:`RemoteEngine` proxies, made for each engine class from its own members: what was
  fixed at load (``info``, ``model_defaults``, ``sampler_defaults()``) is read once, the
  engine's checks (``parse_params``, ``supports``...) run in the ingress over it, and every
  other public call is a streaming call to the model's deployment, so audio passes through
  chunk by chunk, an error raised there is raised here as it was (the same response as from
  one process), and a client that leaves cancels the call (its replica stops the generation
  at the next step, as the single-process server does).

Before anything is deployed, the replicas asked for (and the ingress) are checked against the
cluster's CPUs and GPUs (:func:`check_resources`): Ray would wait for ever to place a replica
that cannot fit, and every request would hang with it. The ingress starts at once, so
``/health`` answers (503) while the model replicas load.

Voices are read and written by the ingress in ``voices_dir`` and travel inside each request: the
model replicas never read the store. Several ingress replicas (``ingress_replicas``) on several
nodes need that directory shared (an NFS or other ReadWriteMany volume mounted at the same path):
otherwise a voice exists only on the node whose ingress saved it.

:func:`application` builds the application; :func:`app_builder` is the same for
``serve run mizuoto.serve.ray:app_builder models='{"name": "model"}'`` and RayService manifests;
:func:`run` is ``mizuoto serve --ray``. See docs/serve.md, "Scaling out".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import re
import signal
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from mizuoto.contracts import features
from mizuoto.contracts.features import SupportsBatching
from mizuoto.contracts.request_lock import NoLock
from mizuoto.errors import InvalidRequest
from mizuoto.serve.app import ServeConfig, _loader, create_app
from mizuoto.serve.batching import MAX_BATCH
from mizuoto.serve.errors import unavailable
from mizuoto.serve.jobs import DONE, Job
from mizuoto.serve.worker import ModelWorker
from mizuoto.validation.ranges import integer_in, number_in

log = logging.getLogger("mizuoto.serve")

#: Requests one ingress replica takes at once: its own queues and 429s bound them, not Ray.
INGRESS_ONGOING = 4096


def _replicas(field: str, optional: bool = False):
    return integer_in(field, 1, 4096, optional=optional)


@attrs.frozen
class RaySettings:
    """How the models are spread over Ray: ``address`` of the cluster (None: a local instance);
    ``replicas`` per model, or autoscaling between ``min_replicas`` and ``max_replicas`` aiming at
    ``target_ongoing`` requests per replica; ``num_cpus`` / ``num_gpus`` each model replica
    reserves (fractions allowed); ``ingress_replicas`` and ``ingress_cpus`` for the HTTP side;
    ``lora_dirs``: directories whose subdirectories are LoRA exports, each served as a model of
    its directory's name, at most ``max_adapters`` loaded per replica."""

    address: str | None = None
    replicas: int = attrs.field(default=1, validator=_replicas("replicas"))
    min_replicas: int | None = attrs.field(default=None, validator=_replicas("min_replicas",
                                                                             True))
    max_replicas: int | None = attrs.field(default=None, validator=_replicas("max_replicas",
                                                                             True))
    target_ongoing: float = attrs.field(default=1.0, validator=number_in(
        "target_ongoing", 0.0, float(MAX_BATCH), low_open=True))
    num_cpus: float = attrs.field(default=1.0, validator=number_in("num_cpus", 0.0, 1024.0))
    num_gpus: float = attrs.field(default=0.0, validator=number_in("num_gpus", 0.0, 64.0))
    ingress_replicas: int = attrs.field(default=1, validator=_replicas("ingress_replicas"))
    ingress_cpus: float = attrs.field(default=0.25, validator=number_in("ingress_cpus", 0.0,
                                                                        64.0))
    lora_dirs: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    max_adapters: int = attrs.field(default=4, validator=integer_in("max_adapters", 1, 1024))

    def __attrs_post_init__(self) -> None:
        if (self.min_replicas is None) != (self.max_replicas is None):
            given = "min_replicas" if self.max_replicas is None else "max_replicas"
            raise InvalidRequest(given, "is given alone",
                                 "give both min_replicas and max_replicas, or replicas")
        if self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise InvalidRequest("min_replicas", f"{self.min_replicas} is above max_replicas "
                                 f"{self.max_replicas}")

    @property
    def most_replicas(self) -> int:
        return self.max_replicas if self.max_replicas is not None else self.replicas


def _lora_exports(lora_dirs) -> dict[str, str]:
    """The LoRA exports under ``lora_dirs`` as the single-process server finds them: adapter
    id (its directory's name) to directory."""
    if not lora_dirs:
        return {}  # the registry (and torch) stay unloaded
    from mizuoto.adapters import engine_adapter_formats, find_adapters

    return {name: str(path)
            for name, path in find_adapters(lora_dirs, engine_adapter_formats()).items()}


def _config_fields(config: ServeConfig) -> dict:
    """``config`` as keyword arguments that pickle (a mapping proxy does not)."""
    fields = {f.name: getattr(config, f.name) for f in attrs.fields(ServeConfig)}
    fields["models"] = dict(config.models)
    return fields


# -- the model replicas ----------------------------------------------------------------------

def _start_worker(name: str, model: str, config: ServeConfig) -> ModelWorker:
    """A started worker with ``model`` loaded (or failed to load: logged, and said by
    :func:`_describe` to whoever asks)."""
    worker = ModelWorker(name, model, load=_loader(model, config), queue_size=config.queue_size)
    worker.start()
    worker.loaded.wait()
    if worker.state == "failed":
        log.error("model %s (%s) failed to load on this replica: %s", name, model, worker.error)
    return worker


def _describe(worker: ModelWorker) -> dict:
    """What the ingress needs to know of the loaded engine to check and build requests."""
    if worker.engine is None:
        raise ModelLoadFailed(f"model {worker.name!r} failed to load on its replica: "
                              f"{worker.error}")
    return description(worker.engine)


def description(engine) -> dict:
    """What :class:`RemoteEngine` fetches of a loaded engine: its class, and what was fixed
    at load."""
    return {"cls": type(engine), "info": engine.info,
            "model_defaults": dict(engine.model_defaults),
            "sampler_defaults": dict(engine.sampler_defaults())}


class ModelLoadFailed(RuntimeError):
    """A replica could not load its model (the message names the model and why)."""


#: Passed for a ``progress`` argument: a callable stays in the ingress (it is called there per
#: item received), the replica passes its job's check (which stops a cancelled call).
_PROGRESS = "mizuoto:progress"
#: The first item of a call whose result is an iterator (a stream): its items follow.
_ITEMS_FOLLOW = "mizuoto:items-follow"


@attrs.frozen
class _Returned:
    """The first and only item of a call that returned a value (not an iterator)."""

    value: Any


def _engine_call(member: str, args: tuple, kwargs: dict, read: bool):
    """The job running ``engine.member(*args, **kwargs)`` (or reading ``engine.member``)."""
    if member.startswith("_"):
        raise ValueError(f"{member!r} is not a public member of an engine")

    def run(engine, job: Job) -> None:
        if read:
            job.emit(_Returned(getattr(engine, member)))
            return
        given = {k: job.check if v == _PROGRESS else v for k, v in kwargs.items()}
        result = getattr(engine, member)(*args, **given)
        if not isinstance(result, Iterator):
            job.emit(_Returned(result))
            return
        job.emit(_ITEMS_FOLLOW)
        try:
            for item in result:
                job.check()
                job.emit(item)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()  # releases the engine at once when the caller left

    return run


async def _run(worker: ModelWorker, member: str, args: tuple, kwargs: dict, read: bool):
    """The items of one engine call on ``worker``; cancelled (Ray cancels the call when the
    ingress does), the job stops at its next step."""
    job = Job(_engine_call(member, args, kwargs, read), asyncio.get_running_loop())
    worker.submit(job)
    try:
        while (item := await job.get()) is not DONE:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        job.cancel()


class ModelReplica:
    """One replica of one model's deployment: the engine loaded once, on its worker."""

    def __init__(self, name: str, model: str, config: dict) -> None:
        self._worker = _start_worker(name, model, ServeConfig(**config))

    def describe(self) -> dict:
        return _describe(self._worker)

    async def call(self, member: str, args: tuple = (), kwargs: dict | None = None,
                   read: bool = False):
        async for item in _run(self._worker, member, args, kwargs or {}, read):
            yield item


class _Adapter:
    """A loaded LoRA export in an :class:`AdapterReplica`; stopped when Ray unloads it."""

    def __init__(self, worker: ModelWorker, grace: float) -> None:
        self.worker = worker
        self._grace = grace

    def __del__(self) -> None:
        # the running request finishes (within the grace), queued ones are refused
        threading.Thread(target=self.worker.stop, args=(self._grace,), daemon=True).start()


class AdapterReplica:
    """A replica of the LoRA deployment: up to ``max_adapters`` exports loaded, each on its
    own worker, chosen by the request's multiplexed model id (the adapter's id)."""

    def __init__(self, exports: dict, config: dict, max_adapters: int) -> None:
        from ray import serve

        self._exports = dict(exports)
        self._config = ServeConfig(**config)

        async def load(adapter: str) -> _Adapter:
            if adapter not in self._exports:
                raise ModelLoadFailed(f"no LoRA export named {adapter!r}")
            worker = await asyncio.to_thread(_start_worker, adapter, self._exports[adapter],
                                             self._config)
            if worker.engine is None:  # not kept: the next request tries again
                worker.stop(0)
                raise ModelLoadFailed(f"model {adapter!r} failed to load on its replica: "
                                      f"{worker.error}")
            return _Adapter(worker, self._config.grace)

        self._adapter = serve.multiplexed(max_num_models_per_replica=max_adapters)(load)

    async def _worker(self) -> ModelWorker:
        from ray import serve

        return (await self._adapter(serve.get_multiplexed_model_id())).worker

    async def describe(self) -> dict:
        return _describe(await self._worker())

    async def call(self, member: str, args: tuple = (), kwargs: dict | None = None,
                   read: bool = False):
        async for item in _run(await self._worker(), member, args, kwargs or {}, read):
            yield item


# -- the ingress -----------------------------------------------------------------------------

def _unwrapped(exc: BaseException, model: str) -> BaseException:
    """What the ingress raises for a failed remote call: the replica's own error (an
    :class:`APIError`, a bad request...) as raised there; a replica that died, a 503."""
    import ray.exceptions as errors

    if isinstance(exc, errors.RayTaskError) and exc.cause is not None:
        return exc.cause
    if isinstance(exc, errors.ActorDiedError | errors.ActorUnavailableError
                  | errors.RayActorError):
        log.warning("model %s: a replica stopped during a request: %s", model, exc)
        return unavailable(f"the replica running model {model!r} stopped during the "
                           "request: send it again (another replica takes it)", "replica_lost",
                           1)
    return exc


class RemoteEngine(SupportsBatching):
    """An engine whose calls run on a model deployment's replicas. :meth:`connect` makes one
    for the replica's engine class (:func:`proxy_class`): what the routes read of an engine
    (``name``, ``info``, ``model_defaults``, ``sampler_defaults()``) is the replica's, fetched
    once; the engine's checks run here over it; every other public member is the replica's.
    It "batches" ``lanes`` requests: that many are passed on at once, for the replicas to run
    (each batches by its own engine's options)."""

    #: The engine's own methods the ingress runs itself: they read only what was fetched.
    LOCAL = frozenset({"capabilities", "supports", "require", "parse_params", "make_voice",
                       "plan"})

    def __init__(self, model: str, handle, description: dict, lanes: int = 1) -> None:
        self._model = model
        self._handle = handle
        self._lanes = lanes
        self._info = description["info"]
        self._model_defaults = MappingProxyType(description["model_defaults"])
        self._sampler_defaults = description["sampler_defaults"]

    @property
    def info(self):
        return self._info

    @property
    def model_defaults(self) -> Mapping[str, Any]:
        return self._model_defaults

    @classmethod
    def batch_options(cls, section, max_batch: int) -> dict:
        return dict(section)  # the replicas' engines take --max-batch, not this proxy

    @property
    def max_batch(self) -> int:
        return self._lanes

    @property
    def batch_stats(self):
        return None  # counted on the replicas

    @functools.cached_property
    def scheduling(self) -> NoLock:
        """What the worker runs at once: ``lanes`` requests passed on together (the replicas'
        engines schedule them), counted here."""
        return NoLock(capacity=self._lanes)

    @classmethod
    def connect(cls, model: str, handle, lanes: int = 1) -> RemoteEngine:
        """The remote engine of ``handle``'s deployment (waits until a replica answers)."""
        try:
            description = handle.describe.remote().result()
        except Exception as exc:
            raise _unwrapped(exc, model) from None
        return proxy_class(description["cls"])(model, handle, description, lanes)

    def sampler_defaults(self) -> dict:
        return dict(self._sampler_defaults)

    def _remote_call(self, member: str, args: tuple, kwargs: dict):
        """``engine.member(*args, **kwargs)`` on a replica: its value, or for an iterator, an
        iterator of its items here (``progress`` called per item, as the engine would)."""
        progress = kwargs.pop("progress", None)
        if progress is not None:
            kwargs["progress"] = _PROGRESS
        items = self._items(member, args, kwargs)
        first = next(items)  # the replica's error (a refused request) is raised here, now
        if isinstance(first, _Returned):
            items.close()
            return first.value
        if first != _ITEMS_FOLLOW:
            items.close()
            raise RuntimeError(f"a replica answered {first!r} where a stream's items follow")
        return _relayed(items, progress)

    def _remote_read(self, member: str):
        items = self._items(member, (), {}, read=True)
        try:
            return next(items).value
        finally:
            items.close()

    def _items(self, member: str, args: tuple, kwargs: dict, read: bool = False):
        calls = self._handle.options(stream=True).call.remote(member, args, kwargs, read)
        try:
            while True:
                try:
                    item = next(calls)
                except StopIteration:
                    return
                except Exception as exc:
                    raise _unwrapped(exc, self._model) from None
                yield item
        finally:
            calls.cancel()  # the replica stops the generation (a no-op once it ended)


def _relayed(items, progress):
    try:
        for item in items:
            if progress is not None:
                progress()
            yield item
    finally:
        items.close()


def _remote_method(member: str):
    def call(self, *args, **kwargs):
        return self._remote_call(member, args, kwargs)

    call.__name__ = member
    return call


@functools.cache
def proxy_class(engine_class: type) -> type[RemoteEngine]:
    """The :class:`RemoteEngine` of ``engine_class``: its class attributes and class methods
    (the engine class's own), its :attr:`RemoteEngine.LOCAL` methods run over the fetched
    facts, every other public method and property a call to a replica; the optional features
    it declares (:mod:`mizuoto.contracts.features`) declared too, so the front ends ask the
    proxy as they ask the engine. A new Engine member needs nothing here."""
    namespace: dict[str, Any] = {"__module__": __name__}
    for name in dir(engine_class):
        if name.startswith("_") or hasattr(RemoteEngine, name):
            continue  # the proxy's own (info, sampler_defaults, batching) or private
        member = inspect.getattr_static(engine_class, name)
        if isinstance(member, classmethod | staticmethod):
            namespace[name] = staticmethod(getattr(engine_class, name))  # the engine class's
        elif name in RemoteEngine.LOCAL:
            namespace[name] = member
        elif isinstance(member, property):
            namespace[name] = property(functools.partial(RemoteEngine._remote_read,
                                                         member=name))
        elif inspect.isfunction(member):
            namespace[name] = _remote_method(name)
        else:
            namespace[name] = member  # class data: name, params_class, request_settings...
    declared = tuple(base for base in engine_class.__mro__
                     if base.__module__ == features.__name__ and base is not SupportsBatching)
    return type(f"Remote{engine_class.__name__}", (RemoteEngine, *declared), namespace)


class Ingress:
    """The HTTP side: :func:`~mizuoto.serve.app.create_app`'s application over remote models.
    ``handles`` maps each served name to its deployment's handle and, for a LoRA, the adapter
    id; ``lanes`` is how many requests of one model it passes on at once (every replica's)."""

    def __init__(self, config: dict, handles: dict, lanes: int) -> None:
        self._config = ServeConfig(**config)
        self._handles = handles
        self._lanes = lanes

    def _loader(self, name: str, model: str):
        handle, adapter = self._handles[name]
        if adapter is not None:
            handle = handle.options(multiplexed_model_id=adapter)

        def load():
            return RemoteEngine.connect(name, handle, self._lanes)

        # an adapter loads on its first request (in a replica's LRU), a model at start
        return load, adapter is None

    def __serve_build_asgi_app__(self):
        # the ingress starts at once, so /health answers (503, "loading") while the model
        # replicas load; start() waits for ready() before it returns
        self._app = create_app(self._config, loader=self._loader)
        return self._app

    async def ready(self) -> str:
        """This ingress replica's id, once every model it serves has connected (or failed
        to): what :func:`start` waits for (a request right after it would otherwise meet
        "still loading" now and then)."""
        from ray import serve

        workers = self._app.app.state.mizuoto.workers.values()  # the FastAPI app in the gate
        await asyncio.gather(*(asyncio.to_thread(w.loaded.wait) for w in workers))
        return serve.get_replica_context().replica_id.unique_id


def _wait_ready(app_name: str, ingress_replicas: int) -> None:
    """Until every ingress replica says its models are connected (calls at once are spread
    over the replicas, each answering with its id)."""
    from ray import serve

    handle = serve.get_deployment_handle("ingress", app_name=app_name)
    seen: set[str] = set()
    while len(seen) < ingress_replicas:
        calls = [handle.ready.remote() for _ in range(2 * ingress_replicas)]
        seen.update(call.result() for call in calls)


def _starting_replicas(settings: RaySettings) -> int:
    return settings.min_replicas if settings.max_replicas is not None else settings.replicas


def check_resources(settings: RaySettings, deployments: int, cluster: Mapping[str, float],
                    largest_node: Mapping[str, float]) -> None:
    """Raise :class:`InvalidRequest` when the replicas ``settings`` start for ``deployments``
    models (and the ingress) need more CPUs or GPUs than ``cluster`` has, or one replica more
    than its ``largest_node``: Ray would wait for ever to place them, every request hanging
    meanwhile, and say so only in its own log."""
    replicas = _starting_replicas(settings)
    count = "replicas" if settings.max_replicas is None else "min_replicas"
    each = deployments * replicas
    needs = {"CPU": each * settings.num_cpus + settings.ingress_replicas
             * settings.ingress_cpus, "GPU": each * settings.num_gpus}
    flags = {"CPU": "num_cpus", "GPU": "num_gpus"}
    for kind, needed in needs.items():
        has = float(cluster.get(kind, 0.0))
        per_replica = getattr(settings, flags[kind])
        if per_replica > float(largest_node.get(kind, 0.0)) + 1e-9:
            raise InvalidRequest(flags[kind], f"one model replica reserves {per_replica:g} "
                                 f"{kind}s and no Ray node has that many (the largest: "
                                 f"{float(largest_node.get(kind, 0.0)):g})",
                                 f"lower --{flags[kind].replace('_', '-')}")
        if needed > has + 1e-9:
            ingress = (f" plus {settings.ingress_replicas} ingress at "
                       f"{settings.ingress_cpus:g} CPU" if kind == "CPU" else "")
            room = has - (needs["CPU"] - each * settings.num_cpus if kind == "CPU" else 0.0)
            fits = f"; --{flags[kind].replace('_', '-')} {int(room / each * 100) / 100:g} " \
                   "fits" if room > 0 and each else ""
            raise InvalidRequest(count, f"{replicas} replica(s) of each of {deployments} "
                                 f"model deployment(s) at {per_replica:g} {kind} each "
                                 f"(--{count.replace('_', '-')}, "
                                 f"--{flags[kind].replace('_', '-')}){ingress} need "
                                 f"{needed:g} {kind}s; the Ray cluster has {has:g}",
                                 f"lower --{count.replace('_', '-')} or "
                                 f"--{flags[kind].replace('_', '-')}{fits}")


def _deployment_name(name: str) -> str:
    return "model-" + re.sub(r"[^A-Za-z0-9_-]", "_", name)


def _actor_environment(config: ServeConfig) -> dict[str, str]:
    """Variables every replica process starts with: OpenMP's wait policy as this process runs
    with it (the ``mizuoto`` command sets it before torch is imported), else as
    ``compute.cpu_wait_policy`` asks. A Ray actor is a new process whose environment is the
    raylet's: without this, its torch threads would spin in libgomp's default."""
    import os

    from mizuoto.runtime.threads import WAIT_POLICY_ENV, wait_policy_environment

    if WAIT_POLICY_ENV in os.environ:
        return {WAIT_POLICY_ENV: os.environ[WAIT_POLICY_ENV]}
    options = config.options
    if options is None:
        from mizuoto.options import Options

        options = Options()
    return wait_policy_environment(options.compute, {})


def _replica_options(settings: RaySettings, config: ServeConfig) -> dict:
    options = {"ray_actor_options": {"num_cpus": settings.num_cpus,
                                     "num_gpus": settings.num_gpus,
                                     "runtime_env": {"env_vars": _actor_environment(config)}},
               # a replica runs max_batch requests at once; the others wait in Ray's router,
               # which hands each to the first replica with room
               "max_ongoing_requests": config.max_batch}
    if settings.max_replicas is not None:
        options["autoscaling_config"] = {"min_replicas": settings.min_replicas,
                                         "max_replicas": settings.max_replicas,
                                         "target_ongoing_requests": settings.target_ongoing}
    else:
        options["num_replicas"] = settings.replicas
    return options


def application(config: ServeConfig, settings: RaySettings | None = None):
    """The Ray Serve application serving ``config`` as ``settings`` spread it."""
    from ray import serve

    settings = settings or RaySettings()
    fields = _config_fields(config)
    exports = _lora_exports(settings.lora_dirs)
    clash = sorted(set(exports) & set(config.models))
    if clash:
        raise InvalidRequest("lora_dirs", f"a LoRA export and a model are both named "
                             f"{clash[0]!r}", "rename the export's directory or --alias the model")
    options = _replica_options(settings, config)
    handles = {}
    for name, model in config.models.items():
        deployment = serve.deployment(ModelReplica, name=_deployment_name(name), **options)
        handles[name] = (deployment.bind(name, model, fields), None)
    if exports:
        deployment = serve.deployment(AdapterReplica, name="loras", **options)
        bound = deployment.bind(exports, fields, settings.max_adapters)
        handles.update({adapter: (bound, adapter) for adapter in exports})
    served = {**dict(config.models), **exports}
    fields["models"] = served
    lanes = min(MAX_BATCH, settings.most_replicas * config.max_batch)
    ingress = serve.deployment(serve.ingress()(Ingress), name="ingress",
                               num_replicas=settings.ingress_replicas,
                               max_ongoing_requests=INGRESS_ONGOING,
                               ray_actor_options={
                                   "num_cpus": settings.ingress_cpus,
                                   "runtime_env": {"env_vars": _actor_environment(config)}})
    return ingress.bind(fields, handles, lanes)


def app_builder(args: Mapping[str, object]):
    """``serve run mizuoto.serve.ray:app_builder`` (and a RayService's ``import_path``):
    ``args`` holds :class:`~mizuoto.serve.app.ServeConfig`'s fields (``models``: a mapping of
    name to model, or a list of models) and :class:`RaySettings`' (``address`` aside)."""
    from mizuoto.serve.app import model_names

    args = dict(args)
    models = args.pop("models", None)
    if isinstance(models, str):
        models = [models]
    if not isinstance(models, Mapping):
        models = model_names(list(models or []))
    ray_fields = {f.name for f in attrs.fields(RaySettings)} - {"address"}
    settings = RaySettings(**{k: args.pop(k) for k in list(args) if k in ray_fields})
    if "voices_dir" in args:
        args["voices_dir"] = Path(args["voices_dir"])
    return application(ServeConfig(models=models, **args), settings)


def start(config: ServeConfig, settings: RaySettings, *, name: str = "mizuoto") -> None:
    """Deploy on Ray (a running cluster at ``settings.address``, else a local instance) with
    Serve's HTTP proxy on ``config.host``:``config.port``; returns once every model replica
    has loaded (or failed to: ``/health`` says which and why)."""
    import ray
    from ray import serve

    app = application(config, settings)  # a bad setting fails before Ray starts
    if not ray.is_initialized():
        from mizuoto.runtime.ray_temp import local_ray_temp_dir

        local = {} if settings.address not in (None, "local") else local_ray_temp_dir()
        # "local": a new instance, never one found on the machine (ray.init's default
        # joins the cluster last started here, whatever it is)
        ray.init(address=settings.address or "local", include_dashboard=False,
                 log_to_driver=False, **local)
    _check_cluster(ray, settings, len(config.models) + bool(_lora_exports(settings.lora_dirs)))
    serve.start(http_options={"host": config.host, "port": config.port})
    serve.run(app, name=name, route_prefix="/")
    _wait_ready(name, settings.ingress_replicas)


def _check_cluster(ray, settings: RaySettings, deployments: int) -> None:
    """:func:`check_resources` against the cluster Ray runs on: refused on a local instance;
    on a cluster at an address, which may add nodes as it autoscales, a warning."""
    nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
    largest = {kind: max((float(n.get(kind, 0.0)) for n in nodes), default=0.0)
               for kind in ("CPU", "GPU")}
    try:
        check_resources(settings, deployments, ray.cluster_resources(), largest)
    except InvalidRequest as exc:
        if settings.address in (None, "local"):
            raise
        log.warning("the Ray cluster cannot place the replicas now (they wait for an "
                    "autoscaler to add nodes): %s", exc)


#: Seconds the command may take to stop after a Ctrl-C (or SIGTERM) while Ray starts or the
#: replicas load, before it exits on its own (status 130): Ray can hang there, an interrupted
#: ``ray.init`` once never returned in CI. A local instance's processes end with the command
#: (Ray's fate sharing).
STOP_LIMIT = 30.0


class _InterruptWatch:
    """Notices SIGINT and SIGTERM from a thread, through :func:`signal.set_wakeup_fd`: the
    interpreter writes each signal's number there as it arrives, even while the main thread is
    held inside Ray and cannot run its Python handler, or Ray swallowed what the handler raised.
    On one it sets ``stop`` and gives the command :data:`STOP_LIMIT` seconds to :meth:`close`
    the watch, then exits the process."""

    def __init__(self, stop: threading.Event, limit: float) -> None:
        self._stop = stop
        self._limit = limit
        self._closed = threading.Event()
        self._read, self._write = os.pipe()
        try:
            os.set_blocking(self._write, False)  # set_wakeup_fd's requirement
            self._previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        except (ValueError, OSError) as exc:  # Windows takes a socket only: no watch there
            log.debug("no interrupt watch: %s", exc)
            os.close(self._read)
            os.close(self._write)
            self._closed.set()
            return
        threading.Thread(target=self._watch, name="mizuoto-interrupt-watch", daemon=True).start()

    def _watch(self) -> None:
        try:
            while True:
                data = os.read(self._read, 64)
                if not data or self._closed.is_set():  # closed: the write end is gone
                    return
                if {signal.SIGINT, signal.SIGTERM} & set(data):
                    self._stop.set()
                    if not self._closed.wait(self._limit):
                        log.error("Ray did not stop within %.0f s of the interrupt: exiting "
                                  "now", self._limit)
                        os._exit(130)
                    return
        finally:
            os.close(self._read)

    def close(self) -> None:
        """Stop watching (idempotent); the wakeup fd goes back to what it was, unless someone
        replaced ours meanwhile (theirs stays)."""
        if self._closed.is_set():
            return
        self._closed.set()
        current = signal.set_wakeup_fd(self._previous, warn_on_full_buffer=False)
        if current != self._write:
            signal.set_wakeup_fd(current, warn_on_full_buffer=False)
        os.close(self._write)  # the watching thread reads the end of the pipe, and closes it


def run(config: ServeConfig, settings: RaySettings) -> None:
    """``mizuoto serve --ray``: deploy, serve until SIGINT or SIGTERM, then take the
    application down (a local Ray instance stops with it)."""
    import ray
    from ray import serve

    from mizuoto.serve.app import auth_line

    stop = threading.Event()
    serving = False
    local = settings.address is None

    def interrupt_start(signum, frame):
        stop.set()
        raise KeyboardInterrupt

    # Ctrl-C while Ray starts or the replicas load raises KeyboardInterrupt (Ray's handler is
    # for SIGTERM): it ends the wait at once, and the finally takes down what was started. Ray
    # can lose the exception (its compiled task submission defers SIGINT and raises it from
    # there), so the handler also sets `stop`, read once the start returns: a CI run saw the
    # whole application start after a Ctrl-C that raised nothing. And where Ray never returns,
    # the watch ends the command after STOP_LIMIT.
    watch = _InterruptWatch(stop, STOP_LIMIT)
    try:
        signal.signal(signal.SIGINT, interrupt_start)
        start(config, settings)
        for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which installs its own
            signal.signal(sig, lambda *_: stop.set())
        serving = not stop.is_set()
        if serving:
            watch.close()  # a graceful stop takes as long as the requests in flight need
            log.info("listening on http://%s:%d through Ray Serve; %s", config.host,
                     config.port, auth_line(config))
            stop.wait()
        else:
            log.info("interrupted while starting: stopping")
    except KeyboardInterrupt:
        log.info("interrupted while starting: stopping")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # one Ctrl-C is enough: no half teardown
        try:
            if ray.is_initialized():
                _take_down(serve, ray, serving=serving, local=local)
        finally:
            watch.close()


def _take_down(serve, ray, *, serving: bool, local: bool) -> None:
    if serving:  # graceful: requests in flight finish (the replicas' grace)
        with contextlib.suppress(Exception):
            serve.delete("mizuoto")
        if local:
            serve.shutdown()
    elif not local:
        # interrupted while deploying on a cluster that stays up: take the half-made
        # application off it without waiting for replicas still being built
        with contextlib.suppress(Exception):  # not deployed yet: nothing to delete
            serve.delete("mizuoto", _blocking=False)
    # A local instance ends with every process it started. Interrupted while starting, nothing
    # is in flight: a graceful delete would wait for replicas still loading, so it goes
    # straight down.
    if local:
        ray.shutdown()


__all__ = ["AdapterReplica", "Ingress", "ModelLoadFailed", "ModelReplica",
           "RaySettings", "RemoteEngine", "app_builder", "application", "run", "start"]
