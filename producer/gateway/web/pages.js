// Runs, one run (live), its samples and one sample.
import { ApiError, api, events, session, unauthorized } from './api.js';
import { brief, count, duration, h, interval, link, modelName, notice, num, pretty, put, when } from './dom.js';

const STATUSES = ['', 'queued', 'running', 'completed', 'failed', 'cancelled'];
const FILTERS = ['eval', 'model', 'dataset', 'split', 'sweep', 'tag'];
const LIST_REFRESH_MS = 5000;
const LIST_LIMIT = 200;

function firstMetric(view) {
  const stats = view.stats || {};
  const names = Object.keys(stats).sort();
  if (names.length) return { name: names[0], mean: stats[names[0]].mean, ci: stats[names[0]].ci95 };
  const aggregate = view.aggregate || {};
  const keys = Object.keys(aggregate).sort();
  return keys.length ? { name: keys[0], mean: aggregate[keys[0]], ci: null } : null;
}

function done(view) {
  const p = view.progress;
  return p.scored + p.failed;
}

function tokens(progress) {
  const total = (progress.prompt_tokens || 0) + (progress.completion_tokens || 0);
  return total ? `${count(progress.prompt_tokens)} in / ${count(progress.completion_tokens)} out` : '';
}

function badge(text, kind = text) {
  return h('span', { class: `badge ${kind}` }, text);
}

function title(...parts) {
  document.title = ['evalq', ...parts].join(' · ');
}

/** Resolves after `ms` once the tab is visible (a hidden tab waits until it is shown again),
 * or at once when `signal` aborts; it leaves no timer or listener behind either way. */
function refreshAfter(ms, signal) {
  return new Promise((resolve) => {
    let timer = null;
    const finish = () => {
      clearTimeout(timer);
      document.removeEventListener('visibilitychange', shown);
      signal.removeEventListener('abort', finish);
      resolve();
    };
    const shown = () => { if (!document.hidden) finish(); };
    signal.addEventListener('abort', finish);
    timer = setTimeout(() => {
      if (!document.hidden) finish();
      else document.addEventListener('visibilitychange', shown);
    }, ms);
  });
}

// ---------------------------------------------------------------- runs
export async function runsPage(app, query, signal) {
  title('runs');
  const admin = session.who?.role === 'admin';
  const wanted = Object.fromEntries([...FILTERS, 'status', 'principal'].map((k) => [k, query.get(k) || '']));
  const inputs = {};
  const fields = FILTERS.map((key) => {
    inputs[key] = h('input', { name: key, id: `filter-${key}`, value: wanted[key], placeholder: key, size: 12 });
    return h('label', {}, key, inputs[key]);
  });
  inputs.status = h('select', { name: 'status', id: 'filter-status' },
    STATUSES.map((st) => h('option', { value: st, selected: st === wanted.status }, st || 'any status')));
  fields.push(h('label', {}, 'status', inputs.status));
  if (admin) {
    inputs.principal = h('input', { name: 'principal', id: 'filter-principal', value: wanted.principal, placeholder: 'principal', size: 10 });
    fields.push(h('label', {}, 'principal', inputs.principal));
  }
  const form = h('form', { id: 'filters', class: 'filters' }, fields, h('button', { type: 'submit' }, 'Filter'),
    link(['runs'], 'clear'));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const q = new URLSearchParams();
    for (const [key, input] of Object.entries(inputs)) if (input.value.trim()) q.set(key, input.value.trim());
    location.hash = '#/runs' + (q.toString() ? '?' + q : '');
  });
  const table = h('div', { id: 'runs' }, h('p', { class: 'muted' }, 'Loading runs…'));
  const cut = h('p', { class: 'muted', id: 'runs-limit' });
  const compare = h('button', { type: 'button', id: 'compare-selected', disabled: true }, 'Compare selected');
  put(app, h('h1', {}, 'Runs'), form, table, cut, h('p', {}, compare));

  const chosen = new Set();
  compare.addEventListener('click', () => { location.hash = `#/compare?runs=${[...chosen].map(encodeURIComponent).join(',')}`; });
  const params = { limit: LIST_LIMIT };
  for (const [key, value] of Object.entries(wanted)) if (value && (key !== 'principal' || admin)) params[key] = value;
  for (;;) {
    const views = await api('/v1/runs', params, { signal });
    put(table, runsTable(views, admin, chosen, compare));
    put(cut, views.length >= LIST_LIMIT ? `showing the newest ${count(LIST_LIMIT)} runs that match; filter to see older ones` : null);
    if (!views.some((v) => ['queued', 'running'].includes(v.meta.status))) return;
    // while a listed run goes, the list is read again every few seconds (one request); a
    // hidden tab reads it again once it is shown
    await refreshAfter(LIST_REFRESH_MS, signal);
    if (signal.aborted) return;
  }
}

