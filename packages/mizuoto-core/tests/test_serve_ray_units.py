"""serve --ray without Ray: the engine proxy (:class:`RemoteEngine` over a handle that runs
each call in this process as a replica would, every item and error pickled as Ray pickles
them), the LoRA exports, and the resource check before deploying. The proxy is made from the
engine class alone, and whatever the engine raises reaches the client as the single-process
server sends it."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("ray")
from ray import cloudpickle as pickle  # what Ray pickles calls and errors with

mizuoto_example = pytest.importorskip("mizuoto_example")

from mizuoto import errors  # noqa: E402
from mizuoto.contracts.requests import SynthesisRequest  # noqa: E402
from mizuoto.serve.errors import from_mizuoto  # noqa: E402
from mizuoto.serve.ray import (  # noqa: E402
    RaySettings,
    RemoteEngine,
    _engine_call,
    _lora_exports,
    _unwrapped,
    check_resources,
    description,
    proxy_class,
)


class _Job:
    def __init__(self):
        self.items = []

    def emit(self, item):
        self.items.append(pickle.loads(pickle.dumps(item)))

    def check(self, _progress=None):
        self.checks = getattr(self, "checks", 0) + 1


class _Calls:
    """A streaming call's answer: the replica's items, its error raised as Ray raises it."""

    def __init__(self, items, error):
        self._items = iter(items)
        self._error = error
        self.cancelled = False

    def __next__(self):
        try:
            return next(self._items)
        except StopIteration:
            if self._error is None:
                raise
            import ray.exceptions

            raise ray.exceptions.RayTaskError("call", "traceback", pickle.loads(
                pickle.dumps(self._error))).as_instanceof_cause() from None

    def cancel(self):
        self.cancelled = True


class _Handle:
    def __init__(self, engine):
        self.engine = engine
        self.call = self
        self.calls = []
        self.answers = []

    def options(self, **_):
        return self

    def remote(self, member, args, kwargs, read):
        job, error = _Job(), None
        args, kwargs = pickle.loads(pickle.dumps((args, kwargs)))
        try:
            _engine_call(member, args, kwargs, read)(self.engine, job)
        except Exception as exc:
            error = exc
        self.calls.append(member)
        self.answers.append(_Calls(job.items, error))
        return self.answers[-1]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    import mizuoto
    from mizuoto_example.engine import write_tiny_model

    directory = tmp_path_factory.mktemp("toy")
    write_tiny_model(directory)
    return mizuoto.load(directory, engine="toy")


@pytest.fixture
def remote(engine):
    handle = _Handle(engine)
    facts = pickle.loads(pickle.dumps(description(engine)))
    return proxy_class(type(engine))("toy", handle, facts)


def test_the_proxy_is_made_from_the_engine_class(engine, remote):
    assert isinstance(remote, RemoteEngine)
    assert type(remote).params_class is type(engine).params_class
    assert remote.name == engine.name and remote.info == engine.info
    assert remote.sampler_defaults() == engine.sampler_defaults()
    assert remote.supports(next(iter(engine.capabilities)))
    assert remote.parse_params({}) == engine.parse_params({})  # run here, not on a replica
    assert remote._handle.calls == []
    assert remote.recognizes.__self__ is type(engine)  # the engine class's own
    assert remote.compute_in_effect() == engine.compute_in_effect()  # any other member: remote
    assert remote._handle.calls == ["compute_in_effect"]


def test_calls_return_and_stream_as_the_engine_does(engine, remote):
    request = SynthesisRequest("Two words here.", seed=5)
    assert torch.equal(remote.synthesize(request).audio.samples,
                       engine.synthesize(request).audio.samples)
    progress = []
    chunks = list(remote.stream(request, progress=lambda *a: progress.append(a)))
    here = list(engine.stream(request))
    assert len(chunks) == len(here) > 1
    assert all(torch.equal(a.audio.samples, b.audio.samples) for a, b in zip(chunks, here, strict=True))
    assert len(progress) == len(here)  # called per chunk received, as the engine would


def test_a_stream_left_early_cancels_the_remote_call(remote):
    chunks = remote.stream(SynthesisRequest("Several words to hum here.", seed=1))
    next(chunks)
    assert not remote._handle.answers[0].cancelled
    chunks.close()
    assert remote._handle.calls == ["stream"] and remote._handle.answers[0].cancelled


_ERRORS = [
    errors.InvalidRequest("params.nope", "is not a toy setting", "leave it out"),
    errors.InvalidAudio("reference", "is silent"),
    errors.VoiceMismatch("built for another model"),
    errors.UnsupportedCapability("cannot design voices"),
    errors.InvalidOption("compute.device", "unknown"),
    errors.EngineBusy("every slot is held", "close a stream"),
    errors.ModelFilesMissing("/srv/models/x", ["vocab.txt"]),
    errors.NonFiniteAudio("toy", 1, 0, 10),
    errors.DiskFull("/srv/voices/a.safetensors"),
    RuntimeError("a bug"),
]


@pytest.mark.parametrize("error", _ERRORS, ids=lambda error: type(error).__name__)
def test_an_error_raised_on_a_replica_is_the_same_response(engine, remote, monkeypatch,
                                                           error):
    def fail(self, *args, **kwargs):
        raise error

    monkeypatch.setattr(type(engine), "synthesize", fail)
    with pytest.raises(Exception) as raised:
        remote.synthesize(SynthesisRequest("Hi.", seed=1))
    here, there = from_mizuoto(error, param_prefix="mizuoto."), \
        from_mizuoto(raised.value, param_prefix="mizuoto.")
    assert (there.status, there.body(), there.headers) == \
        (here.status, here.body(), here.headers)


def test_the_engines_own_refusals_are_400s_naming_the_field(remote):
    refused = []
    for request in (SynthesisRequest("Hi.", params={"nope": 1}),
                    SynthesisRequest("Hi.", instruction="a low voice")):
        with pytest.raises(errors.MizuotoError) as raised:
            remote.stream(request)  # refused at the call, before any chunk, as here
        refused.append(from_mizuoto(raised.value, param_prefix="mizuoto."))
    assert [(r.status, r.param, r.code) for r in refused] == [
        (400, "mizuoto.params.nope", "invalid_value"), (400, None, "unsupported")]


def test_a_lost_replica_is_a_503_to_send_again():
    import ray.exceptions

    lost = _unwrapped(ray.exceptions.ActorDiedError(), "vox")
    assert (lost.status, lost.code) == (503, "replica_lost")


def test_private_members_are_not_called_on_a_replica(engine):
    with pytest.raises(ValueError, match="not a public member"):
        _engine_call("_synthesize", (), {}, False)


class _Exports:
    """An engine declaring LoRA support whose exports hold a file named ``adapter.bin``."""

    @classmethod
    def make(cls):
        from mizuoto.contracts.features import SupportsLoRA

        class Lora(SupportsLoRA):
            lora = None

            def set_lora(self, path):
                pass

            @classmethod
            def is_lora_export(cls, directory):
                return (directory / "adapter.bin").is_file()

        class NoLora:
            @classmethod
            def is_lora_export(cls, directory):  # not a LoRA engine: never asked
                return True

        return [Lora, NoLora]


def test_adapters_are_the_subdirectories_a_lora_engine_claims(tmp_path, monkeypatch):
    """Found by :func:`~mizuoto.adapters.find_adapters`, as the single-process server finds
    them: here by an engine's own ``is_lora_export`` (it declares no ``lora_targets``)."""
    from mizuoto import registry

    for name in ("a", "b"):
        (tmp_path / "one" / name).mkdir(parents=True)
    (tmp_path / "one" / "a" / "adapter.bin").write_bytes(b"")
    (tmp_path / "two" / "a").mkdir(parents=True)
    (tmp_path / "two" / "a" / "adapter.bin").write_bytes(b"")
    lora, plain = _Exports.make()
    monkeypatch.setattr(registry, "engines", lambda: {"lora": lora, "plain": plain})
    assert _lora_exports([tmp_path / "one"]) == {"a": str(tmp_path / "one" / "a")}
    with pytest.raises(errors.InvalidRequest, match="two LoRA exports"):
        _lora_exports([tmp_path / "one", tmp_path / "two"])
    monkeypatch.setattr(registry, "engines", lambda: {"plain": plain})
    assert _lora_exports([tmp_path / "one"]) == {}
    assert _lora_exports([]) == {}


