// Audio playback, WAV files and the seekable players. Playback takes the raw `pcm` answer
// (16-bit little-endian mono at the card's pcm_sample_rate) through Web Audio, block by block
// as it arrives.

import { studio } from "./state.js";

const LEAD_SECONDS = 0.05; // scheduled this far ahead so that the first chunk starts cleanly

export function audioContext() {
  if (!studio.context) studio.context = new AudioContext();
  if (studio.context.state === "suspended") studio.context.resume();
  return studio.context;
}

/** Plays 16-bit PCM blocks back to back as they come, from the first one. */
export class Player {
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
export function freshPlayer(rate) {
  if (studio.playing) studio.playing.stop();
  for (const element of document.querySelectorAll("audio.player")) element.pause();
  studio.playing = new Player(rate);
  return studio.playing;
}

export function play(pcm, rate) {
  const player = freshPlayer(rate);
  player.push(pcm);
  return player;
}

/** Joined 16-bit blocks. */
export function joined(blocks) {
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
export function wavBlob(pcm, rate) {
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

export function toInt16(samples) {
  const out = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i += 1) {
    out[i] = Math.max(-32768, Math.min(32767, Math.round(samples[i] * 32767)));
  }
  return out;
}

/** Show ``pcm`` in the seekable ``<audio>`` element (its timeline: a WAV blob). */
export function showPlayer(element, pcm, rate) {
  showBlob(element, wavBlob(pcm, rate));
}

export function showBlob(element, blob) {
  if (element.src) URL.revokeObjectURL(element.src);
  element.src = URL.createObjectURL(blob);
  element.hidden = false;
}

export function hidePlayer(element) {
  element.pause();
  if (element.src) URL.revokeObjectURL(element.src);
  element.removeAttribute("src");
  element.hidden = true;
}

export function save(blob, name) {
  const url = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = url;
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}
