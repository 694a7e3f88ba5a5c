// The History view: this tab's last utterances, kept in this browser only.

import { play, save, wavBlob } from "./audio.js";
import { $, button, seconds } from "./dom.js";
import { licenseNotice } from "./models.js";
import { studio } from "./state.js";

export const HISTORY_LIMIT = 50; // utterances kept (their audio stays in memory)

export function remember(entry) {
  studio.history.unshift({ ...entry, url: URL.createObjectURL(wavBlob(entry.pcm, entry.rate)) });
  for (const dropped of studio.history.splice(HISTORY_LIMIT)) URL.revokeObjectURL(dropped.url);
  renderHistory();
}

export function describe(entry) {
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

export function renderHistory() {
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
