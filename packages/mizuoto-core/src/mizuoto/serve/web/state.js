// What the page knows: the server's models and cards (GET /v1/models), and the tab's state.

export const KEY_STORAGE = "mizuoto.api-key";

export const studio = {
  models: [],
  cards: new Map(), // model id -> its card (GET /v1/models' "mizuoto" key), null if unknown
  voices: new Map(), // model id -> Promise of its voices
  settings: new Map(), // model id -> its Speak settings, kept while another model is shown
  key: sessionStorage.getItem(KEY_STORAGE),
  context: null,
  history: [],
  playing: null,
  clip: null, // the voice clip to upload: {blob, name}
  server: null, // GET /v1/models' own "mizuoto" key: the values every model shares
};

export function card(model) {
  return studio.cards.get(model) || null;
}

export function pcmRate(model) {
  return (card(model) || studio.server).pcm_sample_rate;
}

export function can(model, capability) {
  const c = card(model);
  return Boolean(c && c.capabilities.includes(capability));
}

export function maxChars(model) {
  return (card(model) || studio.server).max_input_chars;
}

/** The server's own values (GET /v1/models' top-level "mizuoto" key): for a model without a
 * card yet (not loaded), and the seed range every model takes. */
export function server() {
  return studio.server;
}

/** The formats ``model`` can be downloaded in. */
export function formats(model) {
  return (card(model) || studio.server).formats;
}

/** The seeds a request may carry: [lowest, highest]. */
export function seedRange() {
  return studio.server.seed_range;
}
