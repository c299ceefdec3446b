// The evalq viewer: hash routes over the gateway's API.
//   #/runs?eval=&model=&dataset=&split=&sweep=&tag=&status=&principal=
//   #/runs/<run>   #/runs/<run>/samples?offset=&failed=&q=&sort=   #/runs/<run>/samples/<id>
//   #/sweeps/<sweep>?principal=   #/compare?runs=a,b
import { Unreachable, api, session } from './api.js';
import { h, link, notice, put } from './dom.js';
import { comparePage, sweepPage } from './analysis.js';
import { runPage, runsPage, samplePage, samplesPage } from './pages.js';

const app = document.getElementById('app');
let current = null; // the AbortController of the page on screen

function decode(part) {
  try { return decodeURIComponent(part); } catch { return null; } // a bad % escape: no page
}

function parse() {
  const raw = location.hash.replace(/^#\/?/, '');
  const [path, query] = raw.split('?', 2);
  const parts = path.split('/').filter(Boolean).map(decode);
  return { parts, query: new URLSearchParams(query || '') };
}

function header() {
  const who = session.who;
  put(document.getElementById('nav'), who ? [link(['runs'], 'Runs')] : []);
  const box = document.getElementById('who');
  if (!who) { put(box); return; }
  const items = [h('span', { class: 'principal', 'data-principal': who.principal }, `${who.principal} (${who.role})`)];
  if (who.role === 'admin') {
    const box2 = h('input', { type: 'checkbox', id: 'admin-mode', checked: session.admin });
    box2.addEventListener('change', () => { session.admin = box2.checked; route(); });
    items.push(h('label', { class: 'admin-mode', title: 'Read every tier (audited), as --admin does' }, box2, ' admin reads'));
  }
  items.push(h('button', { type: 'button', id: 'sign-out', onclick: () => { session.signOut(); location.hash = '#/runs'; route(); } }, 'Sign out'));
  put(box, items);
}

function signIn(message) {
  header();
  const token = h('input', { type: 'password', id: 'token', name: 'token', autocomplete: 'off', required: true, spellcheck: 'false' });
  const problem = h('div', { id: 'sign-in-problem' }, message ? notice('error', 'Not signed in', message) : null);
  const form = h('form', { id: 'sign-in', class: 'card' },
    h('h1', {}, 'Sign in'),
    h('p', { class: 'muted' }, 'Paste an evalq API token (evalq tokens create). It is sent to this gateway as a bearer token.'),
    h('p', { class: 'muted', id: 'token-kept' }, 'The token is kept for this tab only (its session storage): a run opened in a new tab or window asks for it again, and closing the tab forgets it.'),
    h('label', { for: 'token' }, 'Token'), token,
    h('button', { type: 'submit' }, 'Sign in'), problem);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const typed = token.value.trim();
    try {
      const who = await api('/v1/whoami', {}, { token: typed });
      session.signIn(typed, who);
      token.value = '';
      if (!location.hash || location.hash === '#/' || location.hash.startsWith('#/sign-in')) location.hash = '#/runs';
      else route();
    } catch (error) {
      put(problem, notice('error', 'Not signed in', error.message));
    }
  });
  put(app, form);
  token.focus();
}

export async function route() {
  current?.abort();
  current = new AbortController();
  const signal = current.signal;
  if (!session.token) { signIn(); return; }
  header();
  try {
    const { parts, query } = parse();
    if (parts.includes(null)) nowhere();
    else if (parts[0] === 'runs' && parts.length === 1) await runsPage(app, query, signal);
    else if (parts[0] === 'runs' && parts.length === 2) await runPage(app, parts[1], signal);
    else if (parts[0] === 'runs' && parts[2] === 'samples' && parts.length === 3) await samplesPage(app, parts[1], query, signal);
    else if (parts[0] === 'runs' && parts[2] === 'samples' && parts.length === 4) await samplePage(app, parts[1], parts[3], signal);
    else if (parts[0] === 'sweeps' && parts.length === 2) await sweepPage(app, parts[1], query, signal);
    else if (parts[0] === 'compare') await comparePage(app, query, signal);
    else if (parts.length === 0) location.hash = '#/runs';
    else nowhere();
  } catch (error) {
    if (signal.aborted || error.name === 'AbortError') return;
    put(app, notice('error', error instanceof Unreachable ? 'Gateway unreachable' : 'Error', error.message));
  }
}

function nowhere() {
  document.title = 'evalq · no such page';
  const box = notice('error', 'No such page', `Nothing is at ${location.hash || '#/'}.`);
  box.id = 'no-such-page';
  put(app, box);
}

// a 401 anywhere (a revoked token): stop the page on screen, sign out, and ask for a token
// again, saying why; the page's own error handling then finds its signal aborted
window.addEventListener('evalq:unauthorized', (event) => {
  current?.abort();
  session.signOut();
  signIn(event.detail);
});
window.addEventListener('hashchange', route);
route();
