// Mizuoto studio: speak, voices, A/B compare and history against this server's API.
// Plain ES module, no dependencies: playback streams the raw `pcm` response (16-bit
// little-endian mono at the card's pcm_sample_rate) through Web Audio, chunk by chunk.

const KEY_STORAGE = "mizuoto.api-key";
const DEFAULT_FORMATS = ["wav", "mp3", "opus", "flac", "aac", "pcm"];
const DEFAULT_MAX_CHARS = 4096;
const PCM_RATE = 24000;
const LEAD_SECONDS = 0.05; // scheduled this far ahead so that the first chunk starts cleanly
const MAX_SEED = 4294967295;
const HISTORY_LIMIT = 50; // utterances kept (their audio stays in memory)

const $ = (id) => document.getElementById(id);

const studio = {
  models: [],
  cards: new Map(), // model id -> its card (GET /v1/models' "mizuoto" key), null if unknown
  voices: new Map(), // model id -> Promise of its voices
  settings: new Map(), // model id -> its Speak settings, kept while another model is shown
  key: sessionStorage.getItem(KEY_STORAGE),
  context: null,
  history: [],
  playing: null,
  clip: null, // the voice clip to upload: {blob, name}
};

// ---------------------------------------------------------------- the API, with its key

class ApiError extends Error {
  constructor(status, message, param, code) {
    super(message);
    this.status = status;
    this.param = param;
    this.code = code;
  }
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  let param = null;
  let code = null;
  try {
    const body = await response.json();
    if (body && body.error) ({ message, param, code } = body.error);
  } catch {
    // not JSON (a proxy's page): the status line says it
  }
  return new ApiError(response.status, message, param, code);
}

let keyPrompt = null;

/** Ask for the key (again: ``refused``); resolves once one is entered. Closing the prompt
 * (Cancel, Escape) leaves the page waiting: the "API key" button opens it again. */
function askForKey(refused) {
  const dialog = $("key-dialog");
  $("key-open").hidden = false;
  $("server-state").textContent = "Waiting for the API key…";
  if (!dialog.open) dialog.showModal();
  $("key-input").focus();
  if (keyPrompt) return keyPrompt;
  $("key-error").textContent = refused ? "The server refused this key: check it and try again." : "";
  $("key-input").value = "";
  keyPrompt = new Promise((resolve) => {
    $("key-form").onsubmit = (event) => {
      const key = $("key-input").value.trim();
      if (!key) {
        event.preventDefault();
        $("key-error").textContent = "Enter the key the server was started with (--api-key).";
        return;
      }
      studio.key = key;
      sessionStorage.setItem(KEY_STORAGE, key);
      keyPrompt = null;
      resolve();
    };
  });
  return keyPrompt;
}

async function api(path, init = {}) {
  for (;;) {
    const headers = new Headers(init.headers || {});
    if (studio.key) headers.set("Authorization", `Bearer ${studio.key}`);
    const response = await fetch(path, { ...init, headers });
    if (response.status === 401) {
      const refused = Boolean(studio.key);
      studio.key = null;
      sessionStorage.removeItem(KEY_STORAGE);
      await askForKey(refused);
      continue;
    }
    if (!response.ok) throw await errorOf(response);
    return response;
  }
}

// ---------------------------------------------------------------- audio

function audioContext() {
  if (!studio.context) studio.context = new AudioContext();
  if (studio.context.state === "suspended") studio.context.resume();
  return studio.context;
}

/** Plays 16-bit PCM blocks back to back as they come, from the first one. */
class Player {
  constructor(rate) {
    this.context = audioContext();
    this.rate = rate;
    this.next = 0;
    this.sources = [];
    this.firstSound = null; // performance.now() time at which the first block sounds
  }

  push(block) {
    if (!block.length) return;
    const buffer = this.context.createBuffer(1, block.length, this.rate);
    const data = buffer.getChannelData(0);
    for (let i = 0; i < block.length; i += 1) data[i] = block[i] / 32768;
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    const now = this.context.currentTime;
    const when = Math.max(this.next, now + LEAD_SECONDS);
    source.start(when);
    if (this.firstSound === null) this.firstSound = performance.now() + (when - now) * 1000;
    this.next = when + buffer.duration;
    this.sources.push(source);
  }

  stop() {
    for (const source of this.sources) {
      try { source.stop(); } catch { /* not started yet or already ended */ }
    }
    this.sources = [];
  }
}

/** A player for the next sound; whatever was playing stops. */
function freshPlayer(rate) {
  if (studio.playing) studio.playing.stop();
  for (const element of document.querySelectorAll("audio.player")) element.pause();
  studio.playing = new Player(rate);
  return studio.playing;
}

function play(pcm, rate) {
  const player = freshPlayer(rate);
  player.push(pcm);
  return player;
}

/** Joined 16-bit blocks. */
function joined(blocks) {
  const total = blocks.reduce((n, block) => n + block.length, 0);
  const out = new Int16Array(total);
  let offset = 0;
  for (const block of blocks) {
    out.set(block, offset);
    offset += block.length;
  }
  return out;
}

/** A WAV file (16-bit mono) holding ``pcm``. */
function wavBlob(pcm, rate) {
  const header = new DataView(new ArrayBuffer(44));
  const text = (offset, value) => [...value].forEach((c, i) => header.setUint8(offset + i, c.charCodeAt(0)));
  text(0, "RIFF");
  header.setUint32(4, 36 + pcm.length * 2, true);
  text(8, "WAVE");
  text(12, "fmt ");
  header.setUint32(16, 16, true);
  header.setUint16(20, 1, true);
  header.setUint16(22, 1, true);
  header.setUint32(24, rate, true);
  header.setUint32(28, rate * 2, true);
  header.setUint16(32, 2, true);
  header.setUint16(34, 16, true);
  text(36, "data");
  header.setUint32(40, pcm.length * 2, true);
  return new Blob([header.buffer, pcm.buffer], { type: "audio/wav" });
}