def test_voxcpm_says_which_folders_are_its_lora_exports(tmp_path):
    voxcpm = pytest.importorskip("mizuoto_voxcpm.engine")
    from mizuoto_voxcpm.lora import WEIGHTS_FILE

    assert not voxcpm.VoxCPMEngine.is_lora_export(tmp_path)
    (tmp_path / WEIGHTS_FILE).write_bytes(b"")
    assert voxcpm.VoxCPMEngine.is_lora_export(tmp_path)


def test_replicas_the_cluster_cannot_place_are_refused_naming_the_flags():
    """The issue's case: two replicas at one CPU each, and the ingress, on two cores."""
    two_cores = {"CPU": 2.0}
    with pytest.raises(errors.InvalidRequest) as refused:
        check_resources(RaySettings(replicas=2), 1, two_cores, two_cores)
    message = str(refused.value)
    assert refused.value.field == "replicas"
    for said in ("--replicas", "--num-cpus", "need 2.25 CPUs", "has 2", "--num-cpus 0.87"):
        assert said in message, message
    check_resources(RaySettings(replicas=2, num_cpus=0.87), 1, two_cores, two_cores)
    with pytest.raises(errors.InvalidRequest, match="min-replicas"):
        check_resources(RaySettings(min_replicas=3, max_replicas=4), 1, two_cores, two_cores)
    check_resources(RaySettings(min_replicas=1, max_replicas=4), 1, two_cores, two_cores)


