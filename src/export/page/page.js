// gpushim's page: draws the data in #gpushim-data. Strings from the trace go on the page only
// as text (textContent, attribute values), never as markup.
(function () {
  'use strict';
  const D = JSON.parse(document.getElementById('gpushim-data').textContent);
  const NS = 'http://www.w3.org/2000/svg';
  const KIND_COLOR = {
    parameter: '#4e79a7', gradient: '#f28e2b', optimizer_state: '#b07aa1',
    activation: '#59a14f', temporary: '#a0cbe8', input: '#9c755f',
    workspace: '#76b7b2', communication: '#edc948', unknown: '#bab0ac',
  };
  const KIND_NAME = {};
  D.kinds.forEach(function (k) { KIND_NAME[k.id] = k.name; });
  const W = 1100, H = 430, L = 74, R = 16, T = 26, B = 52;

  // Every number the script loops or indexes on, bounded by what it draws: arrays as long as
  // the columns, sizes finite and not negative, the columns before the ring within them (the
  // data may come from anyone's saved analysis).
  function finite(a, n) {
    const out = new Array(n).fill(0);
    if (Array.isArray(a)) for (let i = 0; i < Math.min(n, a.length); i++) {
      const v = Number(a[i]);
      out[i] = isFinite(v) && v > 0 ? v : 0;
    }
    return out;
  }
  function wholeLane(lane) {
    const c = lane.columns;
    const n = Array.isArray(c.change) ? c.change.length : 0;
    ['change', 'time_ns', 'live', 'reserved', 'nvml'].forEach(function (k) { c[k] = finite(c[k], n); });
    c.kinds = D.kinds.map(function (k, i) { return finite((c.kinds || [])[i], n); });
    lane.lines = (lane.lines || []).map(function (l) { l.bytes = finite(l.bytes, n); return l; });
    lane.other_lines = finite(lane.other_lines, n);
    const b = Math.floor(Number(lane.before_ring));
    lane.before_ring = isFinite(b) ? Math.max(0, Math.min(n, b)) : 0;
    const inside = function (m) { return m && isFinite(m.column) && m.column >= 0 && m.column < n; };
    if (!inside(lane.peak)) lane.peak = null;
    lane.failures = (lane.failures || []).filter(inside);
    lane.steps = (lane.steps || []).filter(inside);
  }
  D.traces.forEach(function (t) { t.lanes.forEach(wholeLane); });

  // Every device of every trace, one lane each.
  const lanes = [];
  D.traces.forEach(function (t, ti) {
    t.lanes.forEach(function (lane) { lanes.push({ t: t, ti: ti, lane: lane }); });
  });
  const state = { lane: 0, view: 'kind', axis: 'changes', show: 'all', bands: [], geom: null };

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    if (attrs) for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function sv(tag, attrs, text) {
    const e = document.createElementNS(NS, tag);
    if (attrs) for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function bytes(n) {
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let v = n, i = 0;
    while (v >= 1024 && i + 1 < u.length) { v /= 1024; i++; }
    return i === 0 ? n + ' B' : v.toFixed(2) + ' ' + u[i];
  }
  function dur(ns) {
    if (ns >= 1e9) return (ns / 1e9).toFixed(2) + ' s';
    if (ns >= 1e6) return (ns / 1e6).toFixed(2) + ' ms';
    if (ns >= 1e3) return (ns / 1e3).toFixed(1) + ' µs';
    return ns + ' ns';
  }
  function kindName(k) { return k ? (KIND_NAME[k] || k) : 'not a tensor'; }
  function shade(hex, f) {
    const n = parseInt(hex.slice(1), 16);
    const c = [n >> 16, (n >> 8) & 255, n & 255].map(function (x) {
      return Math.max(0, Math.min(255, Math.round(f > 0 ? x + (255 - x) * f : x * (1 + f))));
    });
    return '#' + c.map(function (x) { return x.toString(16).padStart(2, '0'); }).join('');
  }

  // The bands of a lane in the view asked for, bottom first: {name, key, color, values, line?}.
  function bandsOf(lane, view) {
    const c = lane.columns, n = c.change.length, out = [];
    const zero = function () { return new Array(n).fill(0); };
    if (view === 'kind') {
      D.kinds.forEach(function (k, i) {
        const v = c.kinds[i];
        if (v && v.some(function (x) { return x > 0; })) {
          out.push({ name: k.name, key: 'kind:' + k.id, kind: k.id, color: KIND_COLOR[k.id], values: v });
        }
      });
      const other = zero(), early = zero();
      for (let i = 0; i < n; i++) {
        let s = 0; c.kinds.forEach(function (k) { s += k[i]; });
        (i < lane.before_ring ? early : other)[i] = Math.max(0, c.live[i] - s);
      }
      if (lane.before_ring > 0) {
        out.push({ name: 'live before the ring\u2019s detail (kinds not kept)', key: 'early', color: '#c9b98f', values: early });
      }
      if (other.some(function (x) { return x > 0; })) {
        out.push({
          name: lane.tensors_recorded ? 'other allocations (libraries, the program\u2019s own)' : 'allocations',
          key: 'other', color: '#86bcb6', values: other,
        });
      }
    } else {
      const seen = {};
      lane.lines.forEach(function (l, li) {
        const base = l.kind ? KIND_COLOR[l.kind] : '#86bcb6';
        seen[l.kind] = (seen[l.kind] || 0) + 1;
        const f = [0, 0.35, -0.25, 0.55, -0.4, 0.2][(seen[l.kind] - 1) % 6];
        out.push({ name: l.label, key: 'line:' + li, kind: l.kind, color: shade(base, f), values: l.bytes, line: l });
      });
      const other = lane.other_lines.slice(), early = zero();
      for (let i = 0; i < lane.before_ring; i++) { early[i] = other[i]; other[i] = 0; }
      if (lane.before_ring > 0) {
        out.push({ name: 'live before the ring\u2019s detail (lines not kept)', key: 'early', color: '#c9b98f', values: early });
      }
      if (other.some(function (x) { return x > 0; })) {
        out.push({ name: 'other lines', key: 'other', color: '#d4d4d4', values: other });
      }
    }
    const cached = zero(), outside = zero();
    for (let i = 0; i < n; i++) {
      cached[i] = Math.max(0, c.reserved[i] - c.live[i]);
      outside[i] = c.nvml[i] > 0 ? Math.max(0, c.nvml[i] - c.reserved[i]) : 0;
    }
    if (cached.some(function (x) { return x > 0; })) {
      out.push({
        name: lane.tensors_recorded ? 'PyTorch\u2019s cache, unused' : 'held by a pool, unused',
        key: 'cached', color: '#ececec', values: cached,
      });
    }
    if (state.show === 'all' && outside.some(function (x) { return x > 0; })) {
      out.push({ name: 'no allocating call (CUDA context, module code)', key: 'outside', color: '#9a9a9a', values: outside });
    }
    return out;
  }

  function xScale(lane, axis) {
    const c = lane.columns, n = c.change.length;
    if (axis === 'time' && n > 1) {
      const t0 = c.time_ns[0], t1 = Math.max(t0 + 1, c.time_ns[n - 1]);
      return function (i) { return L + (W - L - R) * (c.time_ns[i] - t0) / (t1 - t0); };
    }
    return function (i) { return n > 1 ? L + (W - L - R) * i / (n - 1) : L + (W - L - R) / 2; };
  }

  // A round step for an axis of bytes: 1, 2 or 5 times a power of ten of a binary unit.
  function niceStep(raw) {
    let unit = 1;
    while (raw >= 1024 * unit * 0.75 && unit < Math.pow(1024, 5)) unit *= 1024;
    const r = raw / unit;
    const p = Math.pow(10, Math.floor(Math.log10(r)));
    const m = r / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p * unit;
  }
  function short(s, n) { return s.length > n ? s.slice(0, n - 1) + '\u2026' : s; }

  function draw() {
    const item = lanes[state.lane];
    const lane = item.lane, c = lane.columns, n = c.change.length;
    const svg = document.getElementById('chart');
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const bands = bandsOf(lane, state.view);
    state.bands = bands;
    // Stack the bands.
    const y0 = new Array(n).fill(0);
    bands.forEach(function (b) {
      b.lo = y0.slice();
      for (let i = 0; i < n; i++) y0[i] += b.values[i];
      b.hi = y0.slice();
    });
    let ymax = 1;
    const withNvml = state.show === 'all';
    for (let i = 0; i < n; i++) ymax = Math.max(ymax, y0[i], c.reserved[i], withNvml ? c.nvml[i] : 0);
    const limit = lane.device_total_bytes;
    const limitShown = withNvml && limit > 0 && limit <= ymax * 1.6;
    if (limitShown) ymax = Math.max(ymax, limit);
    const ystep = niceStep(ymax / 5);
    ymax = Math.ceil(ymax * 1.04 / ystep) * ystep;
    const x = xScale(lane, state.axis);
    const y = function (b) { return T + (H - T - B) * (1 - b / ymax); };
    state.geom = { x: x, y: y, ymax: ymax, n: n };
    // Grid and y axis.
    const g = sv('g', { class: 'axis' });
    for (let v = 0; v <= ymax + 1; v += ystep) {
      g.appendChild(sv('line', { x1: L, x2: W - R, y1: y(v), y2: y(v) }));
      g.appendChild(sv('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end' }, bytes(v)));
    }
    svg.appendChild(g);
    if (lane.before_ring > 0) {
      const x1 = x(lane.before_ring - 1) + 0.5;
      svg.appendChild(sv('rect', { x: L, y: T, width: Math.max(0, x1 - L), height: H - T - B, fill: '#f3f0e6' }));
      svg.appendChild(sv('text', { class: 'title', x: L + 4, y: T + 12 }, 'before the ring: totals only'));
    }
    // The bands.
    bands.forEach(function (b) {
      let d = '';
      for (let i = 0; i < n; i++) d += (i ? 'L' : 'M') + x(i).toFixed(1) + ',' + y(b.hi[i]).toFixed(1);
      for (let i = n - 1; i >= 0; i--) d += 'L' + x(i).toFixed(1) + ',' + y(b.lo[i]).toFixed(1);
      const p = sv('path', { d: d + 'Z', fill: b.color, class: 'band', 'data-band': b.key, 'data-name': b.name });
      b.el = p;
      svg.appendChild(p);
    });
    // Reserved, NVML and the device's limit.
    function polyline(vals, attrs) {
      let d = '';
      for (let i = 0; i < n; i++) if (vals[i] > 0 || d) d += (d ? 'L' : 'M') + x(i).toFixed(1) + ',' + y(vals[i]).toFixed(1);
      if (d) svg.appendChild(sv('path', Object.assign({ d: d, fill: 'none' }, attrs)));
    }
    polyline(c.reserved, { stroke: '#333', 'stroke-width': 1.2, 'stroke-dasharray': '5 3', 'data-line': 'reserved' });
    if (withNvml && c.nvml.some(function (v) { return v > 0; })) {
      polyline(c.nvml, { stroke: '#c0392b', 'stroke-width': 1.4, 'data-line': 'nvml' });
    }
    if (limitShown) {
      svg.appendChild(sv('line', { x1: L, x2: W - R, y1: y(limit), y2: y(limit), stroke: '#c0392b', 'stroke-dasharray': '2 3' }));
      svg.appendChild(sv('text', { class: 'title', x: W - R - 4, y: y(limit) - 4, 'text-anchor': 'end' }, 'device: ' + bytes(limit)));
    }
    // The peak and the failures.
    if (lane.peak) {
      const px = x(lane.peak.column), py = y(lane.peak.bytes);
      svg.appendChild(sv('circle', { cx: px, cy: py, r: 4, fill: '#000', 'data-mark': 'peak' }));
      svg.appendChild(sv('text', {
        class: 'title', x: px + (px > W - 200 ? -8 : 8), y: Math.max(T + 10, py - 6),
        'text-anchor': px > W - 200 ? 'end' : 'start',
      }, 'peak ' + bytes(lane.peak.bytes) + ' live'));
    }
    lane.failures.forEach(function (f) {
      const fx = x(Math.min(f.column, n - 1));
      const m = sv('path', { d: 'M' + (fx - 5) + ',' + (T - 12) + 'l10,0l-5,9Z', fill: '#c0392b', 'data-mark': 'failure' });
      m.appendChild(sv('title', {}, 'failed: ' + f.api + ' of ' + bytes(f.requested_bytes) + ' at ' + dur(f.time_ns)));
      svg.appendChild(m);
      svg.appendChild(sv('line', { x1: fx, x2: fx, y1: T - 3, y2: H - B, stroke: '#c0392b', 'stroke-width': 0.6 }));
    });
    // The x axis: steps where the run has them, else changes or time.
    const ax = sv('g', { class: 'axis' });
    ax.appendChild(sv('line', { x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: '#999' }));
    if (lane.steps.length > 1) {
      const every = Math.max(1, Math.ceil(lane.steps.length / 20));
      lane.steps.forEach(function (st, s) {
        const sx = x(st.column);
        ax.appendChild(sv('line', { x1: sx, x2: sx, y1: H - B, y2: H - B + (s % every ? 3 : 6), stroke: '#999', 'data-step': st.n }));
        if (s % every === 0) ax.appendChild(sv('text', { x: sx, y: H - B + 17, 'text-anchor': 'middle' }, String(st.n)));
      });
      ax.appendChild(sv('text', { x: (L + W - R) / 2, y: H - 8, 'text-anchor': 'middle' },
        'iteration (' + short(lane.step_name || 'detected', 70) + ')' + (state.axis === 'time' ? ', placed by time' : ', each as wide as the memory it moves')));
    } else {
      const last = n - 1;
      [0, 0.25, 0.5, 0.75, 1].forEach(function (f) {
        const i = Math.round(last * f);
        const label = state.axis === 'time' ? dur(c.time_ns[i] - c.time_ns[0]) : String(c.change[i]);
        ax.appendChild(sv('text', { x: x(i), y: H - B + 17, 'text-anchor': 'middle' }, label));
      });
      ax.appendChild(sv('text', { x: (L + W - R) / 2, y: H - 8, 'text-anchor': 'middle' },
        state.axis === 'time' ? 'time since the first allocation' : 'allocations and frees so far (start-up and pauses take no width)'));
    }
    svg.appendChild(ax);
    svg.appendChild(sv('rect', { id: 'hover', x: L, y: T, width: W - L - R, height: H - T - B, fill: 'transparent' }));
    svg.appendChild(sv('line', { id: 'cross', x1: 0, x2: 0, y1: T, y2: H - B, stroke: '#555', 'stroke-width': 0.7, visibility: 'hidden' }));
    legend(bands, c, limitShown, lane.failures.length);
  }

  function legend(bands, c, limitShown, failures) {
    const lg = document.getElementById('legend');
    lg.textContent = '';
    bands.slice().reverse().forEach(function (b) {
      const s = el('span', { 'data-legend': b.key });
      const sw = el('span', { class: 'sw' });
      sw.style.background = b.color;
      s.appendChild(sw);
      s.appendChild(document.createTextNode(b.kind && state.view === 'line' ? b.name + ' (' + kindName(b.kind) + ')' : b.name));
      lg.appendChild(s);
    });
    lg.appendChild(el('span', {}, '- - reserved'));
    if (state.show === 'all' && c.nvml.some(function (v) { return v > 0; })) lg.appendChild(el('span', { style: 'color:#c0392b' }, '\u2014 NVML (the process)'));
    if (limitShown) lg.appendChild(el('span', { style: 'color:#c0392b' }, '\u00b7\u00b7 device memory'));
    if (failures) {
      lg.appendChild(el('span', { style: 'color:#c0392b', 'data-legend': 'failure' },
        '\u25bc failed allocation' + (failures > 1 ? 's (' + failures + ')' : '') + ': hover the mark, or see Failed allocations below'));
    }
  }

  // The column and band under a point of the chart.
  function at(evt) {
    const svg = document.getElementById('chart');
    const r = svg.getBoundingClientRect();
    const sx = (evt.clientX - r.left) * W / r.width, sy = (evt.clientY - r.top) * H / r.height;
    const g = state.geom;
    let best = 0, bd = Infinity;
    // Columns are few (at most 1,200): a scan is fast enough.
    for (let i = 0; i < g.n; i++) {
      const d = Math.abs(g.x(i) - sx);
      if (d < bd) { bd = d; best = i; }
    }
    const v = g.ymax * (1 - (sy - T) / (H - T - B));
    let band = null;
    state.bands.forEach(function (b) { if (v >= b.lo[best] && v < b.hi[best]) band = b; });
    return { i: best, band: band, sx: sx };
  }

  function linesOfKind(lane, kind, i) {
    return lane.lines.filter(function (l) { return l.kind === kind && l.bytes[i] > 0; })
      .sort(function (a, b) { return b.bytes[i] - a.bytes[i]; });
  }

  function stepOf(lane, i) {
    let s = 0;
    lane.steps.forEach(function (st) { if (st.column <= i) s = st.n; });
    return s;
  }

  function hover(evt) {
    const lane = lanes[state.lane].lane, c = lane.columns;
    const h = at(evt);
    const tip = document.getElementById('tip');
    tip.textContent = '';
    const i = h.i;
    const head = (i < lane.before_ring ? 'before the ring\u2019s detail, ' : '') + 'at ' + dur(c.time_ns[i]) +
      (lane.steps.length > 1 ? ', iteration ' + stepOf(lane, i) : '');
    tip.appendChild(el('div', { class: 'h' }, head));
    if (h.band) {
      const b = h.band;
      const row = el('div', { class: 'row' });
      row.appendChild(el('span', { 'data-tip': 'band' }, b.name));
      row.appendChild(el('span', {}, bytes(b.values[i])));
      tip.appendChild(row);
      if (b.line) {
        tip.appendChild(el('div', { class: 'line' }, kindName(b.kind) + '; click for its whole stack'));
      } else if (b.kind) {
        linesOfKind(lane, b.kind, i).slice(0, 3).forEach(function (l) {
          tip.appendChild(el('div', { class: 'line', 'data-tip': 'line' }, bytes(l.bytes[i]) + '  ' + l.label));
        });
      }
    }
    [['live', c.live[i]], ['reserved', c.reserved[i]], ['NVML', c.nvml[i]]].forEach(function (p) {
      if (p[1] > 0) {
        const row = el('div', { class: 'row' });
        row.appendChild(el('span', {}, p[0]));
        row.appendChild(el('span', {}, bytes(p[1])));
        tip.appendChild(row);
      }
    });
    state.bands.forEach(function (b) { b.el.classList.toggle('dim', !!h.band && b !== h.band); });
    const cross = document.getElementById('cross');
    const cx = state.geom.x(i);
    cross.setAttribute('x1', cx); cross.setAttribute('x2', cx); cross.setAttribute('visibility', 'visible');
    const wrap = document.getElementById('chart-wrap').getBoundingClientRect();
    tip.style.display = 'block';
    const left = evt.clientX - wrap.left + 14;
    tip.style.left = Math.min(left, wrap.width - 470) + 'px';
    tip.style.top = (evt.clientY - wrap.top + 14) + 'px';
  }

  function leave() {
    document.getElementById('tip').style.display = 'none';
    document.getElementById('cross').setAttribute('visibility', 'hidden');
    state.bands.forEach(function (b) { b.el.classList.remove('dim'); });
  }

  function click(evt) {
    const lane = lanes[state.lane].lane;
    const h = at(evt);
    const box = document.getElementById('detail');
    box.textContent = '';
    if (!h.band) { box.textContent = 'Click a band to see its lines and their stacks.'; return; }
    const i = h.i, b = h.band;
    let text = b.name + ': ' + bytes(b.values[i]) + ' at ' + dur(lane.columns.time_ns[i]) + '\n';
    const lines = b.line ? [b.line] : (b.kind ? linesOfKind(lane, b.kind, i) : []);
    if (!lines.length) text += '\n(no line of its own: ' + (b.key === 'cached' ? 'memory PyTorch keeps for tensors to come' : 'not one of the lines drawn') + ')';
    lines.forEach(function (l) {
      text += '\n' + bytes(l.bytes[i]) + '  ' + l.label + '  [' + kindName(l.kind) + ']\n';
      (l.frames.length ? l.frames : ['(no stack recorded)']).forEach(function (f) { text += '    ' + f + '\n'; });
    });
    box.textContent = text;
  }

  // A table; `cls` gives each column's class: 'n' numbers, 'k' short words, else a line.
  function table(head, rows, cls) {
    const t = el('table');
    const tr = el('tr');
    head.forEach(function (h, k) { tr.appendChild(el('th', { class: cls[k] || 'site' }, h)); });
    t.appendChild(tr);
    rows.forEach(function (r) {
      const row = el('tr');
      r.forEach(function (v, k) { row.appendChild(el('td', { class: cls[k] || 'site' }, v)); });
      t.appendChild(row);
    });
    return t;
  }

  function panels() {
    const item = lanes[state.lane], t = item.t, lane = item.lane;
    const box = document.getElementById('panels');
    box.textContent = '';
    // Growing lines.
    const grow = el('div', { class: 'panel', id: 'growing' });
    grow.appendChild(el('h2', {}, 'Growing every iteration'));
    if (t.growing.length) {
      grow.appendChild(el('div', { class: 'sub' }, t.iterations.count + ' iterations, marked by ' + t.iterations.boundary));
      grow.appendChild(table(['line', 'kind', 'per iteration', 'first \u2192 last'], t.growing.map(function (g) {
        return [g.line + (g.kept_with.length ? '  (kept with: ' + g.kept_with.join('; ') + ')' : ''), g.kind ? kindName(g.kind) : '\u2014', bytes(g.per_step), bytes(g.first) + ' \u2192 ' + bytes(g.last)];
      }), ['site', 'k', 'n', 'n']));
    } else {
      grow.appendChild(el('div', { class: 'empty' }, t.iterations ? 'No line grows from one iteration to the next (' + t.iterations.count + ' iterations, marked by ' + t.iterations.boundary + ').' : 'No iterations found: no repeating NVTX range and no repeating pattern of allocations.'));
    }
    box.appendChild(grow);
    // The peak's holders.
    const pk = el('div', { class: 'panel', id: 'peak' });
    const p = t.peaks.find(function (q) { return q.device === lane.device; });
    pk.appendChild(el('h2', {}, 'At the peak'));
    if (p) {
      pk.appendChild(el('div', { class: 'sub' }, bytes(p.live) + ' live, ' + bytes(p.reserved) + ' reserved, at ' + dur(p.time_ns) + ' on device ' + p.device + (p.kinds_from_lines ? ' (kinds told from the lines alone: a ring\u2019s checkpoint keeps no lifetimes)' : '')));
      const rows = [];
      p.by_kind.forEach(function (k) {
        rows.push([kindName(k.kind), '', bytes(k.bytes)]);
        k.lines.forEach(function (h) { rows.push(['', h.label, bytes(h.bytes)]); });
      });
      if (!rows.length) p.lines.forEach(function (h) { rows.push(['', h.label, bytes(h.bytes)]); });
      pk.appendChild(table(['kind', 'line', 'bytes'], rows, ['k', 'site', 'n']));
    } else {
      pk.appendChild(el('div', { class: 'empty' }, 'No allocation on this device.'));
    }
    box.appendChild(pk);
    // NVML's table.
    const nv = el('div', { class: 'panel', id: 'nvml' });
    nv.appendChild(el('h2', {}, 'Device memory as NVML saw it'));
    const m = t.device_memory.find(function (q) { return q.device === lane.device; });
    if (m) {
      const owners = [];
      [m.at_peak, m.at_exit].forEach(function (r) { r.parts.forEach(function (q) { if (owners.indexOf(q.owner) < 0) owners.push(q.owner); }); });
      const get = function (r, o) { const q = r.parts.find(function (x) { return x.owner === o; }); return q ? bytes(q.bytes) : ''; };
      const rows = owners.map(function (o) { return [o, get(m.at_peak, o), get(m.at_exit, o)]; });
      // No NVML figure at exit where its last sample came before the last allocations.
      const exit = (v) => m.at_exit.sampled_before ? '-' : bytes(v);
      rows.push(['no allocating call (CUDA context, module code, local memory)', bytes(m.at_peak.not_allocated_bytes), exit(m.at_exit.not_allocated_bytes)]);
      rows.push(['NVML', bytes(m.at_peak.nvml_bytes), exit(m.at_exit.nvml_bytes)]);
      nv.appendChild(el('div', { class: 'sub' }, (m.device_wide ? 'the whole device' : 'this process') + ', of ' + bytes(m.device_total_bytes)));
      nv.appendChild(table(['held by', 'at NVML\u2019s peak (' + dur(m.at_peak.time_ns) + ')', 'at exit'], rows, ['site', 'n', 'n']));
    } else {
      nv.appendChild(el('div', { class: 'empty' }, 'The trace holds no NVML figure for this device (no NVML on the machine, or a trace of the simulator).'));
    }
    box.appendChild(nv);
    if (t.fit) box.appendChild(fitPanel(t.fit));
    // Failures.
    const oo = el('div', { class: 'panel', id: 'ooms' });
    oo.appendChild(el('h2', {}, 'Failed allocations'));
    const mine = t.ooms.filter(function (o) { return o.device === lane.device; });
    if (mine.length) {
      oo.appendChild(table(['when', 'request', 'line', 'live / reserved'], mine.map(function (o) {
        return [dur(o.time_ns), o.api + ' of ' + bytes(o.requested), o.site || '', bytes(o.live) + ' / ' + bytes(o.reserved)];
      }), ['n', 'k', 'site', 'n']));
      if (t.oom_count > t.ooms.length) oo.appendChild(el('div', { class: 'sub' }, (t.oom_count - t.ooms.length) + ' more: gpushim oom lists them all'));
    } else {
      oo.appendChild(el('div', { class: 'empty' }, 'None.'));
    }
    box.appendChild(oo);
  }

  // Peak reserved memory against the batch (gpushim fit), the limit drawn.
  function fitPanel(f) {
    const box = el('div', { class: 'panel', id: 'fit' });
    box.appendChild(el('h2', {}, 'What fits'));
    if (f.error) { box.appendChild(el('div', { class: 'empty' }, f.error)); return box; }
    const w = 520, h = 260, l = 70, r = 12, tp = 12, b = 36;
    const rows = f.settings.map(function (s) { return s.rows; });
    let xmax = 1, ymax = f.limit_bytes;
    rows.forEach(function (rs) { rs.forEach(function (q) { xmax = Math.max(xmax, q.batch); ymax = Math.max(ymax, q.peak_reserved_bytes); }); });
    const ystep = niceStep(ymax / 4);
    ymax = Math.ceil(ymax * 1.05 / ystep) * ystep;
    const x = function (v) { return l + (w - l - r) * v / xmax; };
    const y = function (v) { return tp + (h - tp - b) * (1 - v / ymax); };
    const svg = sv('svg', { viewBox: '0 0 ' + w + ' ' + h, class: 'chart', 'data-chart': 'fit' });
    const g = sv('g', { class: 'axis' });
    for (let v = 0; v <= ymax + 1; v += ystep) {
      g.appendChild(sv('line', { x1: l, x2: w - r, y1: y(v), y2: y(v) }));
      g.appendChild(sv('text', { x: l - 5, y: y(v) + 4, 'text-anchor': 'end' }, bytes(v)));
    }
    [0, 0.25, 0.5, 0.75, 1].forEach(function (k) {
      const v = Math.round(xmax * k);
      g.appendChild(sv('text', { x: x(v), y: h - b + 15, 'text-anchor': 'middle' }, String(v)));
    });
    g.appendChild(sv('text', { x: (l + w - r) / 2, y: h - 6, 'text-anchor': 'middle' }, 'batch (the run: ' + f.at + ')'));
    svg.appendChild(g);
    svg.appendChild(sv('line', { x1: l, x2: w - r, y1: y(f.limit_bytes), y2: y(f.limit_bytes), stroke: '#c0392b', 'stroke-dasharray': '4 3' }));
    svg.appendChild(sv('text', { class: 'title', x: w - r - 2, y: y(f.limit_bytes) - 4, 'text-anchor': 'end' }, 'limit ' + bytes(f.limit_bytes)));
    const colors = ['#333', '#4e79a7'];
    f.settings.forEach(function (s, k) {
      let d = '';
      s.rows.forEach(function (q, i) { d += (i ? 'L' : 'M') + x(q.batch).toFixed(1) + ',' + y(q.peak_reserved_bytes).toFixed(1); });
      svg.appendChild(sv('path', { d: d, fill: 'none', stroke: colors[k % 2], 'stroke-width': 1.6, 'data-setting': s.setting }));
      s.rows.forEach(function (q) {
        const c = sv('circle', { cx: x(q.batch), cy: y(q.peak_reserved_bytes), r: 2.6, fill: q.failures ? '#c0392b' : colors[k % 2] });
        c.appendChild(sv('title', {}, 'batch ' + q.batch + ': ' + bytes(q.peak_reserved_bytes) + ' reserved' + (q.failures ? ', does not fit' : '')));
        svg.appendChild(c);
      });
    });
    svg.appendChild(sv('line', { x1: x(f.at), x2: x(f.at), y1: tp, y2: h - b, stroke: '#999', 'stroke-dasharray': '2 2' }));
    box.appendChild(svg);
    f.settings.forEach(function (s, k) {
      const line = el('div', { class: 'sub' });
      line.appendChild(el('span', { style: 'color:' + colors[k % 2] }, '\u2014 '));
      line.appendChild(document.createTextNode((s.setting || 'the defaults') + (s.recorded ? ' (the run\u2019s)' : '') + ': the largest batch that fits is ' + s.largest_batch));
      box.appendChild(line);
    });
    box.appendChild(el('div', { class: 'sub' }, 'Limit: ' + f.limit_from + '. From the run at batch ' + f.at + ', its batch-dependent tensors resized and replayed through the model of PyTorch\u2019s allocator (docs/fit.md).'));
    return box;
  }

  function notes() {
    const item = lanes[state.lane], t = item.t, lane = item.lane;
    const box = document.getElementById('notes');
    box.textContent = '';
    const add = function (s) { box.appendChild(el('div', {}, s)); };
    if (lane.before_ring > 0) add('This run was longer than its ring: the first ' + lane.before_ring + ' columns are the checkpoint\u2019s series of what came before (live and reserved only); the kinds and lines start where the ring\u2019s detail does.');
    t.notes.forEach(add);
    const sub = document.getElementById('sub');
    sub.textContent = t.program + ' (pid ' + t.pid + ' on ' + t.host + '), ' + dur(t.duration_ns) + ', ' + t.events + ' records; ' + t.path + ', device ' + lane.device;
  }

  function render() { draw(); panels(); notes(); document.getElementById('detail').textContent = 'Click a band to see its lines and their stacks.'; }

  function seg(id, label, options, key) {
    const wrap = el('span', { class: 'seg', id: id });
    wrap.appendChild(el('label', {}, label + ' '));
    options.forEach(function (o) {
      const b = el('button', { type: 'button', 'data-value': o[0] }, o[1]);
      if (state[key] === o[0]) b.classList.add('on');
      b.addEventListener('click', function () {
        state[key] = o[0];
        wrap.querySelectorAll('button').forEach(function (x) { x.classList.toggle('on', x === b); });
        render();
      });
      wrap.appendChild(b);
    });
    return wrap;
  }

  function build() {
    const app = document.getElementById('app');
    app.appendChild(el('h1', {}, D.title));
    app.appendChild(el('div', { class: 'sub', id: 'sub' }));
    if (!lanes.length) {
      app.appendChild(el('div', { class: 'empty', id: 'nothing' }, 'The trace holds no allocation (or none that the filters keep): nothing to draw.'));
      return;
    }
    const ctl = el('div', { class: 'controls' });
    if (lanes.length > 1) {
      const pick = el('select', { id: 'rank' });
      lanes.forEach(function (it, k) { pick.appendChild(el('option', { value: k }, it.lane.trace + ', device ' + it.lane.device)); });
      pick.addEventListener('change', function () { state.lane = +pick.value; render(); });
      const lab = el('label', {}, 'rank ');
      lab.appendChild(pick);
      ctl.appendChild(lab);
    }
    ctl.appendChild(seg('view', 'stack by', [['kind', 'kind'], ['line', 'line']], 'view'));
    // Where what no allocating call made (a CUDA context of hundreds of MiB) dwarfs what the
    // allocators hold, the page opens on the allocators.
    const first = lanes[0].lane.columns;
    const most = function (a) { return a.reduce(function (m, v) { return Math.max(m, v); }, 0); };
    if (most(first.nvml) > 2.5 * most(first.reserved)) state.show = 'allocators';
    ctl.appendChild(seg('show', 'memory', [['allocators', 'the allocators\u2019'], ['all', 'all NVML saw']], 'show'));
    ctl.appendChild(seg('axis', 'x axis', [['changes', 'where memory moves'], ['time', 'time']], 'axis'));
    app.appendChild(ctl);
    app.appendChild(el('div', { class: 'notes', id: 'notes' }));
    const wrap = el('div', { id: 'chart-wrap' });
    const svg = sv('svg', { id: 'chart', class: 'chart', viewBox: '0 0 ' + W + ' ' + H, role: 'img' });
    svg.addEventListener('mousemove', hover);
    svg.addEventListener('mouseleave', leave);
    svg.addEventListener('click', click);
    wrap.appendChild(svg);
    wrap.appendChild(el('div', { id: 'tip' }));
    app.appendChild(wrap);
    app.appendChild(el('div', { class: 'legend', id: 'legend' }));
    const det = el('div', { class: 'panel' });
    det.appendChild(el('h2', {}, 'Stack'));
    det.appendChild(el('div', { id: 'detail' }));
    app.appendChild(det);
    app.appendChild(el('div', { class: 'grid2', id: 'panels' }));
    render();
  }

  // For tests and for people at the console: where to point to find a band.
  window.gpushimPage = {
    bands: function () { return state.bands.map(function (b) { return b.name; }); },
    // The point of the page (client coordinates) at the middle of `name`'s band where it is thickest.
    locate: function (name) {
      const b = state.bands.find(function (q) { return q.name === name; });
      if (!b) return null;
      let best = 0;
      for (let i = 0; i < b.values.length; i++) if (b.values[i] > b.values[best]) best = i;
      const svg = document.getElementById('chart'), r = svg.getBoundingClientRect();
      const g = state.geom;
      return {
        x: r.left + g.x(best) * r.width / W,
        y: r.top + g.y((b.lo[best] + b.hi[best]) / 2) * r.height / H,
      };
    },
  };
  build();
})();
