// A sweep's metric against its parameter, and the paired comparison of runs.
import { api, session } from './api.js';
import { forestPlot, intervalChart } from './charts.js';
import { count, h, interval, link, modelName, notice, num, put } from './dom.js';

function settings(meta) {
  return { ...(meta.model ? { model: meta.model } : {}), ...meta.params };
}

function ordered(values) {
  const numeric = values.every((v) => v !== '' && Number.isFinite(Number(v)));
  return [...new Set(values)].sort((a, b) => (numeric ? Number(a) - Number(b) : a.localeCompare(b)));
}

const SWEEP_LIMIT = 256;

export async function sweepPage(app, sweep, query, signal) {
  document.title = `evalq · sweep ${sweep}`;
  // sweep ids are picked by callers, so two principals may share one: the route names whose
  // sweep it is, and an admin (who reads every principal's runs) asks for that principal's only;
  // a user's answer is its own runs anyway
  const who = session.who;
  const admin = who?.role === 'admin';
  const principal = admin ? (query.get('principal') || '') : (who?.principal || '');
  const views = await api('/v1/runs', { sweep, limit: SWEEP_LIMIT, principal: admin ? principal : null }, { signal });
  const body = h('div', { id: 'sweep' });
  const owners = [...new Set(views.map((v) => v.meta.principal))].sort();
  const whose = principal || (owners.length === 1 ? owners[0] : '');
  put(app, h('h1', {}, 'Sweep ', h('code', {}, sweep), whose ? [' of ', h('span', { id: 'sweep-principal' }, whose)] : null), body);
  if (!views.length) { put(body, notice('error', 'No runs', `No run of sweep ${sweep}${whose ? ` of ${whose}` : ''} is readable with this token.`)); return; }
  if (owners.length > 1) {
    const box = notice('info', 'Several principals use this sweep id',
      'Sweep ids are chosen by whoever submits, so these are different sweeps; pick one principal\'s:',
      owners.map((p, i) => [i ? ', ' : '', link(['sweeps', sweep], p, { principal: p })]));
    box.id = 'sweep-owners';
    put(body, box);
    return;
  }
  const keys = [...new Set(views.flatMap((v) => Object.keys(settings(v.meta))))].sort();
  const varying = keys.filter((k) => new Set(views.map((v) => settings(v.meta)[k] ?? '')).size > 1);
  const metrics = [...new Set(views.flatMap((v) => Object.keys(v.stats || v.aggregate || {})))].sort();
  const param = h('select', { id: 'sweep-param' }, (varying.length ? varying : keys).map((k) => h('option', { value: k }, k)));
  const metric = h('select', { id: 'sweep-metric' }, metrics.map((k) => h('option', { value: k }, k)));
  const chart = h('div', { id: 'sweep-chart' });
  const table = h('div', {});
  const draw = () => {
    const x = param.value;
    const m = metric.value;
    const others = varying.filter((k) => k !== x);
    // one point per run; runs that differ in another swept key are labelled with it
    const points = views.map((v) => {
      const st = (v.stats || {})[m];
      const own = settings(v.meta);
      const label = [own[x] ?? '', ...others.map((k) => `${k}=${own[k] ?? ''}`)].join(' ');
      return { label, key: own[x] ?? '', mean: st ? st.mean : (v.aggregate || {})[m], low: st?.ci95?.[0], high: st?.ci95?.[1], view: v };
    });
    const order = ordered(points.map((p) => p.key));
    points.sort((a, b) => order.indexOf(a.key) - order.indexOf(b.key) || a.label.localeCompare(b.label));
    put(chart, m ? intervalChart(points, { name: 'sweep', xLabel: x, yLabel: `${m} (95% interval)` })
      : notice('info', 'No metric yet', 'The runs have no released aggregate yet.'));
    put(table, h('table', { class: 'rows', 'data-table': 'sweep' },
      h('thead', {}, h('tr', {}, [x, 'run', 'status', m, '95% interval', 'n'].map((c) => h('th', {}, c)))),
      h('tbody', {}, points.map((p) => {
        const st = (p.view.stats || {})[m];
        return h('tr', { 'data-run': p.view.meta.run_id },
          h('td', {}, p.label), h('td', {}, link(['runs', p.view.meta.run_id], p.view.meta.run_id)),
          h('td', {}, p.view.meta.status), h('td', { class: 'num' }, num(p.mean)),
          h('td', { class: 'num' }, st?.ci95 ? interval(st.ci95) : (p.view.withheld || '')),
          h('td', { class: 'num' }, st ? count(st.n) : ''));
      }))));
  };
  param.addEventListener('change', draw);
  metric.addEventListener('change', draw);
  const ids = views.filter((v) => v.meta.status === 'completed').map((v) => v.meta.run_id);
  put(body,
    views.length >= SWEEP_LIMIT ? h('p', { class: 'muted', id: 'sweep-limit' }, `showing the newest ${count(SWEEP_LIMIT)} runs of this sweep`) : null,
    h('p', { class: 'filters' }, h('label', {}, 'parameter ', param), ' ', h('label', {}, 'metric ', metric), ' ',
      ids.length > 1 ? link(['compare'], 'compare its runs', { runs: ids.join(',') }) : null),
    chart, table);
  draw();
}

