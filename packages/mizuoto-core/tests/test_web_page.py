"""The page at ``GET /`` of ``mizuoto serve``, driven in a real headless Chromium (Playwright
with the system's browser, never its downloads) against a live server on 127.0.0.1 serving
tiny random-init F5-TTS and VoxCPM2 models and the example plugin's toy model.

What the page played is read where it is played: an init script records every buffer handed
to ``AudioBufferSourceNode.start`` (and when), and every read of a response stream (and when).
Every request the page makes is routed through the test, which fails it unless it goes to the
server under test.

Screenshots of each view, at desktop and phone widths, light and dark, go to
``$MIZUOTO_SCREENSHOTS`` (else the test's temporary folder). Without Chromium or Playwright the
tests skip, saying so; with ``MIZUOTO_REQUIRE_BROWSER=1`` (the nox ``ci`` session, which installs
both) they fail instead.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("mizuoto_f5tts")
pytest.importorskip("mizuoto_voxcpm")
pytest.importorskip("mizuoto_example")

import soundfile as sf  # noqa: E402

from mizuoto.serve import ServeConfig, serve_in_thread  # noqa: E402

pytestmark = pytest.mark.browser

REQUIRED = os.environ.get("MIZUOTO_REQUIRE_BROWSER") == "1"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
TIMEOUT_MS = 60_000

# Records what the page plays and when its response streams deliver data.
PROBE = """
window.__played = [];
window.__reads = [];
const start = AudioBufferSourceNode.prototype.start;
AudioBufferSourceNode.prototype.start = function (...args) {
  const data = this.buffer ? Array.from(this.buffer.getChannelData(0)) : [];
  window.__played.push({at: performance.now(), rate: this.buffer ? this.buffer.sampleRate : 0,
                        samples: data});
  return start.apply(this, args);
};
const read = ReadableStreamDefaultReader.prototype.read;
ReadableStreamDefaultReader.prototype.read = function (...args) {
  return read.apply(this, args).then((result) => {
    if (!result.done) window.__reads.push({at: performance.now(), bytes: result.value.length});
    return result;
  });
};
"""


def _chromium() -> str | None:
    for name in (os.environ.get("MIZUOTO_CHROMIUM"), "chromium", "chromium-browser",
                 "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    return None


def _unavailable(reason: str):
    if REQUIRED:
        pytest.fail(f"{reason} (MIZUOTO_REQUIRE_BROWSER=1: the browser tests must run)",
                    pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed: pip install --group browser-test "
                     "(PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1)")
    executable = _chromium()
    if executable is None:
        _unavailable("no Chromium on PATH: apt-get install chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable,
            args=["--autoplay-policy=no-user-gesture-required",
                  "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from mizuoto.contracts.fixtures import mark_random_init
    from mizuoto.contracts.model_defaults import write_model_defaults
    from mizuoto_example.engine import write_tiny_model
    from mizuoto_f5tts.fixtures import write_random_model_dir
    from mizuoto_voxcpm.fixtures import write_random_model
    from mizuoto_voxcpm.plugin import DEMO_DEFAULTS

    root = tmp_path_factory.mktemp("page-models")
    write_random_model_dir(root / "f5", "v1_base", size="tiny")
    write_random_model(root / "vox", "voxcpm2", dtype="float32")
    write_tiny_model(root / "toy")
    # as `mizuoto random-model` leaves them: marked random-init, VoxCPM2 with its demo defaults
    mark_random_init(root / "f5", "f5tts/tiny-v1-base")
    mark_random_init(root / "vox", "voxcpm/tiny-2")
    write_model_defaults(root / "vox", DEMO_DEFAULTS, "random-init demo model")
    return root


def _config(model_dirs, voices: Path, **fields) -> ServeConfig:
    return ServeConfig(models={name: str(model_dirs / name) for name in ("f5", "vox", "toy")},
                       voices_dir=voices, queue_size=4, **fields)


@pytest.fixture(scope="module")
def server(model_dirs, tmp_path_factory):
    with serve_in_thread(_config(model_dirs, tmp_path_factory.mktemp("voices"))) as url:
        yield url


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = os.environ.get("MIZUOTO_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


class Visit:
    """A page on ``url`` with its console errors and every request it made."""

    def __init__(self, browser, url: str, *, viewport=DESKTOP, color_scheme="light") -> None:
        self.url = url
        self.context = browser.new_context(viewport=viewport, color_scheme=color_scheme,
                                           accept_downloads=True)
        self.context.add_init_script(PROBE)
        self.requests: list[str] = []
        self.refused: list[str] = []
        self.errors: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def _route(self, route) -> None:
        address = route.request.url
        self.requests.append(address)
        if address.startswith(self.url + "/") or address.startswith(("data:", "blob:")):
            route.continue_()
        else:
            self.refused.append(address)
            route.abort()

    def open(self, ready: bool = True):
        self.page.goto(self.url + "/")
        if ready:
            self.page.wait_for_selector("body[data-ready=true]")
        return self.page

    def close(self) -> None:
        self.context.close()

    def played(self) -> list[dict]:
        return self.page.evaluate("window.__played")

    def reads(self) -> list[dict]:
        return self.page.evaluate("window.__reads")


@pytest.fixture
def visit(browser, server):
    visits = []

    def make(**kwargs) -> Visit:
        made = Visit(browser, kwargs.pop("url", server), **kwargs)
        visits.append(made)
        return made

    yield make
    for made in visits:
        made.close()
        assert made.requests, "no request went through the route"
        assert not made.refused, f"the page reached outside the server: {made.refused}"


def _expect(locator):
    # Playwright's own waits: wait_for_function evaluates strings, which the page's content
    # security policy (no eval) rightly refuses
    from playwright.sync_api import expect

    return expect(locator)


def _until(page, condition: str, timeout: float = TIMEOUT_MS / 1000) -> None:
    deadline = time.monotonic() + timeout
    while not page.evaluate(condition):
        assert time.monotonic() < deadline, f"still false after {timeout} s: {condition}"
        time.sleep(0.05)


def _int16(samples) -> np.ndarray:
    """Web Audio's floats (int16 / 32768, exact) back to the 16-bit integers."""
    return np.rint(np.asarray(samples, dtype=np.float64) * 32768).astype(np.int16)