function toInt16(samples) {
  const out = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i += 1) {
    out[i] = Math.max(-32768, Math.min(32767, Math.round(samples[i] * 32767)));
  }
  return out;
}

/** Show ``pcm`` in the seekable ``<audio>`` element (its timeline: a WAV blob). */
function showPlayer(element, pcm, rate) {
  showBlob(element, wavBlob(pcm, rate));
}

function showBlob(element, blob) {
  if (element.src) URL.revokeObjectURL(element.src);
  element.src = URL.createObjectURL(blob);
  element.hidden = false;
}

function hidePlayer(element) {
  element.pause();
  if (element.src) URL.revokeObjectURL(element.src);
  element.removeAttribute("src");
  element.hidden = true;
}

function save(blob, name) {
  const url = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = url;
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// ---------------------------------------------------------------- waveform

/** A waveform drawn scaled to its peak (a quiet model's audio would be a flat line beside a
 * loud one's); ``caption`` says the true peak and the scale. */
class Wave {
  constructor(canvas, rate, caption = null) {
    this.canvas = canvas;
    this.caption = caption;
    this.rate = rate;
    this.blocks = [];
    this.length = 0;
    this.peak = 0; // of |sample| / 32768
    this.pending = false;
    this.draw();
  }

  add(block) {
    this.blocks.push(block);
    this.length += block.length;
    for (let i = 0; i < block.length; i += 1) {
      const value = Math.abs(block[i]) / 32768;
      if (value > this.peak) this.peak = value;
    }
    if (!this.pending) {
      this.pending = true;
      requestAnimationFrame(() => { this.pending = false; this.draw(); });
    }
  }

  draw() {
    const canvas = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    // the drawn size in device pixels (a hidden canvas keeps its own)
    const width = canvas.clientWidth ? Math.round(canvas.clientWidth * ratio) : canvas.width;
    const height = canvas.clientHeight ? Math.round(canvas.clientHeight * ratio) : canvas.height;
    if (canvas.width !== width) canvas.width = width;
    if (canvas.height !== height) canvas.height = height;
    const style = getComputedStyle(document.documentElement);
    const g = canvas.getContext("2d");
    g.clearRect(0, 0, width, height);
    g.fillStyle = style.getPropertyValue("--wave-axis").trim() || "#999";
    g.fillRect(0, Math.floor(height / 2), width, Math.max(1, ratio));
    this.describe();
    if (!this.length) return;
    const scale = this.peak > 0 ? 1 / this.peak : 1;
    // at least five seconds across, so that a stream grows from the left as it comes
    const span = Math.max(this.length, this.rate * 5);
    const perColumn = span / width;
    const columns = Math.ceil(this.length / perColumn);
    const low = new Float32Array(columns).fill(1);
    const high = new Float32Array(columns).fill(-1);
    let index = 0;
    for (const block of this.blocks) {
      for (let i = 0; i < block.length; i += 1, index += 1) {
        const column = Math.floor(index / perColumn);
        const value = block[i] / 32768;
        if (value < low[column]) low[column] = value;
        if (value > high[column]) high[column] = value;
      }
    }
    g.fillStyle = style.getPropertyValue("--wave").trim() || "#06c";
    const middle = height / 2;
    for (let x = 0; x < columns; x += 1) {
      const top = middle - high[x] * scale * middle;
      const bottom = middle - low[x] * scale * middle;
      g.fillRect(x, top, 1, Math.max(1, bottom - top));
    }
  }

  describe() {
    this.canvas.dataset.peak = String(this.peak);
    if (!this.caption) return;
    if (!this.length || this.peak === 0) {
      this.caption.textContent = this.length ? "Silent: every sample is 0." : "";
      return;
    }
    const db = 20 * Math.log10(this.peak);
    const scale = 1 / this.peak;
    this.caption.textContent = `Peak ${this.peak.toFixed(3)} (${db.toFixed(1)} dBFS)`
      + (scale > 1.05 ? `, drawn ×${scale.toFixed(1)} to fit` : "");
  }
}

// ---------------------------------------------------------------- models, voices, cards

function card(model) {
  return studio.cards.get(model) || null;
}

function pcmRate(model) {
  return (card(model) && card(model).pcm_sample_rate) || PCM_RATE;
}

function can(model, capability) {
  const c = card(model);
  return Boolean(c && c.capabilities.includes(capability));
}

function fillSelect(select, items, keep = true) {
  const previous = select.value;
  select.replaceChildren(...items.map(({ value, label }) => new Option(label, value)));
  if (keep && items.some((item) => item.value === previous)) select.value = previous;
}

async function loadModels() {
  const body = await (await api("/v1/models")).json();
  studio.models = body.data.map((entry) => entry.id);
  for (const entry of body.data) studio.cards.set(entry.id, entry.mizuoto || null);
  const items = body.data.map((entry) => ({
    value: entry.id,
    label: entry.mizuoto ? `${entry.id} (${entry.mizuoto.engine})` : entry.id,
  }));
  for (const id of ["speak-model", "voice-model", "compare-a-model", "compare-b-model"]) {
    fillSelect($(id), items);
  }
  if (studio.models.length > 1 && $("compare-b-model").value === $("compare-a-model").value) {
    $("compare-b-model").value = studio.models[1];
  }
  const names = studio.models.join(", ");
  $("server-state").textContent = studio.models.length
    ? `Serving ${studio.models.length} model${studio.models.length > 1 ? "s" : ""}: ${names}`
    : "This server serves no model.";
}

/** Read the cards again (a model loaded on its first request has one only then). */
async function refreshCards() {
  try {
    await loadModels();
    applyCard();
  } catch {
    // the page keeps the cards it has
  }
}

function voicesOf(model, fresh = false) {
  if (fresh || !studio.voices.has(model)) {
    const query = `/v1/audio/voices?model=${encodeURIComponent(model)}`;
    const voices = api(query).then((r) => r.json()).then((body) => body.voices);
    voices.catch(() => studio.voices.delete(model));
    studio.voices.set(model, voices);
  }
  return studio.voices.get(model);
}

async function fillVoices(modelSelect, voiceSelect, fresh = false) {
  const model = modelSelect.value;
  if (!model) return;
  try {
    const voices = await voicesOf(model, fresh);
    if (modelSelect.value !== model) return; // changed meanwhile
    fillSelect(voiceSelect, voices.map((v) => ({ value: v.id, label: v.name })));
  } catch (error) {
    fillSelect(voiceSelect, [{ value: "default", label: "default" }]);
    voiceSelect.setAttribute("title", error.message);
  }
}

function forgetVoices() {
  studio.voices.clear();
}

// ---------------------------------------------------------------- speech requests

function licenseNotice(model) {
  const c = card(model);
  if (!c || !c.non_commercial) return null;
  return `Non-commercial use only: the ${model} weights are licensed ${c.license || "for non-commercial use"}.`;
}

function showLicense(element, model) {
  const notice = licenseNotice(model);
  element.textContent = notice || "";
  element.hidden = !notice;
}

/**
 * Stream ``body`` as `pcm`: ``onBlock(int16Block)`` for each block as it arrives.
 * Resolves to what was received and when (performance.now() times).
 */
async function speak(body, { onBlock, signal } = {}) {
  const started = performance.now();
  const response = await api("/v1/audio/speech", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ ...body, response_format: "pcm" }),
    signal,
  });
  const seed = Number(response.headers.get("X-Mizuoto-Seed"));
  const warning = response.headers.get("X-Mizuoto-Warning");
  const reader = response.body.getReader();
  const blocks = [];
  let carry = null; // an odd byte left from the previous read
  let firstByte = null;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (firstByte === null) firstByte = performance.now();
    let bytes = value;
    if (carry !== null) {
      bytes = new Uint8Array(value.length + 1);
      bytes[0] = carry;
      bytes.set(value, 1);
      carry = null;
    }
    const even = bytes.length - (bytes.length % 2);
    if (even < bytes.length) carry = bytes[even];
    if (!even) continue;
    const block = new Int16Array(even / 2);
    new Uint8Array(block.buffer).set(bytes.subarray(0, even));
    blocks.push(block);
    if (onBlock) onBlock(block);
  }
  const finished = performance.now();
  return { pcm: joined(blocks), seed, warning, started, firstByte, finished };
}

