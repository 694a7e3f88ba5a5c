// The Voices view: build a voice from an upload or the microphone, hear, use, delete.

import { api } from "./api.js";
import { audioContext, freshPlayer, hidePlayer, showBlob, toInt16, wavBlob } from "./audio.js";
import { $, button, clearErrors, seconds, showError } from "./dom.js";
import { fillVoices, forgetVoices, refreshVoiceSelects, voicesOf } from "./models.js";
import { applyCard, settingsFor } from "./speak-view.js";
import { speak, speechBody } from "./speech.js";
import { can, card, pcmRate, studio } from "./state.js";
import { selectTab } from "./tabs.js";

// the form's fields, and what the engine calls them (a Reference's audio and text)
export const VOICE_FIELDS = {
  name: "voice-name", audio: "voice-audio", text: "voice-text", model: "voice-model",
  "reference.audio": "voice-audio", "reference.text": "voice-text",
};

export function setClip(blob, name) {
  studio.clip = blob ? { blob, name } : null;
  if (blob) showBlob($("voice-preview"), blob);
  else hidePlayer($("voice-preview"));
}

export const recording = { recorder: null, stream: null, started: 0, timer: null };

export async function onRecord() {
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

export async function onCreateVoice(event) {
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

export async function renderVoices(fresh = false) {
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

export async function hearVoice(model, voice) {
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

export async function useVoice(model, voice) {
  $("speak-model").value = model;
  applyCard();
  await fillVoices($("speak-model"), $("speak-voice"));
  $("speak-voice").value = voice;
  selectTab($("tab-speak"), true);
}

export async function deleteVoice(name) {
  try {
    await api(`/v1/audio/voices/${encodeURIComponent(name)}`, { method: "DELETE" });
    $("voice-list-status").textContent = `Deleted ${name}.`;
    forgetVoices();
    await Promise.all([refreshVoiceSelects(), renderVoices()]);
  } catch (error) {
    $("voice-list-status").textContent = error.message;
  }
}