def _api_pcm(server: str, body: dict) -> np.ndarray:
    response = httpx.post(f"{server}/v1/audio/speech", json={**body, "response_format": "pcm"},
                          timeout=120)
    assert response.status_code == 200, response.text
    return np.frombuffer(response.content, dtype="<i2")


def _set_speak(page, *, model: str, text: str, seed: int | None = None,
               steps: int | None = None, params: dict | None = None) -> None:
    page.select_option("#speak-model", model)
    page.fill("#speak-text", text)
    page.fill("#speak-seed", "" if seed is None else str(seed))
    if steps is not None:
        page.fill("#speak-steps", str(steps))
    if params:
        page.evaluate("document.querySelector('#speak-params').open = true")
        for name, value in params.items():
            page.fill(f"#speak-param-{name}", str(value))


def _speak_and_wait(page) -> None:
    page.click("#speak-go")
    _expect(page.locator("#speak-status")).to_have_text(re.compile("^Spoke"),
                                                        timeout=TIMEOUT_MS)


VOX = {"steps": 2, "params": {"max_len": 3}}
F5_STEPS = 2


def test_page_loads_without_errors_and_shows_each_view(visit, shots):
    """Desktop and phone, light and dark: no console error, every view drawn; the controls
    follow each model's card (design text for VoxCPM2 only, steps for the samplers)."""
    for viewport, width in ((DESKTOP, "desktop"), (PHONE, "phone")):
        for scheme in ("light", "dark"):
            v = visit(viewport=viewport, color_scheme=scheme)
            page = v.open()
            assert page.locator("#speak-model option").all_inner_texts() == [
                "f5 (f5tts)", "vox (voxcpm)", "toy (toy)"]
            assert page.is_hidden("#speak-instructions-field")
            assert page.get_attribute("#speak-steps", "placeholder") == "32"
            page.select_option("#speak-model", "vox")
            assert page.is_visible("#speak-instructions-field")
            assert page.get_attribute("#speak-steps", "placeholder") == "10"
            page.select_option("#speak-model", "toy")
            assert page.is_hidden("#speak-steps-field") and page.is_hidden("#speak-guidance-field")
            assert page.is_visible("#speak-params")  # engine settings, folded
            assert page.get_attribute("#speak-param-char_seconds", "placeholder") == "0.06"
            for tab in ("speak", "voices", "compare", "history"):
                page.click(f"#tab-{tab}")
                assert page.is_visible(f"#view-{tab}")
                page.screenshot(path=str(shots / f"{tab}-{width}-{scheme}.png"), full_page=True)
            assert v.errors == [], v.errors