function seconds(ms) {
  return `${(ms / 1000).toFixed(2)} s`;
}

function showFacts(list, facts) {
  list.replaceChildren(...facts.filter(([, value]) => value !== null && value !== undefined && value !== "")
    .map(([term, value]) => {
      const item = document.createElement("div");
      const dt = document.createElement("dt");
      const dd = document.createElement("dd");
      dt.textContent = term;
      dd.textContent = String(value);
      item.append(dt, dd);
      return item;
    }));
}

function outcome(result, rate) {
  const duration = result.pcm.length / rate;
  return {
    duration,
    rtf: duration > 0 ? (result.finished - result.started) / 1000 / duration : null,
  };
}

function remember(entry) {
  studio.history.unshift({ ...entry, url: URL.createObjectURL(wavBlob(entry.pcm, entry.rate)) });
  for (const dropped of studio.history.splice(HISTORY_LIMIT)) URL.revokeObjectURL(dropped.url);
  renderHistory();
}

// ---------------------------------------------------------------- Speak

const speakState = { controller: null, last: null };

/** The Speak view's settings, read as the controls of ``model`` (the one shown). */
function speakSettings(model = $("speak-model").value) {
  const c = card(model);
  const number = (id) => {
    const raw = $(id).value.trim();
    return raw === "" ? null : Number(raw);
  };
  const settings = { seed: number("speak-seed"), steps: null, guidance: null, params: {} };
  if (c && "steps" in c.sampler) settings.steps = number("speak-steps");
  if (c && "guidance" in c.sampler) settings.guidance = number("speak-guidance");
  for (const input of $("speak-params-fields").querySelectorAll("[data-param]")) {
    const { param, kind, fallback } = input.dataset;
    let value;
    if (kind === "bool") {
      value = input.checked;
      if (String(value) === fallback) continue;
    } else {
      const raw = input.value.trim();
      if (raw === "") continue;
      value = kind === "str" ? raw : Number(raw);
      if (String(value) === fallback) continue;
    }
    settings.params[param] = value;
  }
  return settings;
}

function speechBody(model, voice, text, settings, instructions, stream = true) {
  const extension = {};
  if (!stream) extension.stream = false;
  if (settings.seed !== null) extension.seed = settings.seed;
  if (settings.steps !== null) extension.steps = settings.steps;
  if (settings.guidance !== null) extension.guidance = settings.guidance;
  if (Object.keys(settings.params).length) extension.params = settings.params;
  const body = { model, voice, input: text, mizuoto: extension };
  if (instructions) body.instructions = instructions;
  return body;
}

