"""Property test: ``POST /v1/audio/speech`` with arbitrary bodies (a live server on a tiny random
F5-TTS model). Every answer is audio or an OpenAI-shaped error below 500: never a crash."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("mizuoto_f5tts")

from mizuoto.serve import ServeConfig, serve_in_thread  # noqa: E402
from mizuoto_contract.strategies import HOSTILE_NUMBERS, TEXT, mostly  # noqa: E402

# Each example may run the model: a quarter of the profile's examples (ci: 10, fuzz: 200).
SERVER_RUNS = settings(max_examples=max(5, settings.default.max_examples // 4))

# JSON that Python's parser reads: NaN and Infinity included, as json.loads accepts them.
NUMBERS = st.one_of(HOSTILE_NUMBERS, st.floats(), st.integers(), st.none())
# steps is always sent (F5's default 32 on a long text takes a minute on a loaded CPU).
EXTENSION = st.fixed_dictionaries({"steps": mostly(st.integers(1, 2), NUMBERS)}, optional={
    "seed": mostly(st.integers(0, 2**32 - 1), NUMBERS),
    "guidance": mostly(st.floats(0, 10), NUMBERS),
    "params": mostly(st.fixed_dictionaries({}, optional={"speed": st.floats(0.1, 10)}),
                     st.dictionaries(st.sampled_from(["speed", "fix_duration", "nope"]),
                                     NUMBERS, max_size=2)),
    "stream": st.booleans(),
})
BODY = st.fixed_dictionaries(
    {"model": mostly(st.just("f5"), st.text(max_size=8)),
     "input": mostly(TEXT, st.one_of(st.just(""), NUMBERS)),
     "voice": mostly(st.just("default"), st.one_of(st.text(max_size=12), NUMBERS,
                                                    st.fixed_dictionaries({"id": st.text()})))},
    optional={"response_format": st.sampled_from(["wav", "flac", "pcm", "mp3", "opus", "aac",
                                                  "x"]),
              "speed": mostly(st.floats(0.25, 4), NUMBERS),
              "stream_format": st.sampled_from(["audio", "sse", "x"]),
              "instructions": st.one_of(st.none(), TEXT),
              "mizuoto": mostly(EXTENSION, NUMBERS)})
BODY = st.tuples(BODY, EXTENSION).map(lambda pair: {"mizuoto": pair[1], **pair[0]})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from mizuoto_f5tts.fixtures import write_random_model_dir

    root = tmp_path_factory.mktemp("fuzz-serve")
    write_random_model_dir(root / "f5", "v1_base", size="tiny")
    config = ServeConfig(models={"f5": str(root / "f5")}, voices_dir=root / "voices",
                         queue_size=4)
    with serve_in_thread(config) as url:
        yield url


@SERVER_RUNS
@given(body=st.one_of(BODY, st.just("{not json"), st.binary(max_size=20)))
def test_speech_bodies_give_audio_or_an_error_below_500(server, body):
    content = body if isinstance(body, (str, bytes)) else json.dumps(body, allow_nan=True)
    response = httpx.post(f"{server}/v1/audio/speech", content=content, timeout=120,
                          headers={"content-type": "application/json"})
    assert response.status_code < 500, response.text[:500]
    if response.status_code == 200:
        assert response.content, "an empty audio response"
    else:
        assert "error" in response.json(), response.text[:500]