def test_tabs_work_from_the_keyboard(visit):
    page = visit().open()
    page.focus("#tab-speak")
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.id") == "tab-voices"
    assert page.is_visible("#view-voices") and page.is_hidden("#view-speak")
    page.keyboard.press("End")
    assert page.evaluate("document.activeElement.id") == "tab-history"
    page.keyboard.press("ArrowRight")  # wraps around
    assert page.evaluate("document.activeElement.id") == "tab-speak"
    # every control of the Speak form has a label
    unlabelled = page.evaluate("""[...document.querySelectorAll('#view-speak input, '
        + '#view-speak select, #view-speak textarea')].filter(e => !e.labels.length).map(e => e.id)""")
    assert unlabelled == []


@pytest.mark.parametrize("model, steps, params", [("vox", VOX["steps"], VOX["params"]),
                                                  ("f5", F5_STEPS, None)])
def test_speaking_plays_the_apis_samples_for_the_seed_it_shows(visit, server, model, steps,
                                                               params):
    v = visit()
    page = v.open()
    _set_speak(page, model=model, text="Hello from the page.", steps=steps, params=params)
    _speak_and_wait(page)
    seed = int(page.locator("#speak-facts dt:text-is('Seed used') + dd").inner_text())
    played = np.concatenate([_int16(p["samples"]) for p in v.played()])
    body = {"model": model, "voice": "default", "input": "Hello from the page.",
            "mizuoto": {"seed": seed, "steps": steps, **({"params": params} if params else {})}}
    expected = _api_pcm(server, body)
    assert len(played) == len(expected) > 0
    assert np.array_equal(played, expected)
    assert {p["rate"] for p in v.played()} == {24000}
    facts = page.locator("#speak-facts").inner_text()
    assert "Time to first audio" in facts and "Real-time factor" in facts
    assert page.locator("#history-count").inner_text() == "1"
    assert v.errors == [], v.errors


def test_the_first_chunk_plays_before_the_last_arrives(visit, shots):
    v = visit()
    page = v.open()
    # 16 patches of VoxCPM2, each its own chunk: a few seconds of generation on the tiny model
    _set_speak(page, model="vox", text="A longer sentence, streamed as it is made.", seed=3,
               steps=2, params={"max_len": 16})
    _speak_and_wait(page)
    played, reads = v.played(), v.reads()
    assert len(reads) > 2, reads
    assert played[0]["at"] < reads[-1]["at"], (played[0]["at"], reads[-1]["at"])
    assert len(played) > 2
    page.evaluate("document.querySelector('#speak-params').open = false")
    page.screenshot(path=str(shots / "speak-spoken-desktop-light.png"), full_page=True)


def _cancelled(server: str) -> float:
    for line in httpx.get(f"{server}/metrics").text.splitlines():
        if line.startswith('mizuoto_cancelled_total{model="vox"}'):
            return float(line.split()[-1])
    return 0.0


def test_stop_ends_the_sound_and_the_generation(visit, server):
    v = visit()
    page = v.open()
    before = _cancelled(server)
    # 400 patches: about 20 s of work unless stopped
    _set_speak(page, model="vox", text="Stop me.", seed=1, steps=2, params={"max_len": 400})
    page.uncheck("#speak-param-retry_badcase")
    page.click("#speak-go")
    _until(page, "window.__played.length > 0")
    page.click("#speak-stop")
    _expect(page.locator("#speak-status")).to_have_text("Stopped.")
    assert page.is_enabled("#speak-go") and page.is_disabled("#speak-stop")
    deadline = time.monotonic() + 10
    while _cancelled(server) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _cancelled(server) == before + 1
    assert page.locator("#history-count").inner_text() == "0"