function applyCard() {
  keepSettings();
  const model = $("speak-model").value;
  const c = card(model);
  const about = [];
  if (c) {
    about.push(`${c.engine} · ${c.sample_rate} Hz`);
    about.push(c.streams ? "streams as it speaks" : "answers with the whole audio");
    if (c.license) about.push(c.license + (c.non_commercial ? " (non-commercial)" : ""));
  } else if (model) {
    about.push("not loaded yet: settings appear once it is");
  }
  $("speak-model-about").textContent = about.join(" · ");
  $("speak-model-badge").hidden = !(c && c.random_init);
  $("speak-instructions-field").hidden = !can(model, "design");
  for (const name of ["steps", "guidance"]) {
    const shown = Boolean(c && name in c.sampler);
    $(`speak-${name}-field`).hidden = !shown;
    if (shown) {
      $(`speak-${name}`).placeholder = String(c.sampler[name]);
      $(`speak-${name}-hint`).textContent = `Default: ${c.sampler[name]}`;
    }
  }
  const formats = (c && c.formats) || DEFAULT_FORMATS;
  fillSelect($("speak-format"), formats.map((f) => ({ value: f, label: f })));
  buildParams(c);
  showSettings(model);
  countText();
}

function buildParams(c) {
  const holder = $("speak-params-fields");
  const params = (c && c.params.filter((p) => p.kind)) || [];
  holder.replaceChildren(...params.map((p) => {
    const field = document.createElement("div");
    field.className = "field";
    const id = `speak-param-${p.name}`;
    const label = document.createElement("label");
    label.htmlFor = id;
    label.textContent = p.name;
    const input = document.createElement("input");
    input.id = id;
    input.dataset.param = p.name;
    input.dataset.kind = p.kind;
    input.dataset.fallback = String(p.default);
    if (p.kind === "bool") {
      input.type = "checkbox";
      input.checked = Boolean(p.default);
    } else {
      input.type = p.kind === "str" ? "text" : "number";
      if (p.kind === "float") input.step = "any";
      input.placeholder = String(p.default);
    }
    const hint = document.createElement("p");
    hint.className = "hint";
    hint.textContent = `Default: ${p.default}${p.model_default ? " (this model's)" : ""}`;
    field.append(label, input, hint);
    return field;
  }));
  $("speak-params").hidden = params.length === 0;
}

function maxChars(model) {
  const c = card(model);
  return (c && c.max_input_chars) || DEFAULT_MAX_CHARS;
}

function countText() {
  const text = $("speak-text").value;
  const limit = maxChars($("speak-model").value);
  const count = $("speak-text-count");
  count.textContent = `${text.length} / ${limit} characters`;
  count.classList.toggle("over", text.length > limit);
}

const SPEAK_FIELDS = {
  input: "speak-text", instructions: "speak-instructions", voice: "speak-voice",
  model: "speak-model", "mizuoto.seed": "speak-seed", "mizuoto.steps": "speak-steps",
  "mizuoto.guidance": "speak-guidance",
};

function clearErrors(root) {
  for (const element of root.querySelectorAll(".error")) element.textContent = "";
  for (const element of root.querySelectorAll("[aria-invalid]")) element.removeAttribute("aria-invalid");
}

/** Show ``error`` next to the field its ``param`` names (``fields``: param -> input id). */
function showError(error, fields, fallback) {
  let id = error.param && fields[error.param];
  if (!id && error.param && error.param.startsWith("mizuoto.params")) id = "speak-params";
  const target = id ? $(`${id}-error`) : null;
  if (target) {
    target.textContent = error.message;
    const input = $(id);
    if (input && input.setAttribute) input.setAttribute("aria-invalid", "true");
    if (id === "speak-params") $("speak-params").open = true;
  } else {
    $(fallback).textContent = error.message;
  }
}

/** The model directory's defaults a request with ``params`` took, as ``name=value``. */
function takenDefaults(model, params) {
  const c = card(model);
  if (!c) return [];
  return c.params.filter((p) => p.model_default && !(p.name in params))
    .map((p) => `${p.name}=${JSON.stringify(p.default)}`);
}

/** Say which of the model directory's defaults limited the result (as `mizuoto say` does). */
function showDefaults(element, model, params, duration) {
  const taken = takenDefaults(model, params);
  let note = "";
  if (taken.length) {
    note = `With this model directory's defaults: ${taken.join(", ")} (Engine settings override them).`;
    const c = card(model);
    if (c && c.random_init) {
      note += ` A random-init model never ends speech by itself: its length cap cut this audio at ${duration.toFixed(2)} s.`;
    }
  }
  element.textContent = note;
  element.hidden = !note;
}

// the Speak view's reference fields, and what the server calls them
const REFERENCE_FIELDS = {
  audio: "speak-ref-file", "reference.audio": "speak-ref-file", name: "speak-ref-file",
  text: "speak-ref-text", "reference.text": "speak-ref-text", model: "speak-model",
};

/** The voice of the Speak view's reference clip for ``model``, built (once per clip, text and
 * model: its name is their digest) and kept as a voice; null without a clip. */
async function referenceVoice(model) {
  const file = $("speak-ref-file").files[0];
  if (!file) return null;
  const text = $("speak-ref-text").value;
  const bytes = await file.arrayBuffer();
  const keyed = await new Blob([`${model}\n${text}\n`, bytes]).arrayBuffer();
  const digest = await crypto.subtle.digest("SHA-256", keyed);
  const hex = [...new Uint8Array(digest).slice(0, 6)].map((b) => b.toString(16).padStart(2, "0")).join("");
  const name = `clip-${hex}`;
  const known = await voicesOf(model).catch(() => []);
  if (known.some((voice) => voice.id === name)) return name;
  const form = new FormData();
  form.append("name", name);
  form.append("model", model);
  form.append("text", text);
  form.append("audio", file, file.name);
  await api("/v1/audio/voices", { method: "POST", body: form });
  forgetVoices();
  await refreshVoiceSelects();
  return name;
}