function runsTable(views, admin, chosen, compare) {
  if (!views.length) return h('p', { class: 'muted', id: 'no-runs' }, 'No runs match.');
  const head = ['', 'run', 'eval', 'model', 'data', 'tier', 'status', 'progress', 'first metric (95% CI)', 'tokens',
    ...(admin ? ['principal'] : []), 'submitted', 'params', 'tags'];
  const rows = views.map((v) => {
    const m = v.meta;
    const metric = firstMetric(v);
    const pick = h('input', { type: 'checkbox', 'aria-label': `select ${m.run_id}`, checked: chosen.has(m.run_id) });
    pick.addEventListener('change', () => {
      if (pick.checked) chosen.add(m.run_id); else chosen.delete(m.run_id);
      compare.disabled = chosen.size < 2;
    });
    return h('tr', { 'data-run': m.run_id, 'data-status': m.status },
      h('td', {}, pick),
      h('td', { class: 'id' }, link(['runs', m.run_id], m.run_id)),
      h('td', {}, m.eval), h('td', { class: 'model' }, modelName(m.model)),
      h('td', { class: 'wrap' }, `${m.dataset_id}/${m.split}`), h('td', {}, badge(v.tier)),
      h('td', {}, badge(m.status)),
      h('td', { class: 'num' }, `${count(done(v))}/${count(m.n)}`),
      h('td', { class: 'num metric' }, metric ? `${metric.name} ${num(metric.mean)}` : (v.withheld ? 'withheld' : ''),
        metric?.ci ? h('span', { class: 'ci' }, ` (${interval(metric.ci)})`) : null),
      h('td', { class: 'num' }, tokens(v.progress)),
      admin ? h('td', { class: 'principal' }, m.principal) : null,
      h('td', { class: 'when' }, when(m.created)),
      h('td', { class: 'wrap' }, Object.entries(m.params).map(([k, val]) => `${k}=${val}`).join(' ')),
      h('td', { class: 'wrap' }, m.tags.join(' '), m.sweep ? [' ', sweepLink(m, `sweep ${m.sweep}`)] : null));
  });
  return h('table', { class: 'rows', 'data-table': 'runs' },
    h('thead', {}, h('tr', {}, head.map((c) => h('th', {}, c)))), h('tbody', {}, rows));
}

/** A run's sweep: the sweep id with the run's principal (two principals may pick one id). */
function sweepLink(meta, text) {
  return link(['sweeps', meta.sweep], text, { principal: meta.principal }, { class: 'sweep-link' });
}