def test_download_is_the_chosen_format_with_the_same_seed(visit, server):
    v = visit()
    page = v.open()
    _set_speak(page, model="vox", text="Keep this one.", seed=11, **VOX)
    page.select_option("#speak-format", "wav")
    _speak_and_wait(page)
    assert page.inner_text("#speak-download") == "Download WAV"
    with page.expect_download() as caught:
        page.click("#speak-download")
    download = caught.value
    assert download.suggested_filename == "mizuoto-vox-11.wav"
    samples, rate = sf.read(download.path(), dtype="int16")
    body = {"model": "vox", "voice": "default", "input": "Keep this one.",
            "response_format": "wav", "mizuoto": {"seed": 11, **VOX}}
    expected, expected_rate = sf.read(io.BytesIO(
        httpx.post(f"{server}/v1/audio/speech", json=body, timeout=120).content), dtype="int16")
    assert rate == expected_rate and np.array_equal(samples, expected)


def _clip(path: Path) -> Path:
    from mizuoto_contract.reference import voiced_signal

    sf.write(path, voiced_signal(24000), 24000, format="WAV", subtype="PCM_16")
    return path


def test_a_voice_from_an_uploaded_wav_is_selectable_usable_and_deletable(visit, server,
                                                                         tmp_path):
    from mizuoto_contract.reference import REFERENCE_TEXT

    v = visit()
    page = v.open()
    page.click("#tab-voices")
    page.select_option("#voice-model", "toy")
    page.fill("#voice-name", "hummer")
    page.fill("#voice-text", REFERENCE_TEXT)
    page.set_input_files("#voice-file", str(_clip(tmp_path / "clip.wav")))
    assert page.is_visible("#voice-preview")
    page.click("#voice-create")
    _expect(page.locator("#voice-status")).to_contain_text("is ready", timeout=TIMEOUT_MS)
    _expect(page.locator("#voice-list")).to_contain_text("hummer")
    # hear it back: a sample sentence in the new voice
    before = len(v.played())
    page.locator("#voice-list li", has_text="hummer").get_by_role("button", name="Hear").click()
    status = page.locator("#voice-list-status")
    _expect(status).to_contain_text("Played hummer", timeout=TIMEOUT_MS)
    seed = int(re.search(r"seed (\d+)", status.inner_text()).group(1))
    heard = np.concatenate([_int16(p["samples"]) for p in v.played()[before:]])
    assert np.array_equal(heard, _api_pcm(server, {
        "model": "toy", "voice": "hummer", "input": "This is how this voice sounds.",
        "mizuoto": {"seed": seed}}))
    page.locator("#voice-list li", has_text="hummer").get_by_role(
        "button", name="Use in Speak").click()
    assert page.is_visible("#view-speak")
    assert page.input_value("#speak-model") == "toy"
    assert page.input_value("#speak-voice") == "hummer"
    _set_speak(page, model="toy", text="Hum it.", seed=5)
    page.select_option("#speak-voice", "hummer")
    before = len(v.played())
    _speak_and_wait(page)
    played = np.concatenate([_int16(p["samples"]) for p in v.played()[before:]])
    expected = _api_pcm(server, {"model": "toy", "voice": "hummer", "input": "Hum it.",
                                 "mizuoto": {"seed": 5}})
    assert np.array_equal(played, expected)
    # the voice is the toy's only: another model does not list it
    page.select_option("#speak-model", "f5")
    _expect(page.locator("#speak-voice")).not_to_contain_text("hummer")
    page.click("#tab-voices")
    page.select_option("#voice-model", "toy")
    page.locator("#voice-list li", has_text="hummer").get_by_role("button",
                                                                  name="Delete").click()
    _expect(page.locator("#voice-list")).not_to_contain_text("hummer")
    assert "hummer" not in [v["id"] for v in httpx.get(
        f"{server}/v1/audio/voices").json()["voices"]]