async function onSpeak(event) {
  event.preventDefault();
  clearErrors($("view-speak"));
  const model = $("speak-model").value;
  const text = $("speak-text").value;
  if (!text.trim()) {
    $("speak-text-error").textContent = "Type the words to speak.";
    $("speak-text").focus();
    return;
  }
  const limit = maxChars(model);
  if (text.length > limit) {
    $("speak-text-error").textContent = `At most ${limit} characters: this text has ${text.length}. Split it.`;
    $("speak-text").focus();
    return;
  }
  const settings = speakSettings();
  const instructions = can(model, "design") ? $("speak-instructions").value.trim() : "";
  const streamed = $("speak-stream").checked;
  const rate = pcmRate(model);
  const player = freshPlayer(rate);
  const wave = new Wave($("speak-wave"), rate, $("speak-wave-scale"));
  const controller = new AbortController();
  speakState.controller = controller;
  // the Speak button is disabled while it works: focus on it moves to Stop, not to <body>
  const focused = document.activeElement === $("speak-go");
  $("speak-stop").disabled = false;
  if (focused) $("speak-stop").focus();
  $("speak-go").disabled = true;
  $("speak-replay").disabled = true;
  $("speak-download").disabled = true;
  $("speak-warnings").hidden = true;
  $("speak-defaults").hidden = true;
  hidePlayer($("speak-audio"));
  $("speak-facts").replaceChildren();
  showLicense($("speak-license"), model);
  const started = performance.now();
  let doing = `Speaking with ${model}…`;
  const tick = () => {
    $("speak-status").textContent = `${doing} ${((performance.now() - started) / 1000).toFixed(1)} s`;
  };
  tick();
  const timer = setInterval(tick, 100);
  try {
    let voice = $("speak-voice").value || "default";
    if ($("speak-ref-file").files.length) {
      doing = `Building a voice from the clip for ${model}…`;
      tick();
      try {
        voice = await referenceVoice(model);
      } catch (error) {
        error.fields = REFERENCE_FIELDS;
        throw error;
      }
      $("speak-voice").value = voice;
      doing = `Speaking with ${model}…`;
    }
    const body = speechBody(model, voice, text, settings, instructions, streamed);
    const result = await speak(body, {
      signal: controller.signal,
      onBlock: (block) => {
        if (streamed) player.push(block);
        wave.add(block);
      },
    });
    if (!streamed) player.push(result.pcm);
    clearInterval(timer);
    const { duration, rtf } = outcome(result, rate);
    const ttfa = player.firstSound === null ? null : player.firstSound - result.started;
    const c = card(model);
    const applied = {
      steps: settings.steps ?? (c && c.sampler.steps),
      guidance: settings.guidance ?? (c && c.sampler.guidance),
    };
    showFacts($("speak-facts"), [
      ["Seed used", result.seed],
      ["Voice", voice],
      ["Time to first audio", ttfa === null ? null : seconds(ttfa)],
      ["Real-time factor", rtf === null ? null : rtf.toFixed(2)],
      ["Duration", `${duration.toFixed(2)} s`],
      ["Steps", applied.steps],
      ["Guidance", applied.guidance],
      ["Delivery", streamed ? "streamed" : "whole"],
    ]);
    if (result.warning) {
      $("speak-warnings").textContent = `The server says: ${result.warning}`;
      $("speak-warnings").hidden = false;
    }
    showDefaults($("speak-defaults"), model, settings.params, duration);
    showPlayer($("speak-audio"), result.pcm, rate);
    $("speak-status").textContent = `Spoke ${duration.toFixed(2)} s with ${model}, seed ${result.seed}.`;
    if (!card(model)) refreshCards(); // it has loaded now: its controls can show
    speakState.last = { body: { ...body, mizuoto: { ...body.mizuoto, seed: result.seed } }, pcm: result.pcm, rate, model };
    $("speak-replay").disabled = false;
    $("speak-download").disabled = false;
    $("speak-download").textContent = downloadLabel();
    remember({
      when: new Date(), text, model, voice, seed: result.seed, instructions,
      settings: { ...applied, params: settings.params }, ttfa, rtf, duration, pcm: result.pcm, rate,
    });
  } catch (error) {
    player.stop();
    if (error.name === "AbortError") {
      $("speak-status").textContent = "Stopped.";
    } else {
      $("speak-status").textContent = "The server could not speak this.";
      showError(error, error.fields || SPEAK_FIELDS, "speak-error");
    }
  } finally {
    clearInterval(timer);
    speakState.controller = null;
    $("speak-go").disabled = false;
    const lost = document.activeElement === $("speak-stop") || document.activeElement === document.body;
    $("speak-stop").disabled = true;
    if (lost) $("speak-go").focus();
  }
}

function downloadLabel() {
  return `Download ${$("speak-format").value.toUpperCase()}`;
}

async function onDownload() {
  const last = speakState.last;
  if (!last) return;
  const format = $("speak-format").value;
  const name = `mizuoto-${last.model}-${last.body.mizuoto.seed}.${format}`;  // opus: Ogg Opus
  const button = $("speak-download");
  button.disabled = true;
  $("speak-status").textContent = `Making the ${format} file (same seed)…`;
  try {
    let blob;
    if (format === "pcm") {
      blob = new Blob([last.pcm.buffer], { type: "audio/pcm" });
    } else {
      const response = await api("/v1/audio/speech", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ ...last.body, response_format: format }),
      });
      blob = await response.blob();
    }
    save(blob, name);
    $("speak-status").textContent = `Saved ${name}.`;
  } catch (error) {
    $("speak-error").textContent = error.message;
  } finally {
    button.disabled = false;
  }
}

