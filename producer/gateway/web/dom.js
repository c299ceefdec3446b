// Building the page: every value goes in as text (textContent, text nodes, attributes),
// never as markup: outputs, inputs and errors are untrusted.

const SVG = 'http://www.w3.org/2000/svg';

function fill(el, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'class') el.setAttribute('class', value);
    else if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** An HTML element: h('td', {class: 'num'}, 'text', otherNode). */
export function h(tag, attrs = {}, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

/** An SVG element. */
export function s(tag, attrs = {}, ...children) {
  return fill(document.createElementNS(SVG, tag), attrs, children);
}

/** Replace an element's children. */
export function put(el, ...children) {
  el.replaceChildren();
  return fill(el, {}, children);
}

/** A hash link inside the viewer: parts are encoded one by one. */
export function link(parts, text, query = null, attrs = {}) {
  let href = '#/' + parts.map((p) => encodeURIComponent(String(p))).join('/');
  if (query) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== null && v !== undefined && v !== '') q.set(k, v);
    const text = q.toString();
    if (text) href += '?' + text;
  }
  return h('a', { ...attrs, href }, text);
}

export function num(x, digits = 4) {
  return typeof x === 'number' && Number.isFinite(x) ? x.toFixed(digits) : '';
}

export function count(n) {
  return typeof n === 'number' ? n.toLocaleString('en-US') : '';
}

export function interval(ci, digits = 4) {
  return Array.isArray(ci) ? `${num(ci[0], digits)} to ${num(ci[1], digits)}` : '';
}

export function when(seconds) {
  if (!seconds) return '';
  const d = new Date(seconds * 1000);
  return d.toISOString().replace('T', ' ').slice(0, 19) + 'Z';
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined) return '';
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

/** A model spec as pages print it: a local folder's absolute path after its provider and a
 * colon (hf:/models/x), not the canonical hf//models/x. */
export function modelName(model) {
  if (!model) return '';
  const cut = model.indexOf('/');
  return cut > 0 && model[cut + 1] === '/' ? `${model.slice(0, cut)}:${model.slice(cut + 1)}` : model;
}

/** A JSON value as short text (strings as they are). */
export function brief(value, max = 160) {
  if (value === null || value === undefined) return '';
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  return text.length > max ? text.slice(0, max - 1) + '…' : text;
}

export function pretty(value) {
  return typeof value === 'string' ? value : JSON.stringify(value, null, 2);
}

/** A notice box: kind is 'error', 'refused' or 'info'. */
export function notice(kind, title, ...lines) {
  return h('div', { class: `notice ${kind}`, role: kind === 'info' ? 'status' : 'alert' },
    h('strong', {}, title), ...lines.map((line) => h('p', {}, line)));
}
