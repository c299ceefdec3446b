// The viewer's one door: the gateway's HTTP API, with the token the person typed.
// The token lives in sessionStorage only and travels as the Authorization header, never in a
// URL; EventSource cannot send that header, so live events are read with fetch() too.

const TOKEN = 'evalq.token';
const ADMIN = 'evalq.admin';
const WHO = 'evalq.who';

export const session = {
  get token() { return sessionStorage.getItem(TOKEN); },
  get who() {
    const raw = sessionStorage.getItem(WHO);
    return raw ? JSON.parse(raw) : null;
  },
  get admin() { return sessionStorage.getItem(ADMIN) === '1' && this.who?.role === 'admin'; },
  set admin(on) { sessionStorage.setItem(ADMIN, on ? '1' : '0'); },
  signIn(token, who) {
    sessionStorage.setItem(TOKEN, token);
    sessionStorage.setItem(WHO, JSON.stringify(who));
  },
  signOut() {
    for (const key of [TOKEN, WHO, ADMIN]) sessionStorage.removeItem(key);
  },
};

export class ApiError extends Error {
  constructor(status, message, exitCode) {
    super(message);
    this.status = status;
    this.exitCode = exitCode;
  }
}

/** Routes that take the admin flag (bypass tiers; audited). */
const ADMIN_ROUTES = /^\/v1\/(runs(\/[^/]+(\/(samples|events))?)?|compare)$/;

function url(path, params) {
  const target = new URL(path, location.origin);
  for (const [key, value] of Object.entries(params || {})) {
    if (value === null || value === undefined || value === '' || value === false) continue;
    for (const one of Array.isArray(value) ? value : [value]) target.searchParams.append(key, String(one));
  }
  if (session.admin && ADMIN_ROUTES.test(path)) target.searchParams.set('admin', 'true');
  return target;
}

function headers(token, accept) {
  return { Authorization: `Bearer ${token ?? session.token ?? ''}`, Accept: accept };
}

/** The gateway did not answer at all (not running, or the network is down). */
export class Unreachable extends Error {
  constructor() {
    super(`the gateway at ${location.origin} cannot be reached; is \`evalq serve\` running?`);
    this.name = 'Unreachable';
  }
}

/** The token is unknown or revoked: the viewer signs out and shows the sign-in form with
 * `message` (viewer.js listens), aborting the page on screen. */
export function unauthorized(message) {
  window.dispatchEvent(new CustomEvent('evalq:unauthorized', { detail: message }));
}

async function refusal(response) {
  let body = null;
  try { body = await response.json(); } catch { /* not JSON */ }
  const message = body && typeof body.error === 'string' ? body.error : `HTTP ${response.status}`;
  const error = new ApiError(response.status, message, body?.exit_code);
  if (response.status === 401) unauthorized(message);
  return error;
}

/** fetch(), with a network failure ("Failed to fetch") said as Unreachable; an abort stays one. */
async function reach(target, init) {
  try {
    return await fetch(target, init);
  } catch (error) {
    if (error.name === 'AbortError' || init.signal?.aborted) throw error;
    throw new Unreachable();
  }
}

/** GET (or another method) a route's JSON; an error answer is thrown as ApiError. */
export async function api(path, params = {}, { method = 'GET', signal, token } = {}) {
  const response = await reach(url(path, params), {
    method, signal, cache: 'no-store', credentials: 'omit', headers: headers(token, 'application/json'),
  });
  if (!response.ok) throw await refusal(response);
  return response.json();
}

/** A route's server-sent events, as {name, data} with data parsed from JSON. */
export async function* events(path, params = {}, signal) {
  const response = await reach(url(path, params), {
    signal, cache: 'no-store', credentials: 'omit', headers: headers(null, 'text/event-stream'),
  });
  if (!response.ok) throw await refusal(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  try {
    for (;;) {
      let value, done;
      try {
        ({ value, done } = await reader.read());
      } catch (error) {
        if (error.name === 'AbortError' || signal?.aborted) throw error;
        throw new Unreachable(); // the connection broke mid-stream
      }
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let name = 'message';
        const data = [];
        for (const line of block.split('\n')) {
          if (line.startsWith('event:')) name = line.slice(6).trim();
          else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
        }
        if (data.length) yield { name, data: JSON.parse(data.join('\n')) };
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}
