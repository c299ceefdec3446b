// Hand-drawn SVG charts: a metric with its 95% intervals against a parameter, and a forest
// plot of paired differences. Labels go in as text nodes.

import { num, s } from './dom.js';

function ticks(low, high, count = 5) {
  const span = high - low || 1;
  const step0 = span / count;
  const power = 10 ** Math.floor(Math.log10(step0));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((m) => m >= step0) ?? step0;
  const out = [];
  for (let t = Math.ceil(low / step) * step; t <= high + step * 1e-9; t += step) out.push(+t.toFixed(12));
  return out;
}

function range(values, include = []) {
  const found = values.filter((v) => typeof v === 'number' && Number.isFinite(v)).concat(include);
  let low = Math.min(...found);
  let high = Math.max(...found);
  if (!Number.isFinite(low)) [low, high] = [0, 1];
  const pad = (high - low || Math.abs(high) || 1) * 0.08;
  return [low - pad, high + pad];
}

/** Points with 95% intervals over categories (a sweep's parameter values), joined by a line. */
export function intervalChart(points, { name = 'sweep', xLabel = '', yLabel = '' } = {}) {
  const width = 680, height = 300, left = 64, right = 16, top = 16, bottom = 56;
  const [low, high] = range(points.flatMap((p) => [p.mean, p.low, p.high]));
  const y = (v) => top + (height - top - bottom) * (1 - (v - low) / (high - low));
  const step = (width - left - right) / Math.max(1, points.length);
  const x = (i) => left + step * (i + 0.5);
  const svg = s('svg', {
    class: 'chart', viewBox: `0 0 ${width} ${height}`, width, height, role: 'img',
    'data-chart': name, 'aria-label': `${yLabel} against ${xLabel}`,
  });
  for (const t of ticks(low, high)) {
    svg.append(s('line', { class: 'grid', x1: left, x2: width - right, y1: y(t), y2: y(t) }));
    svg.append(s('text', { class: 'tick', x: left - 6, y: y(t) + 4, 'text-anchor': 'end' }, num(t, 3)));
  }
  svg.append(s('line', { class: 'axis', x1: left, x2: left, y1: top, y2: height - bottom }));
  svg.append(s('line', { class: 'axis', x1: left, x2: width - right, y1: height - bottom, y2: height - bottom }));
  const line = points.map((p, i) => `${x(i)},${y(p.mean)}`).filter((_, i) => Number.isFinite(points[i].mean));
  if (line.length > 1) svg.append(s('polyline', { class: 'trend', points: line.join(' ') }));
  points.forEach((p, i) => {
    svg.append(s('text', { class: 'tick', x: x(i), y: height - bottom + 18, 'text-anchor': 'middle' }, p.label));
    if (!Number.isFinite(p.mean)) return;
    const group = s('g', {
      class: 'point', 'data-label': p.label, 'data-mean': p.mean,
      'data-low': p.low ?? '', 'data-high': p.high ?? '',
    });
    if (Number.isFinite(p.low) && Number.isFinite(p.high)) {
      group.append(
        s('line', { class: 'bar', x1: x(i), x2: x(i), y1: y(p.low), y2: y(p.high) }),
        s('line', { class: 'bar', x1: x(i) - 6, x2: x(i) + 6, y1: y(p.low), y2: y(p.low) }),
        s('line', { class: 'bar', x1: x(i) - 6, x2: x(i) + 6, y1: y(p.high), y2: y(p.high) }),
      );
    }
    group.append(s('circle', { class: 'dot', cx: x(i), cy: y(p.mean), r: 5 }),
      s('title', {}, `${xLabel} ${p.label}: ${num(p.mean)} (95% ${num(p.low)} to ${num(p.high)})`));
    svg.append(group);
  });
  svg.append(s('text', { class: 'label', x: (left + width - right) / 2, y: height - 12, 'text-anchor': 'middle' }, xLabel));
  svg.append(s('text', {
    class: 'label', x: 14, y: (top + height - bottom) / 2, 'text-anchor': 'middle',
    transform: `rotate(-90 14 ${(top + height - bottom) / 2})`,
  }, yLabel));
  return svg;
}

/** A forest plot: each row's difference with its 95% interval, and the zero line. */
export function forestPlot(rows, { name = 'forest' } = {}) {
  const width = 680, rowHeight = 34, left = 170, right = 210, top = 12, bottom = 34;
  const height = top + bottom + rowHeight * rows.length;
  const [low, high] = range(rows.flatMap((r) => [r.delta, r.low, r.high]), [0]);
  const x = (v) => left + (width - left - right) * ((v - low) / (high - low));
  const svg = s('svg', {
    class: 'chart', viewBox: `0 0 ${width} ${height}`, width, height, role: 'img', 'data-chart': name,
  });
  for (const t of ticks(low, high, 4)) {
    svg.append(s('line', { class: 'grid', x1: x(t), x2: x(t), y1: top, y2: height - bottom }));
    svg.append(s('text', { class: 'tick', x: x(t), y: height - bottom + 16, 'text-anchor': 'middle' }, num(t, 3)));
  }
  svg.append(s('line', { class: 'zero', x1: x(0), x2: x(0), y1: top, y2: height - bottom }));
  rows.forEach((r, i) => {
    const cy = top + rowHeight * (i + 0.5);
    const group = s('g', {
      class: 'row', 'data-label': r.label, 'data-delta': r.delta, 'data-low': r.low ?? '', 'data-high': r.high ?? '',
    });
    group.append(s('text', { class: 'name', x: left - 8, y: cy + 4, 'text-anchor': 'end' }, r.label));
    if (Number.isFinite(r.low) && Number.isFinite(r.high)) {
      group.append(s('line', { class: 'bar', x1: x(r.low), x2: x(r.high), y1: cy, y2: cy }));
    }
    group.append(s('rect', { class: 'dot', x: x(r.delta) - 5, y: cy - 5, width: 10, height: 10 }));
    const shown = `${r.delta >= 0 ? '+' : ''}${num(r.delta)}` +
      (Number.isFinite(r.low) ? ` (${num(r.low)} to ${num(r.high)})` : '');
    group.append(s('text', { class: 'value', x: width - right + 10, y: cy + 4 }, shown));
    svg.append(group);
  });
  return svg;
}