def test_bad_uploads_show_the_servers_message_next_to_the_field(visit, tmp_path):
    v = visit()
    page = v.open()
    page.click("#tab-voices")
    page.select_option("#voice-model", "toy")
    # not audio
    junk = tmp_path / "notes.wav"
    junk.write_bytes(b"this is not a recording")
    page.fill("#voice-name", "junk")
    page.set_input_files("#voice-file", str(junk))
    page.click("#voice-create")
    error = page.locator("#voice-audio-error")
    error.wait_for(state="visible")
    assert "cannot be read" in error.inner_text()
    # silent
    silent = tmp_path / "silent.wav"
    sf.write(silent, np.zeros(24000, np.float32), 24000, subtype="PCM_16")
    page.set_input_files("#voice-file", str(silent))
    page.click("#voice-create")
    _expect(error).to_contain_text(re.compile("silent", re.IGNORECASE))
    # too long, and a sample rate no engine takes
    for name, samples, rate, words in (("long.wav", 8000 * 61, 8000, "more than 60 s"),
                                       ("low.wav", 2000, 500, "rate")):
        sf.write(tmp_path / name, np.full(samples, 0.1, np.float32), rate, subtype="PCM_16")
        page.set_input_files("#voice-file", str(tmp_path / name))
        page.click("#voice-create")
        _expect(error).to_contain_text(words)
    # a bad name: the server's words, next to the name
    page.set_input_files("#voice-file", str(_clip(tmp_path / "clip.wav")))
    page.fill("#voice-name", "no spaces allowed")
    page.click("#voice-create")
    name_error = page.locator("#voice-name-error")
    name_error.wait_for(state="visible")
    assert "is not valid" in name_error.inner_text()
    assert page.get_attribute("#voice-name", "aria-invalid") == "true"
    # another model: the form forgets the error and the clip chosen for the previous one
    page.select_option("#voice-model", "vox")
    assert page.is_hidden("#voice-name-error") and page.get_attribute(
        "#voice-name", "aria-invalid") is None
    assert page.evaluate("document.querySelector('#voice-file').files.length") == 0
    assert page.is_hidden("#voice-preview")
    page.click("#voice-create")
    _expect(page.locator("#voice-audio-error")).to_have_text("Choose a clip or record one.")
    # speaking a text over the limit is stopped in the page, naming the limit
    page.click("#tab-speak")
    page.fill("#speak-text", "x" * 4097)
    assert "4097 / 4096" in page.inner_text("#speak-text-count")
    page.click("#speak-go")
    assert "At most 4096 characters" in page.inner_text("#speak-text-error")


def test_the_key_is_asked_for_kept_for_the_tab_and_a_wrong_one_refused(browser, model_dirs,
                                                                       tmp_path, visit):
    config = _config(model_dirs, tmp_path / "voices", api_key="sesame")
    with serve_in_thread(config) as url:
        v = visit(url=url)
        page = v.open(ready=False)
        dialog = page.locator("#key-dialog")
        dialog.wait_for(state="visible")
        # the header says what the page waits for, and Cancel leaves it waiting for the key
        _expect(page.locator("#server-state")).to_have_text("Waiting for the API key…")
        page.click("#key-cancel")
        assert dialog.is_hidden()
        _expect(page.locator("#server-state")).to_contain_text("needs its API key")
        page.click("#key-open")
        dialog.wait_for(state="visible")
        page.fill("#key-input", "guess")
        page.click("#key-form button[type=submit]")
        _expect(page.locator("#key-error")).to_contain_text("refused")
        assert dialog.is_visible()
        page.fill("#key-input", "sesame")
        page.click("#key-form button[type=submit]")
        page.wait_for_selector("body[data-ready=true]")
        assert page.evaluate("sessionStorage.getItem('mizuoto.api-key')") == "sesame"
        assert page.evaluate("localStorage.length") == 0
        page.reload()  # the same tab keeps it
        page.wait_for_selector("body[data-ready=true]")
        assert dialog.is_hidden()
        other = v.context.new_page()  # another tab asks again
        other.goto(url + "/")
        other.locator("#key-dialog").wait_for(state="visible")


