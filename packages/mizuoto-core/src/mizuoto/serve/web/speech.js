// Speech requests: the body, the streamed `pcm` answer, what it took.

import { api } from "./api.js";
import { joined } from "./audio.js";

/**
 * Stream ``body`` as `pcm`: ``onBlock(int16Block)`` for each block as it arrives.
 * Resolves to what was received and when (performance.now() times).
 */
export async function speak(body, { onBlock, signal } = {}) {
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

export function speechBody(model, voice, text, settings, instructions, stream = true) {
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

export function outcome(result, rate) {
  const duration = result.pcm.length / rate;
  return {
    duration,
    rtf: duration > 0 ? (result.finished - result.started) / 1000 / duration : null,
  };
}