// ---------------------------------------------------------------- one run
export async function runPage(app, runId, signal) {
  title('run', runId);
  const body = h('div', { id: 'run' });
  const live = h('span', { id: 'live', class: 'live' }, '');
  put(app, h('h1', {}, 'Run ', h('code', {}, runId), ' ', live), body);
  let view;
  try {
    view = await api(`/v1/runs/${encodeURIComponent(runId)}`, {}, { signal });
  } catch (error) {
    if (signal.aborted || !(error instanceof ApiError)) throw error;
    const what = { 401: 'Not signed in', 403: 'Refused', 404: 'Not found' }[error.status] || 'Error';
    put(body, notice(error.status === 403 ? 'refused' : 'error', `${what} (HTTP ${error.status})`, error.message));
    body.querySelector('.notice').id = 'run-refused';
    return;
  }
  renderRun(body, view);
  performance.mark('evalq:run'); // the run's first meaningful paint (bench/viewer.py reads it)
  if (!['queued', 'running'].includes(view.meta.status)) return;
  // live: the gateway sends the run again each time it changes, and once more when it ends
  while (!signal.aborted) {
    live.textContent = '● live';
    try {
      for await (const message of events(`/v1/runs/${encodeURIComponent(runId)}/events`, {}, signal)) {
        if (message.name === 'run' || message.name === 'end') renderRun(body, message.data);
        if (message.name === 'end') { live.textContent = ''; return; }
        if (message.name === 'error') {
          live.textContent = '';
          const said = String(message.data.error);
          if (said.startsWith('unauthorized:')) { unauthorized(said); return; } // revoked meanwhile
          body.prepend(notice('error', 'Live view stopped', said));
          return;
        }
      }
    } catch (error) {
      if (signal.aborted) return;
      live.textContent = '';
      body.prepend(notice('error', 'Live view stopped', error.message));
      return;
    }
    // the stream reached its lifetime (event: timeout): open another
  }
}

/** Where a backlogged run stands: "waiting its turn" only when other principals' work is served
 * before it; a run alone (or next in turn) is being dispatched as fast as the workers take it. */
export function waitingText(w) {
  if (!w.ahead) {
    const others = w.principals > 1 ? `, shared with ${w.principals - 1} other principal(s), next in turn` : '';
    return `${count(w.waiting)} samples queued for the workers, ${num(100 * w.share, 0)}% of them${others}`;
  }
  const shared = [];
  if (w.principals > 1) shared.push(`${w.principals - 1} other principal(s)`);
  if (w.runs > 1) shared.push(`${w.runs - 1} other run(s) of its principal`);
  return `waiting its turn: ${count(w.waiting)} samples in its backlog, ${num(100 * w.share, 0)}% of the workers` +
    (shared.length ? `, shared with ${shared.join(' and ')}` : '') + (w.ahead ? `; ${w.ahead} principal(s) served first` : '');
}

function field(label, ...value) {
  return [h('dt', {}, label), h('dd', {}, ...value)];
}

function renderRun(body, view) {
  const m = view.meta;
  const p = view.progress;
  const settled = done(view);
  const facts = h('dl', { class: 'facts' },
    field('evaluation', m.eval),
    m.model ? field('model', modelName(m.model)) : null,
    field('data', `${m.dataset_id}/${m.split}`),
    field('tier', badge(view.tier)),
    field('status', h('span', { id: 'run-status', 'data-status': m.status }, badge(m.status)), m.reason ? ` ${m.reason}` : ''),
    field('principal', m.principal),
    field('priority', m.priority),
    field('submitted', when(m.created)),
    m.finished ? field('finished', when(m.finished)) : null,
    Object.keys(m.params).length ? field('params', Object.entries(m.params).map(([k, v]) => `${k}=${v}`).join(' ')) : null,
    m.tags.length ? field('tags', m.tags.join(' ')) : null,
    m.sweep ? field('sweep', sweepLink(m, m.sweep)) : null,
    m.rescored_from ? field('rescored from', link(['runs', m.rescored_from], m.rescored_from)) : null);
  const why = view.stalled ? `stalled: ${view.stalled}` :
    view.waiting ? waitingText(view.waiting) : '';
  // resume re-enqueues what a run lost: for a run that failed, was cancelled or stalled; a
  // going run that moves has nothing to resume (and a completed one nothing left)
  const resumable = ['failed', 'cancelled'].includes(m.status) || Boolean(view.stalled);
  const progress = h('section', { id: 'progress' },
    h('h2', {}, 'Progress'),
    h('progress', { max: m.n || 1, value: settled }),
    h('p', {},
      h('span', { id: 'done', 'data-done': settled }, count(settled)), ` / ${count(m.n)} settled · `,
      h('span', { id: 'scored' }, count(p.scored)), ' scored · ',
      h('span', { id: 'failed' }, count(p.failed)), ' failed',
      p.recovered ? ` · ${count(p.recovered)} resent` : ''),
    h('p', { class: 'muted' },
      view.throughput !== null && view.throughput !== undefined ? `${num(view.throughput, 1)} samples/s` : 'timing withheld (not viewable)',
      view.eta_seconds !== null && view.eta_seconds !== undefined ? ` · ETA ${duration(view.eta_seconds)}` : ''),
    why ? h('p', { id: 'why', class: 'warn' }, why) : null,
    tokens(p) ? h('p', {}, 'tokens: ', tokens(p)) : null,
    view.endpoint ? h('p', { class: 'muted' }, `endpoint ${view.endpoint.url}: ${count(view.endpoint.requests)} requests, ${count(view.endpoint.rate_limited)} rate limited in the last minute`) : null);
  const actions = h('p', { class: 'actions' },
    link(['runs', m.run_id, 'samples'], 'Samples', null, { id: 'samples-link' }),
    ['queued', 'running'].includes(m.status) ? button('Cancel', `/v1/runs/${encodeURIComponent(m.run_id)}/cancel`, body) : null,
    m.status !== 'completed' ? button('Resume', `/v1/runs/${encodeURIComponent(m.run_id)}/resume`, body, !resumable,
      'Resume is for a run that failed, was cancelled or stalled') : null);
  const failures = errors(view);
  put(body, facts, actions, progress, aggregates(view), failures, modelSpec(m), provenance(view));
  if (failures && !['queued', 'running'].includes(m.status)) errorMessages(failures, m.run_id);
}