def test_compare_speaks_one_text_and_seed_on_two_models(visit, server, shots):
    v = visit()
    page = v.open()
    # the settings each side uses are those the Speak view keeps per model
    _set_speak(page, model="vox", text="unused", **VOX)
    _set_speak(page, model="f5", text="unused", steps=F5_STEPS)
    page.click("#tab-compare")
    page.fill("#compare-text", "Same words.")
    page.fill("#compare-seed", "42")
    page.select_option("#compare-a-model", "f5")
    page.select_option("#compare-b-model", "vox")
    page.click("#compare-go")
    _expect(page.locator("#compare-status")).to_have_text(re.compile("^A and B"),
                                                          timeout=TIMEOUT_MS)
    for side, model, extension in (("a", "f5", {"steps": F5_STEPS}), ("b", "vox", VOX)):
        facts = page.locator(f"#compare-{side} .facts").inner_text()
        assert "42" in facts
        assert page.is_enabled(f"#compare-{side} .play")
        before = len(v.played())
        page.click(f"#compare-{side} .play")
        _until(page, f"window.__played.length > {before}")
        played = _int16(v.played()[-1]["samples"])
        expected = _api_pcm(server, {"model": model, "voice": "default", "input": "Same words.",
                                     "mizuoto": {"seed": 42, **extension}})
        assert np.array_equal(played, expected), side
    page.screenshot(path=str(shots / "compare-done-desktop-light.png"), full_page=True)
    page.click("#tab-history")
    items = page.locator("#history-list li")
    assert items.count() == 2
    assert "compare B" in items.nth(0).inner_text() and "compare A" in items.nth(1).inner_text()
    page.screenshot(path=str(shots / "history-filled-desktop-light.png"), full_page=True)
    assert v.errors == [], v.errors


def test_history_replays_and_downloads_what_was_heard(visit, server):
    v = visit()
    page = v.open()
    _set_speak(page, model="toy", text="First.", seed=1)
    _speak_and_wait(page)
    _set_speak(page, model="toy", text="Second.", seed=2)
    _speak_and_wait(page)
    page.click("#tab-history")
    first = page.locator("#history-list li").nth(1)
    assert "First." in first.inner_text() and "seed 1" in first.inner_text()
    before = len(v.played())
    first.get_by_role("button", name="Replay").click()
    _until(page, f"window.__played.length > {before}")
    expected = _api_pcm(server, {"model": "toy", "voice": "default", "input": "First.",
                                 "mizuoto": {"seed": 1}})
    assert np.array_equal(_int16(v.played()[-1]["samples"]), expected)
    with page.expect_download() as caught:
        first.get_by_role("button", name="Download WAV").click()
    samples, rate = sf.read(caught.value.path(), dtype="int16")
    assert rate == 24000 and np.array_equal(samples, expected)


def test_a_non_commercial_model_shows_its_license_next_to_the_audio(visit):
    """No tiny model is non-commercial (only catalog F5 weights are): the test marks one so in
    the server's card, as a catalog model's would read."""
    v = visit()

    def non_commercial(route):
        response = route.fetch()
        body = response.json()
        for entry in body["data"]:
            if entry["id"] == "toy":
                entry["mizuoto"].update(license="CC-BY-NC-4.0", non_commercial=True)
        route.fulfill(response=response, body=json.dumps(body))

    v.page.route("**/v1/models", non_commercial)
    page = v.open()
    _set_speak(page, model="toy", text="Licensed.", seed=1)
    _speak_and_wait(page)
    notice = page.locator("#speak-license")
    assert notice.is_visible()
    assert "Non-commercial use only" in notice.inner_text()
    assert "CC-BY-NC-4.0" in notice.inner_text()
    _set_speak(page, model="vox", text="Free.", seed=1, **VOX)
    _speak_and_wait(page)
    assert notice.is_hidden()


def test_microphone_recording_becomes_a_voice(visit):
    """Chromium's fake microphone (a beep): the recording (WebM, which the server cannot read)
    is decoded in the page and sent as WAV, and the server builds a voice from it."""
    v = visit()
    v.context.grant_permissions(["microphone"])
    page = v.open()
    page.click("#tab-voices")
    page.select_option("#voice-model", "toy")
    page.click("#voice-record")
    _expect(page.locator("#voice-record")).to_have_attribute("aria-pressed", "true")
    page.wait_for_timeout(1200)
    page.click("#voice-record")
    _expect(page.locator("#voice-record-state")).to_have_text(re.compile("^Recorded"))
    assert page.get_attribute("#voice-record", "aria-pressed") == "false"
    assert page.is_visible("#voice-preview")
    page.fill("#voice-name", "beep")
    page.click("#voice-create")
    _expect(page.locator("#voice-status")).to_contain_text("is ready", timeout=TIMEOUT_MS)
    _expect(page.locator("#voice-list")).to_contain_text("beep")
    page.locator("#voice-list li", has_text="beep").get_by_role("button", name="Delete").click()
    _expect(page.locator("#voice-list")).not_to_contain_text("beep")
    assert v.errors == [], v.errors


