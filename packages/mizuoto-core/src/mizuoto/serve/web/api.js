// The API, with its key (asked for in the page when the server refuses a call).

import { $ } from "./dom.js";
import { KEY_STORAGE, studio } from "./state.js";


export class ApiError extends Error {
  constructor(status, message, param, code) {
    super(message);
    this.status = status;
    this.param = param;
    this.code = code;
  }
}

export async function errorOf(response) {
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

export let keyPrompt = null;

/** Ask for the key (again: ``refused``); resolves once one is entered. Closing the prompt
 * (Cancel, Escape) leaves the page waiting: the "API key" button opens it again. */
export function askForKey(refused) {
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

export async function api(path, init = {}) {
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