/** A run that ended with failed samples: the first message of each error kind, read from its
 * failed samples, which the API gives only a reader with per-sample access (a held-out reader
 * sees the stages and their counts, nothing more). */
async function errorMessages(section, runId) {
  let page;
  try {
    page = await api(`/v1/runs/${encodeURIComponent(runId)}/samples`, { failed: true, limit: 50 });
  } catch (error) {
    if (error instanceof ApiError && error.status === 403) return; // no per-sample access: stages only
    throw error;
  }
  const first = new Map();
  for (const r of page.samples) {
    const kind = r.error ? `${r.error.stage}/${r.error.kind}` : null;
    if (kind && !first.has(kind)) first.set(kind, r);
  }
  for (const row of section.querySelectorAll('tr[data-kind]')) {
    const r = first.get(row.dataset.kind);
    if (!r) continue;
    row.querySelector('td.message').append(r.error.message, ' ',
      link(['runs', runId, 'samples', r.sample_id], `(sample ${r.sample_id})`));
  }
}

function button(label, path, body, disabled = false, why = null) {
  const b = h('button', { type: 'button', class: 'action', disabled, title: disabled ? why : null }, label);
  b.addEventListener('click', async () => {
    b.disabled = true;
    try {
      const answer = await api(path, {}, { method: 'POST' });
      body.prepend(notice('info', `${label}: done`, JSON.stringify(answer)));
    } catch (error) {
      body.prepend(notice('error', `${label}: refused`, error.message));
    }
  });
  return b;
}

function aggregates(view) {
  const section = h('section', { id: 'aggregates' }, h('h2', {}, 'Aggregates'));
  const stats = view.stats || {};
  const names = Object.keys(stats).length ? Object.keys(stats).sort() : Object.keys(view.aggregate || {}).sort();
  if (!names.length) {
    section.append(h('p', { class: 'muted', id: 'withheld' }, view.withheld || 'No aggregate yet: it is computed when the run completes.'));
    return section;
  }
  const rows = names.map((name) => {
    const st = stats[name];
    const mean = st ? st.mean : view.aggregate[name];
    const failed = st ? Object.values(st.failed || {}).reduce((a, b) => a + b, 0) : 0;
    return h('tr', { 'data-metric': name, 'data-mean': mean, 'data-low': st?.ci95?.[0] ?? '', 'data-high': st?.ci95?.[1] ?? '' },
      h('td', {}, name), h('td', { class: 'num' }, num(mean)),
      h('td', { class: 'num ci' }, st?.ci95 ? interval(st.ci95) : ''),
      h('td', { class: 'num' }, st ? count(st.n) : ''), h('td', { class: 'num' }, failed ? count(failed) : ''),
      h('td', { class: 'muted' }, st ? st.method : ''));
  });
  section.append(h('table', { class: 'rows', 'data-table': 'aggregates' },
    h('thead', {}, h('tr', {}, ['metric', 'mean', '95% interval', 'n', 'failed', 'method'].map((c) => h('th', {}, c)))),
    h('tbody', {}, rows)));
  if (view.release) {
    section.append(h('p', { class: 'muted', id: 'release' }, `released as ${view.release.rule}: `,
      Object.entries(view.release.why || {}).map(([k, why]) => `${k}: ${why}`).join('; ')));
  }
  return section;
}

