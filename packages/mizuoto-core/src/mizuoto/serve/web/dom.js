// The page's small DOM helpers: look-ups, selects, facts, errors next to their fields.

export const $ = (id) => document.getElementById(id);

export function fillSelect(select, items, keep = true) {
  const previous = select.value;
  select.replaceChildren(...items.map(({ value, label }) => new Option(label, value)));
  if (keep && items.some((item) => item.value === previous)) select.value = previous;
}

export function seconds(ms) {
  return `${(ms / 1000).toFixed(2)} s`;
}

export function showFacts(list, facts) {
  list.replaceChildren(...facts.filter(([, value]) => value !== null && value !== undefined && value !== "")
    .map(([term, value]) => {
      const item = document.createElement("div");
      const dt = document.createElement("dt");
      const dd = document.createElement("dd");
      dt.textContent = term;
      dd.textContent = String(value);
      item.append(dt, dd);
      return item;
    }));
}

export function clearErrors(root) {
  for (const element of root.querySelectorAll(".error")) element.textContent = "";
  for (const element of root.querySelectorAll("[aria-invalid]")) element.removeAttribute("aria-invalid");
}

/** Show ``error`` next to the field its ``param`` names (``fields``: param -> input id). */
export function showError(error, fields, fallback) {
  let id = error.param && fields[error.param];
  if (!id && error.param && error.param.startsWith("mizuoto.params")) id = "speak-params";
  const target = id ? $(`${id}-error`) : null;
  if (target) {
    target.textContent = error.message;
    const input = $(id);
    if (input && input.setAttribute) input.setAttribute("aria-invalid", "true");
    if (id === "speak-params") $("speak-params").open = true;
  } else {
    $(fallback).textContent = error.message;
  }
}

export function button(label, onClick, describedBy) {
  const element = document.createElement("button");
  element.type = "button";
  element.textContent = label;
  if (describedBy) element.setAttribute("aria-describedby", describedBy);
  element.addEventListener("click", onClick);
  return element;
}
