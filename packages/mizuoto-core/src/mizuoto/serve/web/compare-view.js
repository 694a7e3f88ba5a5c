// The Compare view: one text and seed on two models or voices.

import { hidePlayer, showPlayer } from "./audio.js";
import { $, seconds, showFacts } from "./dom.js";
import { remember } from "./history-view.js";
import { showLicense } from "./models.js";
import { settingsFor } from "./speak-view.js";
import { outcome, speak, speechBody } from "./speech.js";
import { card, pcmRate, seedRange } from "./state.js";
import { Wave } from "./wave.js";

export const compared = { a: null, b: null };

/** One seed for both sides, drawn in [low, high]. */
function drawSeed(low, high) {
  const [word] = crypto.getRandomValues(new Uint32Array(1));
  return low + Math.floor((word / 2 ** 32) * (high - low + 1));
}

export async function onCompare(event) {
  event.preventDefault();
  const text = $("compare-text").value;
  $("compare-text-error").textContent = "";
  if (!text.trim()) {
    $("compare-text-error").textContent = "Type the words to speak.";
    return;
  }
  let seed = $("compare-seed").value.trim();
  const [low, high] = seedRange();
  seed = seed === "" ? drawSeed(low, high) : Number(seed);
  if (!Number.isInteger(seed) || seed < low || seed > high) {
    $("compare-status").textContent = `The seed must be a whole number from ${low} to ${high}.`;
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

export async function compareSide(side, text, seed) {
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