function errors(view) {
  const kinds = Object.entries(view.errors || {});
  if (!kinds.length) return null;
  return h('section', { id: 'errors' }, h('h2', {}, 'Errors'),
    h('table', { class: 'rows', 'data-table': 'errors' },
      h('thead', {}, h('tr', {}, h('th', {}, 'stage/kind'), h('th', {}, 'samples'), h('th', {}, 'first message'))),
      h('tbody', {}, kinds.map(([k, n]) => h('tr', { 'data-kind': k }, h('td', {}, k), h('td', { class: 'num' }, count(n)),
        h('td', { class: 'text message' }))))));
}

function modelSpec(m) {
  if (!m.task) return null;
  let task = m.task;
  try { task = JSON.parse(m.task); } catch { /* shown as it is */ }
  return h('section', { id: 'model-spec' }, h('h2', {}, 'Model and task'),
    h('details', {}, h('summary', {}, m.model || 'task'), h('pre', {}, pretty(task))));
}

function provenance(view) {
  const found = view.provenance;
  if (!found) return null;
  const workers = found.workers || [];
  return h('section', { id: 'provenance' }, h('h2', {}, 'Provenance'),
    found.spec ? h('p', {}, 'dataset spec ', h('code', {}, found.spec)) : null,
    workers.length ? h('table', { class: 'rows', 'data-table': 'provenance' },
      h('thead', {}, h('tr', {}, ['host', 'device', 'python', 'evaluation', 'source sha256'].map((c) => h('th', {}, c)))),
      h('tbody', {}, workers.map((w) => h('tr', {}, h('td', {}, w.host), h('td', {}, w.device), h('td', {}, w.python),
        h('td', {}, w.evaluation), h('td', {}, h('code', {}, String(w.source_sha256 || '').slice(0, 12))))))) : null);
}

// ---------------------------------------------------------------- samples
const PAGE = 50;

/** The address's offset as the route takes it: a whole number from 0, at most the largest
 * integer sent exactly (1e+23 is no offset; such a page is past the end anyway). */
function offsetOf(text) {
  const n = /^\s*\d+\s*$/.test(text || '') ? Number(text) : 0;
  return Number.isSafeInteger(n) ? n : Number.MAX_SAFE_INTEGER;
}

const REFUSED = { 404: 'Not found', 409: 'Conflict', 429: 'Rate limited' };

