// Mizuoto studio: speak, voices, A/B compare and history against this server's API.
// Plain ES modules, no bundler and no dependencies: this entry wires the views up and
// starts; each view, the API, the audio and the waveform are modules beside it. Every
// server value (formats, limits, rates, the seed range) comes from GET /v1/models.

import { askForKey, keyPrompt } from "./api.js";
import { hidePlayer, play, showBlob } from "./audio.js";
import { compared, onCompare } from "./compare-view.js";
import { $, clearErrors } from "./dom.js";
import { renderHistory } from "./history-view.js";
import { fillVoices, loadModels, refreshVoiceSelects } from "./models.js";
import { applyCard, countText, downloadLabel, onDownload, onSpeak, speakState } from "./speak-view.js";
import { seedRange, studio } from "./state.js";
import { wireTabs } from "./tabs.js";
import { onCreateVoice, onRecord, renderVoices, setClip } from "./voices-view.js";

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
  const [low, high] = seedRange();
  for (const id of ["speak-seed", "compare-seed"]) {
    $(id).min = String(low);
    $(id).max = String(high);
  }
  applyCard();
  await Promise.all([refreshVoiceSelects(), renderVoices()]);
  renderHistory();
  document.body.dataset.ready = "true";
}

wire();
start();