def test_a_model_not_loaded_yet_gets_its_controls_once_it_has_spoken(visit, model_dirs,
                                                                     tmp_path):
    """With --max-loaded 1 the second model loads on its first request: until then it has no
    card, and the page offers the plain controls; after speaking, its own."""
    config = ServeConfig(models={"toy": str(model_dirs / "toy"), "later": str(model_dirs / "toy")},
                         voices_dir=tmp_path / "voices", max_loaded=1)
    with serve_in_thread(config) as url:
        v = visit(url=url)
        page = v.open()
        page.select_option("#speak-model", "later")
        _expect(page.locator("#speak-model-about")).to_contain_text("not loaded yet")
        assert page.is_hidden("#speak-params")
        _set_speak(page, model="later", text="Now.", seed=2)
        _speak_and_wait(page)
        _expect(page.locator("#speak-model-about")).to_contain_text("toy · 16000 Hz")
        assert page.is_visible("#speak-params")
        assert v.errors == [], v.errors


def _wave_rows(page, canvas: str) -> float:
    """The share of the canvas's height the drawn waveform spans (its painted rows)."""
    return page.evaluate("""(selector) => {
        const canvas = document.querySelector(selector);
        const { width, height } = canvas;
        const data = canvas.getContext("2d").getImageData(0, 0, width, height).data;
        let top = height, bottom = -1;
        for (let y = 0; y < height; y += 1) {
            for (let x = 0; x < width; x += 1) {
                if (data[(y * width + x) * 4 + 3] > 0) { top = Math.min(top, y); bottom = y; break; }
            }
        }
        return bottom < 0 ? 0 : (bottom - top + 1) / height;
    }""", canvas)


def test_a_random_models_whole_answer_says_what_it_is_and_what_cut_it(visit, server):
    """VoxCPM2's random model, not streamed, on its directory's defaults (max_len 24: 3.84 s):
    the badge says random-init, the time runs while it works, the note names the default that
    cut it, the player seeks over the whole audio, and focus moves from Speak to Stop and
    back."""
    v = visit()
    page = v.open()
    page.select_option("#speak-model", "vox")
    assert page.is_visible("#speak-model-badge")
    assert "random-init" in page.inner_text("#speak-model-badge").lower()
    page.select_option("#speak-model", "toy")
    assert page.is_hidden("#speak-model-badge")
    _set_speak(page, model="vox", text="All at once.", seed=4, steps=2)
    page.uncheck("#speak-stream")
    bodies = []
    page.on("request", lambda r: r.url.endswith("/v1/audio/speech") and bodies.append(
        json.loads(r.post_data)))
    page.focus("#speak-go")
    page.keyboard.press("Enter")
    _expect(page.locator("#speak-status")).to_have_text(
        re.compile(r"^Speaking with vox… \d+\.\d s$"))
    assert page.evaluate("document.activeElement.id") == "speak-stop"
    _expect(page.locator("#speak-status")).to_have_text(re.compile("^Spoke"), timeout=TIMEOUT_MS)
    assert page.evaluate("document.activeElement.id") == "speak-go"
    assert bodies[0]["mizuoto"]["stream"] is False and "params" not in bodies[0]["mizuoto"]
    # not streamed: it plays once the whole answer is in, as one buffer
    played, reads = v.played(), v.reads()
    assert len(played) == 1 and played[0]["at"] >= reads[-1]["at"]
    expected = _api_pcm(server, {"model": "vox", "voice": "default", "input": "All at once.",
                                 "mizuoto": {"seed": 4, "steps": 2, "stream": False}})
    assert np.array_equal(_int16(played[0]["samples"]), expected)
    seconds = len(expected) / 24000
    assert seconds == pytest.approx(3.84, abs=0.01)
    note = page.inner_text("#speak-defaults")
    assert "max_len=24" in note and "retry_badcase=false" in note and "3.84 s" in note
    assert "whole" in page.inner_text("#speak-facts")
    # the seekable player holds the same audio
    player = page.locator("#speak-audio")
    assert player.is_visible()
    _until(page, "document.querySelector('#speak-audio').readyState >= 1")
    assert page.evaluate("document.querySelector('#speak-audio').duration") == pytest.approx(
        seconds, abs=0.01)
    page.evaluate("document.querySelector('#speak-audio').currentTime = 2.5")
    _until(page, "document.querySelector('#speak-audio').currentTime > 2.4")
    page.click("#tab-history")
    _until(page, "document.querySelector('#history-list audio').readyState >= 1")
    assert page.evaluate("document.querySelector('#history-list audio').duration") == (
        pytest.approx(seconds, abs=0.01))
    assert v.errors == [], v.errors