export async function comparePage(app, query, signal) {
  const runs = (query.get('runs') || '').split(',').map((r) => r.trim()).filter(Boolean);
  document.title = `evalq · compare ${runs.join(' ')}`;
  const body = h('div', { id: 'compare' });
  put(app, h('h1', {}, 'Comparison'), body);
  if (runs.length < 2) { put(body, notice('error', 'Two runs or more', 'Pick two or more runs: #/compare?runs=A,B')); return; }
  let found;
  try {
    found = await api('/v1/compare', { run: runs, flips: 50 }, { signal });
  } catch (error) {
    if (signal.aborted) throw error; // left, or signed out
    put(body, notice(error.status === 403 ? 'refused' : 'error', 'No comparison', error.message));
    body.querySelector('.notice').id = 'compare-refused';
    return;
  }
  const base = found.baseline;
  // each run by its task and what it ran with (two tasks' runs on one model told apart)
  const about = (run) => [found.tasks?.[run], (found.runs?.[run] || '').replace(/model=\S+/, (m) => `model=${modelName(m.slice(6))}`)]
    .filter(Boolean).join(' · ');
  const named = (run) => `${run}${about(run) ? ` (${about(run)})` : ''}`;
  const sections = [h('p', {}, 'Each run against the baseline ', link(['runs', base], base),
    about(base) ? ` (${about(base)})` : '', ', sample by sample: the mean paired difference with its 95% interval.')];
  for (const [metric, deltas] of Object.entries(found.metrics)) {
    const rows = Object.entries(deltas).map(([run, d]) => ({ label: run, delta: d.delta, low: d.ci95?.[0], high: d.ci95?.[1], d }));
    sections.push(h('section', { class: 'metric', 'data-metric': metric },
      h('h2', {}, metric),
      forestPlot(rows, { name: `forest-${metric}` }),
      h('table', { class: 'rows', 'data-table': `deltas-${metric}` },
        h('thead', {}, h('tr', {}, ['run', 'difference', '95% interval', 'p (McNemar)', 'paired', 'fixed', 'broken', 'own mean', 'own 95% interval']
          .map((c) => h('th', {}, c)))),
        h('tbody', {}, rows.map(({ label, d }) => {
          const own = found.stats?.[metric]?.[label];
          return h('tr', { 'data-run': label, 'data-delta': d.delta },
            h('td', {}, link(['runs', label], named(label))),
            h('td', { class: 'num delta' }, `${d.delta >= 0 ? '+' : ''}${num(d.delta)}`),
            h('td', { class: 'num ci' }, d.ci95 ? interval(d.ci95) : ''),
            h('td', { class: 'num' }, d.p_value === null || d.p_value === undefined ? '' : num(d.p_value)),
            h('td', { class: 'num' }, count(d.n_paired)),
            h('td', { class: 'num' }, count(d.flips?.[0])), h('td', { class: 'num' }, count(d.flips?.[1])),
            h('td', { class: 'num' }, own ? num(own.mean) : ''), h('td', { class: 'num' }, own?.ci95 ? interval(own.ci95) : ''));
        }))),
      flipsTable(base, metric, found.flips?.[metric] || {}, named)));
  }
  put(body, sections);
}

function flipsTable(base, metric, flips, named) {
  const rows = [];
  for (const [run, f] of Object.entries(flips)) {
    for (const [kind, ids] of [['fixed', f.fixed], ['broken', f.broken]]) {
      for (const id of ids) {
        rows.push(h('tr', { 'data-sample': id, 'data-kind': kind, 'data-run': run },
          h('td', {}, kind), h('td', { class: 'num' }, String(id)),
          h('td', {}, link(['runs', base, 'samples', id], `baseline ${base}`)),
          h('td', {}, link(['runs', run, 'samples', id], named(run)))));
      }
    }
  }
  if (!rows.length) return h('p', { class: 'muted' }, 'No sample flipped.');
  return h('details', { open: true }, h('summary', {}, `Flipped samples (${rows.length})`),
    h('table', { class: 'rows', 'data-table': `flips-${metric}` },
      h('thead', {}, h('tr', {}, ['flip', 'sample', 'in the baseline', 'in the run'].map((c) => h('th', {}, c)))),
      h('tbody', {}, rows)));
}
