// The Speak view.

import { api } from "./api.js";
import { freshPlayer, hidePlayer, save, showPlayer } from "./audio.js";
import { $, clearErrors, fillSelect, seconds, showError, showFacts } from "./dom.js";
import { remember } from "./history-view.js";
import { forgetVoices, refreshCards, refreshVoiceSelects, showLicense, voicesOf } from "./models.js";
import { outcome, speak, speechBody } from "./speech.js";
import { can, card, formats, maxChars, pcmRate, studio } from "./state.js";
import { Wave } from "./wave.js";

export const speakState = { controller: null, last: null };

/** The Speak view's settings, read as the controls of ``model`` (the one shown). */
export function speakSettings(model = $("speak-model").value) {
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

export function applyCard() {
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
  fillSelect($("speak-format"), formats(model).map((f) => ({ value: f, label: f })));
  buildParams(c);
  showSettings(model);
  countText();
}

export function buildParams(c) {
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

export function countText() {
  const text = $("speak-text").value;
  const limit = maxChars($("speak-model").value);
  const count = $("speak-text-count");
  count.textContent = `${text.length} / ${limit} characters`;
  count.classList.toggle("over", text.length > limit);
}

export const SPEAK_FIELDS = {
  input: "speak-text", instructions: "speak-instructions", voice: "speak-voice",
  model: "speak-model", "mizuoto.seed": "speak-seed", "mizuoto.steps": "speak-steps",
  "mizuoto.guidance": "speak-guidance",
};

/** The model directory's defaults a request with ``params`` took, as ``name=value``. */
export function takenDefaults(model, params) {
  const c = card(model);
  if (!c) return [];
  return c.params.filter((p) => p.model_default && !(p.name in params))
    .map((p) => `${p.name}=${JSON.stringify(p.default)}`);
}

/** Say which of the model directory's defaults limited the result (as `mizuoto say` does). */
export function showDefaults(element, model, params, duration) {
  const taken = takenDefaults(model, params);
  let note = "";
  if (taken.length) {
    note = `With this model directory's defaults: ${taken.join(", ")} (Engine settings override them).`;
    const c = card(model);
    if (c && c.random_init) {
      note += ` A random-init model never ends speech by itself: it runs to its length cap (here ${duration.toFixed(2)} s).`;
    }
  }
  element.textContent = note;
  element.hidden = !note;
}

// the Speak view's reference fields, and what the server calls them
export const REFERENCE_FIELDS = {
  audio: "speak-ref-file", "reference.audio": "speak-ref-file", name: "speak-ref-file",
  text: "speak-ref-text", "reference.text": "speak-ref-text", model: "speak-model",
};

/** The voice of the Speak view's reference clip for ``model``, built (once per clip, text and
 * model: its name is their digest) and kept as a voice; null without a clip. */
export async function referenceVoice(model) {
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

export async function onSpeak(event) {
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

export function downloadLabel() {
  return `Download ${$("speak-format").value.toUpperCase()}`;
}

export async function onDownload() {
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

/** ``model``'s settings as the Speak view holds them (kept per model), without the seed. */
export function settingsFor(model) {
  const settings = model === $("speak-model").value ? speakSettings() : studio.settings.get(model);
  return { steps: null, guidance: null, params: {}, ...settings, seed: null };
}

/** Keep the settings of the model the controls show (before they change to another). */
export function keepSettings() {
  const shown = $("speak-model").dataset.shown;
  if (shown) studio.settings.set(shown, speakSettings(shown));
}

/** Show ``model``'s kept settings (its defaults the first time). */
export function showSettings(model) {
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
