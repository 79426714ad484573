// skein status page: subscribes to /api/events (server-sent events) and
// renders each snapshot. No third-party code. Every value from the server is
// written with textContent or SVG attributes, never as HTML.
'use strict';

(() => {
  const SVGNS = 'http://www.w3.org/2000/svg';
  const $ = (id) => document.getElementById(id);

  let snap = null;   // latest snapshot
  let skew = 0;      // local clock minus server clock, ms
  let es = null;     // EventSource
  let retryMs = 1000;
  let retryTimer = 0;

  // ---- formatting -------------------------------------------------------

  function count(n) {
    if (n == null || !isFinite(n)) return '–';
    const a = Math.abs(n);
    if (a < 1000) return String(Math.round(n));
    const units = [['T', 1e12], ['G', 1e9], ['M', 1e6], ['k', 1e3]];
    for (const [u, v] of units) {
      if (a >= v) return trim(n / v) + u;
    }
    return String(n);
  }
  function trim(x) {
    return x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2);
  }
  function bytes(n) {
    if (n == null || !isFinite(n)) return '–';
    const units = ['B', 'kB', 'MB', 'GB', 'TB', 'PB', 'EB'];
    let i = 0;
    while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
    return (i === 0 ? String(Math.round(n)) : trim(n)) + '\u202f' + units[i];
  }
  function lossText(x) { return x == null ? '–' : x.toFixed(3); }
  // bitsText: bits per parameter, 0.42, 12.6, 0.0031.
  function bitsText(x) {
    return x >= 10 ? x.toFixed(1) : x >= 0.1 || x === 0 ? x.toFixed(2) : x.toPrecision(2);
  }
  function serverNow() { return Date.now() - skew; }
  function ago(iso) {
    const t = Date.parse(iso);
    if (!isFinite(t)) return '–';
    return span(serverNow() - t) + ' ago';
  }
  function span(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    if (s < 60) return s + 's';
    const m = Math.floor(s / 60);
    if (m < 60) return m + 'm ' + String(s % 60).padStart(2, '0') + 's';
    const h = Math.floor(m / 60);
    if (h < 48) return h + 'h ' + String(m % 60).padStart(2, '0') + 'm';
    return Math.floor(h / 24) + 'd ' + (h % 24) + 'h';
  }
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }
  function setValue(id, text, unit) {
    const e = $(id);
    const before = e.textContent;
    e.textContent = text;
    if (unit) e.appendChild(el('span', 'unit', unit));
    if (before !== e.textContent && before !== '–') {
      const card = e.parentElement;
      card.classList.remove('flash');
      void card.offsetWidth; // restart the animation
      card.classList.add('flash');
    }
  }

  // ---- connection -------------------------------------------------------

  function setConn(state) {
    const c = $('conn');
    c.className = 'conn ' + state;
    $('conn-text').textContent = state;
  }

  function connect() {
    clearTimeout(retryTimer);
    if (es) es.close();
    setConn('connecting');
    es = new EventSource('/api/events');
    es.addEventListener('snapshot', (ev) => {
      let s;
      try { s = JSON.parse(ev.data); } catch (err) { console.error('bad snapshot', err); return; }
      retryMs = 1000;
      setConn('live');
      render(s);
    });
    es.onopen = () => setConn('live');
    es.onerror = () => {
      setConn('disconnected');
      if (es.readyState === EventSource.CLOSED) {
        // The browser gave up (e.g. 503, too many clients): retry ourselves.
        es.close();
        retryTimer = setTimeout(connect, retryMs);
        retryMs = Math.min(retryMs * 2, 30000);
      } // otherwise the browser reconnects by itself after "retry:".
    };
  }

  // ---- rendering --------------------------------------------------------

  function render(s) {
    snap = s;
    skew = Date.now() - Date.parse(s.now);
    document.title = 'round ' + s.round + ' · ' + (s.run_id || 'run') + ' · skein';

    $('run-id').textContent = s.run_id || 'unnamed run';
    const meta = [];
    if (s.preset) meta.push(s.preset);
    if (s.params) meta.push(count(s.params) + ' parameters');
    if (s.optimizer) meta.push(s.optimizer + (s.inner_steps ? ', H = ' + s.inner_steps : ''));
    $('run-meta').textContent = meta.join(' · ');

    setValue('stat-round', String(s.round));
    $('stat-round-sub').textContent = s.started ? 'started ' + ago(s.started) : '\u00a0';
    $('stat-round-sub').dataset.t = s.started || '';
    $('stat-round-sub').dataset.prefix = 'started ';

    setValue('stat-val', lossText(s.val_loss));
    const vs = [];
    if (s.val_loss != null && s.val_loss_round !== s.round) vs.push('round ' + s.val_loss_round);
    if (s.train_loss != null) vs.push('train ' + lossText(s.train_loss));
    $('stat-val-sub').textContent = vs.join(', ') || (s.val_loss == null ? 'not measured yet' : '\u00a0');

    setValue('stat-tokens', count(s.tokens_trained));
    $('stat-tokens-sub').textContent = count(s.reports) + ' reports';
    // A run over a packed dataset: how far it is through the data. A
    // narrow card breaks the line at the dot only.
    const d = s.data;
    const epoch = $('stat-epoch');
    epoch.hidden = !(d && isFinite(d.epoch) && isFinite(d.trained));
    epoch.replaceChildren();
    if (!epoch.hidden) {
      epoch.appendChild(el('span', 'nowrap', 'epoch ' + d.epoch));
      epoch.appendChild(document.createTextNode(' · '));
      epoch.appendChild(el('span', 'nowrap', (100 * Math.min(Math.max(d.trained, 0), 1)).toFixed(1) + '% trained'));
    }
    setValue('stat-tps', count(s.tokens_per_sec), 'tok/s');
    setValue('stat-bps', bytes(s.bytes_per_sec), '/s');
    $('stat-bps-sub').textContent = bytes(s.bytes_sent) + ' in total';
    // What a volunteer sends for one round, per parameter. A narrow card
    // breaks the line before "per round" only.
    const bits = $('stat-bits');
    bits.hidden = !(typeof s.bits_per_param === 'number' && isFinite(s.bits_per_param) && s.bits_per_param >= 0);
    bits.replaceChildren();
    if (!bits.hidden) {
      bits.appendChild(el('span', 'nowrap', bitsText(s.bits_per_param) + ' bits/param'));
      bits.appendChild(document.createTextNode(' '));
      bits.appendChild(el('span', 'nowrap', 'per round'));
    }
    const savedCard = $('stat-saved-card');
    if (s.traffic_saved > 0) {
      setValue('stat-saved', (s.traffic_saved >= 100 ? s.traffic_saved.toFixed(0) : s.traffic_saved.toFixed(1)) + '×', 'less');
      $('stat-saved-sub').textContent = 'vs fp32 DP training';
      savedCard.title = bytes(s.bytes_sent) + ' sent; fp32 data-parallel training (all-reduce after every step) would have sent '
        + bytes(s.fp32_dp_bytes) + ' for the same work';
    } else {
      setValue('stat-saved', '–');
      $('stat-saved-sub').textContent = 'vs fp32 DP training';
      savedCard.title = '';
    }
    setValue('stat-members', String(s.members_online));
    const shown = (s.members || []).length;
    $('stat-members-sub').textContent = s.members_total > shown
      ? shown + ' of ' + s.members_total + ' shown' : (shown === 1 ? '1 in the table' : shown + ' in the table');

    drawChart();
    renderMembers(s.members || [], s.members_total || 0);
    renderTimeline(s.events || []);
    renderPipeline(s.pipeline);

    const foot = [];
    if (s.manifest) foot.push('manifest ' + s.manifest);
    if (s.started) foot.push('started ' + new Date(s.started).toLocaleString());
    if (s.bootstrap && s.bootstrap.length) foot.push('bootstrap ' + s.bootstrap.join(', '));
    $('footer-run').textContent = foot.join(' · ');
    updateTimes();
  }

  function renderMembers(rows, total) {
    const body = $('members').tBodies[0];
    const frag = document.createDocumentFragment();
    for (const m of rows) {
      const tr = el('tr', m.online ? 'online' : 'offline');
      tr.dataset.peer = m.peer;

      const peer = el('td');
      const wrap = el('span', 'peer');
      wrap.appendChild(el('span', 'dot'));
      wrap.appendChild(el('code', null, m.peer));
      if (!m.online) wrap.appendChild(el('span', 'tag', 'left'));
      peer.appendChild(wrap);
      tr.appendChild(peer);

      const role = el('td');
      if (m.role) role.appendChild(el('span', 'role', m.role)); else role.textContent = '–';
      tr.appendChild(role);

      const dev = el('td', 'device', m.device || '–');
      dev.title = [m.device, m.version && 'skein ' + m.version].filter(Boolean).join(' · ');
      tr.appendChild(dev);
      tr.appendChild(el('td', 'num', m.tokens_per_sec ? count(m.tokens_per_sec) : '–'));
      tr.appendChild(el('td', 'num', bytes(m.bytes_sent)));
      tr.appendChild(el('td', 'num', bytes(m.bytes_recv)));
      tr.appendChild(el('td', 'num', String(m.round)));

      const st = el('td');
      const h = el('span', 'hash');
      if (m.state_hash) {
        h.appendChild(el('code', null, m.state_hash));
      }
      const badge = el('span', 'badge ' + m.agreement, m.agreement);
      badge.title = {
        agree: 'same state as the majority of its round',
        differs: 'state differs from the majority of its round; it will re-sync',
        unknown: 'not enough votes to compare',
      }[m.agreement] || '';
      h.appendChild(badge);
      st.appendChild(h);
      tr.appendChild(st);

      const seen = el('td', 'seen');
      if (m.last_seen) { seen.dataset.t = m.last_seen; seen.dataset.suffix = ' ago'; } else seen.textContent = '–';
      tr.appendChild(seen);
      frag.appendChild(tr);
    }
    body.replaceChildren(frag);
    $('members-empty').hidden = rows.length > 0;
    const online = rows.filter((m) => m.online).length;
    $('members-count').textContent = rows.length
      ? online + ' online' + (total > rows.length ? ' · ' + (total - rows.length) + ' more not shown' : '') : '';
  }

  // A staged run: its stages and their replicas, and the path every
  // microbatch of the latest iteration took (back to stage 0 for the loss).
  function renderPipeline(p) {
    const card = $('pipeline-card');
    card.hidden = !p;
    if (!p) return;
    const stages = p.stages || [];
    const skipped = Math.round(p.skip_ratio * stages.length);
    $('pipeline-meta').textContent = stages.length + ' stages · each microbatch skips ' + skipped;
    const body = $('stages').tBodies[0];
    const frag = document.createDocumentFragment();
    for (const st of stages) {
      const tr = el('tr', st.rebuilt ? 'rebuilt' : null);
      tr.dataset.stage = String(st.stage);
      tr.appendChild(el('td', 'num', String(st.stage)));
      tr.appendChild(el('td', null, st.holds || '–'));
      const reps = el('td');
      for (const r of st.replicas || []) reps.appendChild(el('code', 'replica', r));
      if (!(st.replicas || []).length) reps.textContent = 'none: lost';
      tr.appendChild(reps);
      tr.appendChild(el('td', 'muted', st.rebuilt || '–'));
      frag.appendChild(tr);
    }
    body.replaceChildren(frag);
    $('paths-iter').textContent = String(p.iteration);
    const list = $('paths');
    const items = document.createDocumentFragment();
    for (const path of p.paths || []) {
      const li = el('li');
      li.appendChild(el('span', 'mb', 'microbatch ' + path.microbatch));
      const hops = path.stages.map((s, i) => 'stage ' + s + ' @ ' + (path.peers[i] || '?'));
      hops.push('stage 0 (loss)');
      li.appendChild(el('span', 'hops', hops.join(' → ')));
      items.appendChild(li);
    }
    list.replaceChildren(items);
  }

  const kindText = { join: 'joined', leave: 'left', fail: 'failed' };

  function renderTimeline(events) {
    const list = $('timeline');
    const frag = document.createDocumentFragment();
    for (const e of events) {
      const li = el('li', e.kind);
      li.appendChild(el('span', 'mark'));
      const what = el('span', 'what');
      what.appendChild(el('code', null, e.peer));
      what.appendChild(document.createTextNode(' ' + (kindText[e.kind] || e.kind)));
      const detail = [e.role, e.device].filter(Boolean).join(' · ');
      if (detail) what.appendChild(el('span', 'detail', ' · ' + detail));
      what.title = what.textContent;
      li.appendChild(what);
      const t = el('time');
      t.dateTime = e.at;
      t.title = new Date(e.at).toLocaleString();
      t.dataset.t = e.at;
      t.dataset.suffix = ' ago';
      li.appendChild(t);
      frag.appendChild(li);
    }
    list.replaceChildren(frag);
    $('timeline-empty').hidden = events.length > 0;
    $('timeline-count').textContent = events.length ? 'latest ' + events.length : '';
  }

  // Relative times tick every second without a new snapshot.
  function updateTimes() {
    for (const e of document.querySelectorAll('[data-t]')) {
      if (!e.dataset.t) continue;
      const t = Date.parse(e.dataset.t);
      if (!isFinite(t)) continue;
      e.textContent = (e.dataset.prefix || '') + span(serverNow() - t) + (e.dataset.suffix || ' ago');
    }
  }

  // ---- loss chart ---------------------------------------------------------

  function svg(tag, attrs, parent) {
    const e = document.createElementNS(SVGNS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  // ticks returns round numbers spanning [lo, hi], about n of them.
  function ticks(lo, hi, n, integer) {
    const raw = (hi - lo) / Math.max(n, 1);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const f = raw / mag;
    let step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
    if (integer) step = Math.max(1, Math.round(step));
    const out = [];
    for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) {
      out.push(Number(v.toFixed(10)));
    }
    return { values: out, step };
  }

  function tickText(v, step) {
    const d = step >= 1 ? 0 : Math.min(4, Math.ceil(-Math.log10(step)));
    return v.toFixed(d);
  }

  function drawChart() {
    const chart = $('loss-chart');
    const tip = $('chart-tip');
    tip.hidden = true;
    const points = (snap && snap.curve) || [];
    const W = Math.max(chart.clientWidth, 200);
    const H = Math.max(chart.clientHeight, 150);
    chart.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    chart.replaceChildren();

    const train = points.filter((p) => p.train != null);
    const val = points.filter((p) => p.val != null);
    chart.dataset.trainPoints = train.length;
    chart.dataset.valPoints = val.length;
    if (!train.length && !val.length) {
      const t = svg('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'placeholder' }, chart);
      t.textContent = 'waiting for the first outer round…';
      return;
    }

    const m = { l: 54, r: 14, t: 10, b: 42 };
    const pw = W - m.l - m.r;
    const ph = H - m.t - m.b;
    let x0 = points[0].round;
    let x1 = points[points.length - 1].round;
    if (x1 - x0 < 1) { x0 -= 1; x1 += 1; }
    let y0 = Infinity;
    let y1 = -Infinity;
    for (const p of points) {
      for (const v of [p.train, p.val]) {
        if (v != null) { y0 = Math.min(y0, v); y1 = Math.max(y1, v); }
      }
    }
    const pad = Math.max((y1 - y0) * 0.08, 0.01);
    y0 = Math.max(0, y0 - pad);
    y1 += pad;

    const X = (r) => m.l + ((r - x0) / (x1 - x0)) * pw;
    const Y = (v) => m.t + (1 - (v - y0) / (y1 - y0)) * ph;

    const grid = svg('g', { class: 'grid' }, chart);
    const labels = svg('g', { class: 'labels' }, chart);
    const yt = ticks(y0, y1, Math.max(3, Math.round(ph / 55)), false);
    for (const v of yt.values) {
      if (v < y0 || v > y1) continue;
      svg('line', { x1: m.l, x2: W - m.r, y1: Y(v), y2: Y(v) }, grid);
      const t = svg('text', { x: m.l - 8, y: Y(v) + 4, 'text-anchor': 'end' }, labels);
      t.textContent = tickText(v, yt.step);
    }
    const xt = ticks(x0, x1, Math.max(2, Math.round(pw / 90)), true);
    for (const v of xt.values) {
      if (v < x0 || v > x1) continue;
      svg('line', { x1: X(v), x2: X(v), y1: m.t + ph, y2: m.t + ph + 5 }, grid);
      const t = svg('text', { x: X(v), y: m.t + ph + 18, 'text-anchor': 'middle' }, labels);
      t.textContent = count(v);
    }
    const axis = svg('g', { class: 'axis' }, chart);
    svg('line', { x1: m.l, x2: W - m.r, y1: m.t + ph, y2: m.t + ph }, axis);
    const xl = svg('text', { x: m.l + pw / 2, y: H - 4, 'text-anchor': 'middle', class: 'axis-label' }, chart);
    xl.textContent = 'outer round';
    const yl = svg('text', {
      x: -(m.t + ph / 2), y: 13, 'text-anchor': 'middle', class: 'axis-label', transform: 'rotate(-90)',
    }, chart);
    yl.textContent = 'loss (nats/token)';

    const path = (pts, key) => pts.map((p, i) => (i ? 'L' : 'M') + X(p.round).toFixed(1) + ' ' + Y(p[key]).toFixed(1)).join('');
    if (train.length > 1) {
      const first = train[0];
      const last = train[train.length - 1];
      svg('path', {
        class: 'area',
        d: path(train, 'train') + 'L' + X(last.round).toFixed(1) + ' ' + (m.t + ph) + 'L' + X(first.round).toFixed(1) + ' ' + (m.t + ph) + 'Z',
      }, chart);
    }
    if (train.length) svg('path', { class: 'line train', d: path(train, 'train') }, chart);
    if (val.length) svg('path', { class: 'line val', d: path(val, 'val') }, chart);
    const dots = svg('g', { class: 'dots' }, chart);
    if (train.length <= 60) {
      for (const p of train) svg('circle', { class: 'train', cx: X(p.round), cy: Y(p.train), r: 2.5 }, dots);
    } else {
      const p = train[train.length - 1];
      svg('circle', { class: 'train', cx: X(p.round), cy: Y(p.train), r: 3.5 }, dots);
    }
    const valStride = Math.max(1, Math.ceil(val.length / 80));
    val.forEach((p, i) => {
      if (i % valStride === 0 || i === val.length - 1) svg('circle', { class: 'val', cx: X(p.round), cy: Y(p.val), r: 3.5 }, dots);
    });

    // Hover: the nearest round, its losses in a tooltip.
    const cursor = svg('line', { class: 'cursor', y1: m.t, y2: m.t + ph, visibility: 'hidden' }, chart);
    const hit = svg('rect', { class: 'hit', x: m.l, y: m.t, width: pw, height: ph }, chart);
    hit.addEventListener('mousemove', (ev) => {
      const box = chart.getBoundingClientRect();
      const r = x0 + ((ev.clientX - box.left - m.l) / pw) * (x1 - x0);
      let best = points[0];
      for (const p of points) if (Math.abs(p.round - r) < Math.abs(best.round - r)) best = p;
      const x = X(best.round);
      cursor.setAttribute('x1', x);
      cursor.setAttribute('x2', x);
      cursor.setAttribute('visibility', 'visible');
      tip.replaceChildren();
      tip.appendChild(el('b', null, 'round ' + best.round));
      for (const [key, name] of [['train', 'train'], ['val', 'validation']]) {
        if (best[key] == null) continue;
        tip.appendChild(document.createElement('br'));
        tip.appendChild(el('span', 'sw ' + key));
        tip.appendChild(document.createTextNode(name + ' ' + lossText(best[key])));
      }
      tip.hidden = false;
      const top = Math.min(...[best.train, best.val].filter((v) => v != null).map(Y));
      tip.style.left = x + 'px';
      tip.style.top = Math.max(top - 10, 40) + 'px';
    });
    hit.addEventListener('mouseleave', () => {
      cursor.setAttribute('visibility', 'hidden');
      tip.hidden = true;
    });
  }

  let resizeFrame = 0;
  window.addEventListener('resize', () => {
    cancelAnimationFrame(resizeFrame);
    resizeFrame = requestAnimationFrame(drawChart);
  });
  setInterval(updateTimes, 1000);
  drawChart();
  connect();
})();