def test_gpus_and_the_largest_node_are_checked():
    cluster, node = {"CPU": 16.0, "GPU": 2.0}, {"CPU": 8.0, "GPU": 1.0}
    with pytest.raises(errors.InvalidRequest, match="GPUs; the Ray cluster has 2") as refused:
        check_resources(RaySettings(replicas=3, num_gpus=1.0), 1, cluster, node)
    assert "--num-gpus" in str(refused.value)
    with pytest.raises(errors.InvalidRequest, match="no Ray node has that many"):
        check_resources(RaySettings(num_cpus=12.0), 1, cluster, node)
    check_resources(RaySettings(replicas=2, num_gpus=1.0), 1, cluster, node)
    with pytest.raises(errors.InvalidRequest, match="no Ray node"):
        check_resources(RaySettings(num_gpus=0.5), 1, {"CPU": 4.0}, {"CPU": 4.0})


def test_the_ingress_answers_health_while_its_models_connect(engine, tmp_path):
    """The ingress starts at once: /health is a 503 naming each model "loading" while its
    replicas load (the handle's describe waits), then 200 once they answer."""
    import threading

    from starlette.testclient import TestClient

    from mizuoto.serve import ServeConfig
    from mizuoto.serve.ray import Ingress, _config_fields

    replicas_loaded = threading.Event()

    class Describe:
        def remote(self):
            return self

        def result(self):
            replicas_loaded.wait(30)
            return description(engine)

    handle = _Handle(engine)
    handle.describe = Describe()
    config = ServeConfig(models={"toy": "toy"}, voices_dir=tmp_path)
    ingress = Ingress(_config_fields(config), {"toy": (handle, None)}, lanes=1)
    with TestClient(ingress.__serve_build_asgi_app__(), base_url="http://127.0.0.1") as client:
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["models"] == {"toy": "loading"}
        replicas_loaded.set()
        for _ in range(100):
            if (health := client.get("/health")).status_code == 200:
                break
            threading.Event().wait(0.05)
        assert health.json()["models"] == {"toy": "ready"}
        speech = client.post("/v1/audio/speech", json={
            "model": "toy", "input": "Hum.", "voice": "default", "response_format": "pcm",
            "mizuoto": {"seed": 3}})
        assert speech.status_code == 200 and speech.content
        assert handle.calls == ["stream"]  # planned here, run on the "replica"