export async function samplesPage(app, runId, query, signal) {
  title('samples', runId);
  const wanted = {
    offset: offsetOf(query.get('offset')), limit: PAGE, failed: query.get('failed') === '1', q: query.get('q') || '',
    sort: query.get('sort') || '', with_input: query.get('inputs') === '1',
  };
  const body = h('div', { id: 'samples' }, h('p', { class: 'muted' }, 'Loading samples…'));
  put(app, h('h1', {}, 'Samples of ', link(['runs', runId], runId)), body);
  const path = `/v1/runs/${encodeURIComponent(runId)}/samples`;
  const [view, page] = await Promise.allSettled([
    api(`/v1/runs/${encodeURIComponent(runId)}`, {}, { signal }),
    api(path, { ...wanted, q: wanted.q || null, sort: wanted.sort || null }, { signal }),
  ]);
  if (signal.aborted) return; // left, or signed out (a revoked token)
  const metrics = view.status === 'fulfilled' ? Object.keys(view.value.stats || view.value.aggregate || {}).sort() : [];
  if (page.status === 'rejected') {
    const error = page.reason;
    if (!(error instanceof ApiError) || error.status >= 500) throw error;
    if (error.status !== 403) {
      // the address asked for something the route does not take (a bad sort, a search too
      // long): the API's own line, and the controls to ask again
      const box = notice('error', `${REFUSED[error.status] || 'Bad request'}: ${error.message}`,
        [`HTTP ${error.status}. Change the search or the sort below, or start again from `,
          link(['runs', runId, 'samples'], 'the first page'), '.']);
      box.id = 'samples-bad';
      put(body, box, sampleControls(runId, wanted, metrics));
      return;
    }
    const tier = view.status === 'fulfilled' ? view.value.tier : null;
    const lines = [error.message];
    if (tier === 'non_viewable') {
      lines.push('This run\'s split is non_viewable: evalq releases only its aggregates, through the Ladder, and never a single sample\'s output, score or error — not here, not through the API, not on the command line. The run\'s page shows what is released.');
    } else if (tier === 'no_access') {
      lines.push('This run\'s split is no_access: nothing of its samples is readable.');
    }
    put(body, notice('refused', 'No per-sample view', ...lines));
    body.querySelector('.notice').id = 'samples-refused';
    return;
  }
  put(body, sampleControls(runId, wanted, metrics), pager(runId, query, page.value, wanted.limit),
    sampleTable(runId, page.value.samples, wanted.with_input));
  performance.mark('evalq:samples'); // the first page of samples shown (bench/viewer.py reads it)
}

function sampleControls(runId, wanted, metrics) {
  const q = h('input', { type: 'search', id: 'sample-q', value: wanted.q, placeholder: 'search outputs, scores, errors', size: 30 });
  const failed = h('input', { type: 'checkbox', id: 'sample-failed', checked: wanted.failed });
  const inputs = h('input', { type: 'checkbox', id: 'sample-inputs', checked: wanted.with_input });
  const options = [h('option', { value: '' }, 'submission order')];
  for (const m of metrics) {
    options.push(h('option', { value: m, selected: wanted.sort === m }, `${m}, lowest first`));
    options.push(h('option', { value: `-${m}`, selected: wanted.sort === `-${m}` }, `${m}, highest first`));
  }
  const sort = h('select', { id: 'sample-sort' }, options);
  const form = h('form', { class: 'filters', id: 'sample-filters' },
    h('label', {}, 'search ', q), h('label', {}, failed, ' failures only'), h('label', {}, 'sort ', sort),
    h('label', {}, inputs, ' with inputs'), h('button', { type: 'submit' }, 'Apply'));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    if (q.value.trim()) next.set('q', q.value.trim());
    if (failed.checked) next.set('failed', '1');
    if (sort.value) next.set('sort', sort.value);
    if (inputs.checked) next.set('inputs', '1');
    location.hash = `#/runs/${encodeURIComponent(runId)}/samples` + (next.toString() ? '?' + next : '');
  });
  return form;
}

function pager(runId, query, page, limit) {
  const shown = page.samples.length;
  const to = (offset) => {
    const next = new URLSearchParams(query);
    next.set('offset', String(Math.max(0, offset)));
    return `#/runs/${encodeURIComponent(runId)}/samples?${next}`;
  };
  // the gateway may answer fewer than asked (it caps a page's bytes): the next page starts
  // where this one was cut, not a whole page on
  const after = page.offset + shown;
  const cut = shown > 0 && shown < limit && after < page.total;
  // past the end (an offset typed into the address): back to the last page there is
  const last = Math.max(0, Math.floor((page.total - 1) / PAGE) * PAGE);
  const back = page.offset >= page.total ? last : page.offset - PAGE;
  return h('p', { class: 'pager' },
    h('span', { id: 'page-range', 'data-total': page.total },
      shown ? `${count(page.offset + 1)}-${count(after)} of ${count(page.total)}` : `none of ${count(page.total)}`),
    cut ? h('span', { id: 'page-cut', class: 'muted' }, `page cut at ${count(shown)} samples (size)`) : null,
    page.offset > 0 ? h('a', { href: to(back), id: 'prev' }, page.offset >= page.total ? '← last page' : '← previous') : null,
    after < page.total && shown ? h('a', { href: to(after), id: 'next' }, 'next →') : null);
}