// ---------------------------------------------------------------- Voices

// the form's fields, and what the engine calls them (a Reference's audio and text)
const VOICE_FIELDS = {
  name: "voice-name", audio: "voice-audio", text: "voice-text", model: "voice-model",
  "reference.audio": "voice-audio", "reference.text": "voice-text",
};

function setClip(blob, name) {
  studio.clip = blob ? { blob, name } : null;
  if (blob) showBlob($("voice-preview"), blob);
  else hidePlayer($("voice-preview"));
}

const recording = { recorder: null, stream: null, started: 0, timer: null };

async function onRecord() {
  const button = $("voice-record");
  $("voice-audio-error").textContent = "";
  if (recording.recorder) {
    recording.recorder.stop();
    return;
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (error) {
    $("voice-audio-error").textContent = `The microphone is not available (${error.message}): upload a clip instead.`;
    return;
  }
  const recorder = new MediaRecorder(stream);
  const parts = [];
  recorder.ondataavailable = (event) => parts.push(event.data);
  recorder.onstop = async () => {
    clearInterval(recording.timer);
    stream.getTracks().forEach((track) => track.stop());
    recording.recorder = null;
    button.textContent = "Record";
    button.setAttribute("aria-pressed", "false");
    try {
      // the recorder's container (WebM) is not one the server reads: send WAV
      const decoded = await audioContext().decodeAudioData(await new Blob(parts).arrayBuffer());
      const samples = decoded.getChannelData(0);
      setClip(wavBlob(toInt16(samples), decoded.sampleRate), "recording.wav");
      $("voice-file").value = "";
      $("voice-record-state").textContent = `Recorded ${decoded.duration.toFixed(1)} s.`;
    } catch (error) {
      $("voice-audio-error").textContent = `The recording could not be read (${error.message}).`;
    }
  };
  recording.recorder = recorder;
  recording.started = performance.now();
  recorder.start();
  button.textContent = "Stop recording";
  button.setAttribute("aria-pressed", "true");
  recording.timer = setInterval(() => {
    $("voice-record-state").textContent = `Recording… ${seconds(performance.now() - recording.started)}`;
  }, 250);
}

async function onCreateVoice(event) {
  event.preventDefault();
  clearErrors($("voice-form"));
  $("voice-status").textContent = "";
  const model = $("voice-model").value;
  if (!studio.clip) {
    $("voice-audio-error").textContent = "Choose a clip or record one.";
    $("voice-file").focus();
    return;
  }
  const form = new FormData();
  form.append("name", $("voice-name").value.trim());
  form.append("model", model);
  form.append("text", $("voice-text").value);
  form.append("audio", studio.clip.blob, studio.clip.name);
  $("voice-create").disabled = true;
  $("voice-status").textContent = "Building the voice…";
  try {
    const created = await (await api("/v1/audio/voices", { method: "POST", body: form })).json();
    forgetVoices();
    await Promise.all([refreshVoiceSelects(), renderVoices()]);
    $("voice-status").textContent = `Voice ${created.name} is ready for ${created.model}.`;
  } catch (error) {
    $("voice-status").textContent = "";
    showError(error, VOICE_FIELDS, "voice-error");
  } finally {
    $("voice-create").disabled = false;
  }
}

async function refreshVoiceSelects() {
  await Promise.all([
    fillVoices($("speak-model"), $("speak-voice")),
    fillVoices($("compare-a-model"), $("compare-a-voice")),
    fillVoices($("compare-b-model"), $("compare-b-voice")),
  ]);
}

function button(label, onClick, describedBy) {
  const element = document.createElement("button");
  element.type = "button";
  element.textContent = label;
  if (describedBy) element.setAttribute("aria-describedby", describedBy);
  element.addEventListener("click", onClick);
  return element;
}

async function renderVoices(fresh = false) {
  const model = $("voice-model").value;
  $("voice-list-model").textContent = model;
  const canSave = !card(model) || can(model, "voice_cache");
  $("voice-create").disabled = !canSave;
  $("voice-model-error").textContent = canSave ? "" : `The ${model} model cannot save voices.`;
  if (!model) return;
  const list = $("voice-list");
  try {
    const voices = await voicesOf(model, fresh);
    list.replaceChildren(...voices.map((voice, index) => {
      const item = document.createElement("li");
      const what = document.createElement("span");
      what.className = "what";
      what.id = `voice-item-${index}`;
      what.textContent = voice.id === "default" ? "default (the model's own voice)" : voice.name;
      item.append(what, button("Hear", () => hearVoice(model, voice.id), what.id),
        button("Use in Speak", () => useVoice(model, voice.id), what.id));
      if (voice.id !== "default") item.append(button("Delete", () => deleteVoice(voice.id), what.id));
      return item;
    }));
  } catch (error) {
    $("voice-list-status").textContent = error.message;
  }
}

async function hearVoice(model, voice) {
  $("voice-list-status").textContent = `Speaking a sample with ${voice}…`;
  const rate = pcmRate(model);
  const player = freshPlayer(rate);
  try {
    const body = speechBody(model, voice, "This is how this voice sounds.", settingsFor(model), "");
    const result = await speak(body, { onBlock: (block) => player.push(block) });
    $("voice-list-status").textContent = `Played ${voice} (seed ${result.seed}).`;
  } catch (error) {
    $("voice-list-status").textContent = error.message;
  }
}

/** ``model``'s settings as the Speak view holds them (kept per model), without the seed. */
function settingsFor(model) {
  const settings = model === $("speak-model").value ? speakSettings() : studio.settings.get(model);
  return { steps: null, guidance: null, params: {}, ...settings, seed: null };
}

/** Keep the settings of the model the controls show (before they change to another). */
function keepSettings() {
  const shown = $("speak-model").dataset.shown;
  if (shown) studio.settings.set(shown, speakSettings(shown));
}

/** Show ``model``'s kept settings (its defaults the first time). */
function showSettings(model) {
  $("speak-model").dataset.shown = model;
  const saved = studio.settings.get(model) || { steps: null, guidance: null, params: {} };
  $("speak-steps").value = saved.steps ?? "";
  $("speak-guidance").value = saved.guidance ?? "";
  for (const input of $("speak-params-fields").querySelectorAll("[data-param]")) {
    if (!(input.dataset.param in saved.params)) continue;
    const value = saved.params[input.dataset.param];
    if (input.type === "checkbox") input.checked = value;
    else input.value = String(value);
  }
}

async function useVoice(model, voice) {
  $("speak-model").value = model;
  applyCard();
  await fillVoices($("speak-model"), $("speak-voice"));
  $("speak-voice").value = voice;
  selectTab($("tab-speak"), true);
}

async function deleteVoice(name) {
  try {
    await api(`/v1/audio/voices/${encodeURIComponent(name)}`, { method: "DELETE" });
    $("voice-list-status").textContent = `Deleted ${name}.`;
    forgetVoices();
    await Promise.all([refreshVoiceSelects(), renderVoices()]);
  } catch (error) {
    $("voice-list-status").textContent = error.message;
  }
}

// ---------------------------------------------------------------- Compare

const compared = { a: null, b: null };

async function onCompare(event) {
  event.preventDefault();
  const text = $("compare-text").value;
  $("compare-text-error").textContent = "";
  if (!text.trim()) {
    $("compare-text-error").textContent = "Type the words to speak.";
    return;
  }
  let seed = $("compare-seed").value.trim();
  seed = seed === "" ? crypto.getRandomValues(new Uint32Array(1))[0] : Number(seed);
  if (!Number.isInteger(seed) || seed < 0 || seed > MAX_SEED) {
    $("compare-status").textContent = `The seed must be a whole number from 0 to ${MAX_SEED}.`;
    return;
  }
  $("compare-go").disabled = true;
  try {
    for (const side of ["a", "b"]) {
      $("compare-status").textContent = `Generating ${side.toUpperCase()} (seed ${seed})…`;
      await compareSide(side, text, seed);
    }
    $("compare-status").textContent = `A and B used seed ${seed}.`;
  } finally {
    $("compare-go").disabled = false;
  }
}

async function compareSide(side, text, seed) {
  const panel = $(`compare-${side}`);
  const model = $(`compare-${side}-model`).value;
  const voice = $(`compare-${side}-voice`).value || "default";
  const rate = pcmRate(model);
  const wave = new Wave(panel.querySelector("canvas"), rate, panel.querySelector(".wave-scale"));
  const error = panel.querySelector(".error");
  hidePlayer(panel.querySelector("audio"));
  const play = panel.querySelector(".play");
  error.textContent = "";
  play.disabled = true;
  panel.querySelector("h2").textContent = `${side.toUpperCase()}: ${model} · ${voice}`;
  showLicense(panel.querySelector(".license"), model);
  panel.querySelector(".facts").replaceChildren();
  const settings = { ...settingsFor(model), seed };
  try {
    const result = await speak(speechBody(model, voice, text, settings, ""), { onBlock: (b) => wave.add(b) });
    const { duration, rtf } = outcome(result, rate);
    const firstData = result.firstByte === null ? null : result.firstByte - result.started;
    showFacts(panel.querySelector(".facts"), [
      ["Seed", result.seed],
      ["Time to first audio", firstData === null ? null : seconds(firstData)],
      ["Real-time factor", rtf === null ? null : rtf.toFixed(2)],
      ["Duration", `${duration.toFixed(2)} s`],
    ]);
    compared[side] = { pcm: result.pcm, rate };
    showPlayer(panel.querySelector("audio"), result.pcm, rate);
    play.disabled = false;
    const c = card(model);
    remember({
      when: new Date(), text, model, voice, seed: result.seed, instructions: "",
      settings: {
        steps: settings.steps ?? (c && c.sampler.steps),
        guidance: settings.guidance ?? (c && c.sampler.guidance),
        params: settings.params,
      },
      ttfa: firstData, rtf, duration, pcm: result.pcm, rate, compare: side.toUpperCase(),
    });
  } catch (failure) {
    error.textContent = failure.message;
  }
}

// ---------------------------------------------------------------- History

function describe(entry) {
  const parts = [entry.model, `voice ${entry.voice}`, `seed ${entry.seed}`];
  if (entry.settings.steps != null) parts.push(`steps ${entry.settings.steps}`);
  if (entry.settings.guidance != null) parts.push(`guidance ${entry.settings.guidance}`);
  for (const [name, value] of Object.entries(entry.settings.params || {})) parts.push(`${name} ${value}`);
  if (entry.instructions) parts.push(`described as “${entry.instructions}”`);
  parts.push(`${entry.duration.toFixed(2)} s`);
  if (entry.ttfa != null) parts.push(`first audio ${seconds(entry.ttfa)}`);
  if (entry.rtf != null) parts.push(`RTF ${entry.rtf.toFixed(2)}`);
  if (entry.compare) parts.push(`compare ${entry.compare}`);
  return parts.join(" · ");
}

function renderHistory() {
  $("history-count").textContent = String(studio.history.length);
  $("history-empty").hidden = studio.history.length > 0;
  $("history-list").replaceChildren(...studio.history.map((entry, index) => {
    const item = document.createElement("li");
    const what = document.createElement("div");
    what.className = "what";
    what.id = `history-item-${index}`;
    const quote = document.createElement("q");
    quote.textContent = entry.text;
    const about = document.createElement("span");
    about.className = "hint";
    about.textContent = `${entry.when.toLocaleTimeString()} · ${describe(entry)}`;
    what.append(quote, about);
    const notice = licenseNotice(entry.model);
    if (notice) {
      const license = document.createElement("p");
      license.className = "license";
      license.textContent = notice;
      what.append(license);
    }
    const name = `mizuoto-${entry.model}-${entry.seed}.wav`;
    const player = document.createElement("audio");
    player.className = "player";
    player.controls = true;
    player.preload = "metadata";
    player.src = entry.url;
    player.setAttribute("aria-describedby", what.id);
    item.append(what, player,
      button("Replay", () => play(entry.pcm, entry.rate), what.id),
      button("Download WAV", () => save(wavBlob(entry.pcm, entry.rate), name), what.id));
    return item;
  }));
}

// ---------------------------------------------------------------- tabs and start

function selectTab(tab, focus = false) {
  for (const other of document.querySelectorAll('[role="tab"]')) {
    const selected = other === tab;
    other.setAttribute("aria-selected", String(selected));
    other.tabIndex = selected ? 0 : -1;
    $(other.getAttribute("aria-controls")).hidden = !selected;
  }
  if (focus) tab.focus();
  if (tab.id === "tab-voices") renderVoices();
}

function wireTabs() {
  const tabs = [...document.querySelectorAll('[role="tab"]')];
  tabs.forEach((tab, index) => {
    tab.addEventListener("click", () => selectTab(tab));
    tab.addEventListener("keydown", (event) => {
      const moves = { ArrowRight: index + 1, ArrowLeft: index - 1, Home: 0, End: tabs.length - 1 };
      if (!(event.key in moves)) return;
      event.preventDefault();
      selectTab(tabs[(moves[event.key] + tabs.length) % tabs.length], true);
    });
  });
}

function wire() {
  wireTabs();
  $("speak-form").addEventListener("submit", onSpeak);
  $("speak-stop").addEventListener("click", () => {
    if (speakState.controller) speakState.controller.abort();
    if (studio.playing) studio.playing.stop();
  });
  $("speak-replay").addEventListener("click", () => {
    if (speakState.last) play(speakState.last.pcm, speakState.last.rate);
  });
  $("speak-download").addEventListener("click", onDownload);
  $("speak-format").addEventListener("change", () => {
    $("speak-download").textContent = downloadLabel();
  });
  $("speak-text").addEventListener("input", countText);
  $("speak-model").addEventListener("change", () => {
    applyCard();
    fillVoices($("speak-model"), $("speak-voice"));
  });
  for (const side of ["a", "b"]) {
    $(`compare-${side}-model`).addEventListener("change",
      () => fillVoices($(`compare-${side}-model`), $(`compare-${side}-voice`)));
    $(`compare-${side}`).querySelector(".play").addEventListener("click", () => {
      if (compared[side]) play(compared[side].pcm, compared[side].rate);
    });
  }
  $("compare-form").addEventListener("submit", onCompare);
  $("voice-form").addEventListener("submit", onCreateVoice);
  $("voice-model").addEventListener("change", () => {
    // what was chosen and said for the previous model does not carry over to this one
    clearErrors($("voice-form"));
    $("voice-status").textContent = "";
    $("voice-record-state").textContent = "";
    $("voice-file").value = "";
    setClip(null, "");
    renderVoices();
  });
  $("voice-record").addEventListener("click", onRecord);
  $("voice-file").addEventListener("change", () => {
    const file = $("voice-file").files[0];
    setClip(file || null, file ? file.name : "");
    $("voice-audio-error").textContent = "";
  });
  $("key-open").hidden = !studio.key;
  $("key-cancel").addEventListener("click", () => $("key-dialog").close());
  $("key-dialog").addEventListener("close", () => {
    if (keyPrompt) {
      $("server-state").textContent = "Not connected: this server needs its API key (the API key button asks for it).";
    }
  });
  // one sound at a time: a player starting stops the others and the Web Audio playback
  document.addEventListener("play", (event) => {
    if (studio.playing) studio.playing.stop();
    for (const element of document.querySelectorAll("audio")) {
      if (element !== event.target) element.pause();
    }
  }, true);
  $("speak-ref-file").addEventListener("change", () => {
    const file = $("speak-ref-file").files[0];
    const preview = $("speak-ref-preview");
    if (file) showBlob(preview, file);
    else hidePlayer(preview);
    $("speak-ref-file-error").textContent = "";
  });
  $("key-open").addEventListener("click", () => {
    const waiting = keyPrompt !== null; // a call is waiting for the key: it resumes by itself
    const entered = askForKey(false);
    if (!waiting) entered.then(start);
  });
}

async function start() {
  try {
    await loadModels();
  } catch (error) {
    $("server-state").textContent = `The server did not answer: ${error.message}`;
    return;
  }
  applyCard();
  await Promise.all([refreshVoiceSelects(), renderVoices()]);
  renderHistory();
  document.body.dataset.ready = "true";
}

wire();
start();
