// The served models and their voices, in the views' selects.

import { api } from "./api.js";
import { $, fillSelect } from "./dom.js";
import { applyCard } from "./speak-view.js";
import { card, studio } from "./state.js";

export async function loadModels() {
  const body = await (await api("/v1/models")).json();
  studio.server = body.mizuoto;
  studio.models = body.data.map((entry) => entry.id);
  for (const entry of body.data) studio.cards.set(entry.id, entry.mizuoto || null);
  // an adapter (serve --lora-dir) comes after its base model, which it names as its parent
  const items = body.data.map((entry) => ({
    value: entry.id,
    label: entry.parent
      ? `${entry.id} (LoRA on ${entry.parent})`
      : entry.mizuoto ? `${entry.id} (${entry.mizuoto.engine})` : entry.id,
  }));
  for (const id of ["speak-model", "voice-model", "compare-a-model", "compare-b-model"]) {
    fillSelect($(id), items);
  }
  if (studio.models.length > 1 && $("compare-b-model").value === $("compare-a-model").value) {
    $("compare-b-model").value = studio.models[1];
  }
  const bases = body.data.filter((entry) => !entry.parent);
  const names = bases.map((base) => {
    const adapters = body.data.filter((entry) => entry.parent === base.id).map((entry) => entry.id);
    return adapters.length ? `${base.id} (LoRA: ${adapters.join(", ")})` : base.id;
  }).join(", ");
  $("server-state").textContent = bases.length
    ? `Serving ${bases.length} model${bases.length > 1 ? "s" : ""}: ${names}`
    : "This server serves no model.";
}

/** Read the cards again (a model loaded on its first request has one only then). */
export async function refreshCards() {
  try {
    await loadModels();
    applyCard();
  } catch {
    // the page keeps the cards it has
  }
}

export function voicesOf(model, fresh = false) {
  if (fresh || !studio.voices.has(model)) {
    const query = `/v1/audio/voices?model=${encodeURIComponent(model)}`;
    const voices = api(query).then((r) => r.json()).then((body) => body.voices);
    voices.catch(() => studio.voices.delete(model));
    studio.voices.set(model, voices);
  }
  return studio.voices.get(model);
}

export async function fillVoices(modelSelect, voiceSelect, fresh = false) {
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

export function forgetVoices() {
  studio.voices.clear();
}

export async function refreshVoiceSelects() {
  await Promise.all([
    fillVoices($("speak-model"), $("speak-voice")),
    fillVoices($("compare-a-model"), $("compare-a-voice")),
    fillVoices($("compare-b-model"), $("compare-b-voice")),
  ]);
}

export function licenseNotice(model) {
  const c = card(model);
  if (!c || !c.non_commercial) return null;
  return `Non-commercial use only: the ${model} weights are licensed ${c.license || "for non-commercial use"}.`;
}

export function showLicense(element, model) {
  const notice = licenseNotice(model);
  element.textContent = notice || "";
  element.hidden = !notice;
}