function scoresText(scores) {
  return scores ? Object.entries(scores).map(([k, v]) => `${k}=${+v.toFixed(4)}`).join(' ') : '';
}

function errorText(error) {
  return error ? `${error.stage}/${error.kind}: ${error.message}` : '';
}

/** What the model read, as text: the prompt (a local model's chat template applied), or the messages an endpoint chat task sent, as "role: content". */
function promptText(prompt) {
  return Array.isArray(prompt) ? prompt.map((m) => `${m.role}: ${m.content}`).join('\n') : prompt;
}

function sampleTable(runId, samples, withInput) {
  const head = ['sample', ...(withInput ? ['input', 'target'] : []), 'output', 'scores', 'error', 'tokens', 'grader'];
  const rows = samples.map((r) => h('tr', { 'data-sample': r.sample_id, class: r.error ? 'failed' : (r.scores ? '' : 'pending') },
    h('td', { class: 'num' }, link(['runs', runId, 'samples', r.sample_id], String(r.sample_id))),
    withInput ? h('td', { class: 'text input' }, r.prompt ? brief(promptText(r.prompt)) : brief(r.input)) : null,
    withInput ? h('td', { class: 'text target' }, brief(r.target)) : null,
    h('td', { class: 'text output' }, r.scores || r.output !== null ? brief(r.output) : (r.error ? '' : 'pending')),
    h('td', { class: 'scores' }, scoresText(r.scores)),
    h('td', { class: 'text error' }, errorText(r.error)),
    h('td', { class: 'num' }, r.usage ? `${r.usage.prompt_tokens}/${r.usage.completion_tokens}` : ''),
    h('td', { class: 'text' }, r.grade ? brief(r.grade.verdict, 60) : '')));
  return h('table', { class: 'rows samples', 'data-table': 'samples' },
    h('thead', {}, h('tr', {}, head.map((c) => h('th', {}, c)))), h('tbody', {}, rows));
}

export async function samplePage(app, runId, sampleId, signal) {
  title('sample', runId, sampleId);
  const body = h('div', { id: 'sample' });
  put(app, h('h1', {}, `Sample ${sampleId} of `, link(['runs', runId], runId)), body);
  let page;
  try {
    page = await api(`/v1/runs/${encodeURIComponent(runId)}/samples`, { ids: [sampleId], with_input: true }, { signal });
  } catch (error) {
    if (signal.aborted || !(error instanceof ApiError)) throw error;
    put(body, notice(error.status === 403 ? 'refused' : 'error', error.status === 403 ? 'No per-sample view' : `${REFUSED[error.status] || 'Bad request'} (HTTP ${error.status})`, error.message));
    return;
  }
  const r = page.samples[0];
  if (!r) { put(body, notice('error', 'No such sample', `Run ${runId} has no sample ${sampleId}.`)); return; }
  const block = (label, value, id) => value === null || value === undefined ? null :
    h('section', { id }, h('h2', {}, label), h('pre', {}, pretty(value)));
  put(body,
    h('p', {}, link(['runs', runId, 'samples'], '← all samples')),
    r.prompt ? block(Array.isArray(r.prompt)
      ? 'Prompt (the messages the model was sent, few-shot examples included; its server applied its chat template)'
      : 'Prompt (the text the model read: few-shot examples included, a local model\'s chat template applied)',
      promptText(r.prompt), 'sample-prompt') : null,
    block('Input (the row, labels included)', r.input, 'sample-input'),
    block('Target', r.target, 'sample-target'),
    block('Output', r.output, 'sample-output'),
    block('Scores', r.scores, 'sample-scores'),
    block('Error', r.error ? errorText(r.error) : null, 'sample-error'),
    block('Tokens', r.usage, 'sample-usage'),
    r.grade ? block('Grader', r.grade, 'sample-grade') : null);
}