def test_quiet_audio_is_drawn_to_its_peak_and_the_peak_said(visit, server):
    """F5's random model is quiet: its waveform fills the canvas, and the caption gives the
    true peak."""
    v = visit()
    page = v.open()
    _set_speak(page, model="f5", text="Quiet.", seed=6, steps=F5_STEPS)
    _speak_and_wait(page)
    expected = _api_pcm(server, {"model": "f5", "voice": "default", "input": "Quiet.",
                                 "mizuoto": {"seed": 6, "steps": F5_STEPS}})
    peak = np.abs(expected.astype(np.int32)).max() / 32768
    assert peak < 0.5  # quiet: unscaled, it would fill less than half the height
    caption = page.inner_text("#speak-wave-scale")
    assert f"Peak {peak:.3f}" in caption and "drawn ×" in caption
    page.wait_for_timeout(100)  # the last frame is drawn
    assert _wave_rows(page, "#speak-wave") > 0.9


def test_speak_clones_the_voice_of_a_clip_given_in_its_own_view(visit, server, tmp_path):
    v = visit()
    page = v.open()
    _set_speak(page, model="toy", text="In my voice.", seed=8)
    page.set_input_files("#speak-ref-file", str(_clip(tmp_path / "me.wav")))
    assert page.is_visible("#speak-ref-preview")
    page.fill("#speak-ref-text", "Hello there.")
    _speak_and_wait(page)
    voice = page.locator("#speak-facts dt:text-is('Voice') + dd").inner_text()
    assert voice.startswith("clip-")
    assert page.input_value("#speak-voice") == voice
    played = np.concatenate([_int16(p["samples"]) for p in v.played()])
    expected = _api_pcm(server, {"model": "toy", "voice": voice, "input": "In my voice.",
                                 "mizuoto": {"seed": 8}})
    assert np.array_equal(played, expected)
    # the same clip again is the same voice, not another
    _speak_and_wait(page)
    voices = [e["id"] for e in httpx.get(f"{server}/v1/audio/voices").json()["voices"]]
    assert voices.count(voice) == 1
    httpx.delete(f"{server}/v1/audio/voices/{voice}")
    assert v.errors == [], v.errors



def test_adapters_are_listed_under_their_base_model_and_speak(visit, model_dirs, tmp_path):
    """``serve --lora-dir``: each adapter after its base model in the selects and the header,
    and speaking with one works as with a model."""
    import mizuoto
    from mizuoto.adapters import write_random_adapter

    base = mizuoto.load(model_dirs / "toy")
    for name, seed in (("calm", 1), ("bright", 2)):
        write_random_adapter(base, tmp_path / "loras" / name, seed)
    config = _config(model_dirs, tmp_path / "voices", lora_dirs=[str(tmp_path / "loras")])
    with serve_in_thread(config) as url:
        page = visit(url=url).open()
        _expect(page.locator("#server-state")).to_have_text(
            "Serving 3 models: f5, vox, toy (LoRA: bright, calm)")
        labels = page.locator("#speak-model option").all_inner_texts()
        assert labels[-3:] == ["toy (toy)", "bright (LoRA on toy)", "calm (LoRA on toy)"]
        _set_speak(page, model="calm", text="Hello.", seed=1)
        _speak_and_wait(page)
