// The dashboard's page: it reads the cluster and the selected job from
// /ui/api/ and reads them again whenever the event stream says something
// happened. Text from the cluster only ever goes into text nodes.
'use strict';

const $ = (sel) => document.querySelector(sel);
const SVG = 'http://www.w3.org/2000/svg';

const state = {
  cluster: null,  // GET api/cluster
  selected: null, // the job shown
  job: null,      // GET api/jobs/JOB
  events: [],     // the selected job's events, oldest first
};

// el makes an element with attributes and children (strings become text).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === 'class') e.className = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c !== undefined && c !== null) e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function svg(tag, attrs, title) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (title) {
    const t = document.createElementNS(SVG, 'title');
    t.textContent = title;
    e.append(t);
  }
  return e;
}

const badge = (text, cls) => el('span', { class: 'badge ' + (cls || text) }, text);
const clock = (t) => new Date(t).toLocaleTimeString();

async function getJSON(url) {
  const r = await fetch(url, { cache: 'no-store', credentials: 'same-origin' });
  if (!r.ok) {
    let msg = r.status + ' ' + r.statusText;
    try { msg = (await r.json()).error || msg; } catch (_) { /* not JSON */ }
    const err = new Error(msg);
    err.status = r.status;
    throw err;
  }
  return r.json();
}

function showError(msg) {
  const p = $('#error');
  p.hidden = !msg;
  p.textContent = msg || '';
}

// Reads are debounced and never overlap: what is asked for while one runs
// is read right after it.
const want = { cluster: false, job: false };
let timer = null;
let reading = false;

function refresh(what) {
  want[what] = true;
  if (!timer && !reading) timer = setTimeout(read, 150);
}

async function read() {
  timer = null;
  reading = true;
  const cluster = want.cluster, job = want.job;
  want.cluster = want.job = false;
  try {
    if (cluster) {
      state.cluster = await getJSON('/ui/api/cluster');
      renderCluster();
    }
    if (job && state.selected) {
      const name = state.selected;
      let doc = null;
      try {
        doc = await getJSON('/ui/api/jobs/' + encodeURIComponent(name));
      } catch (e) {
        if (e.status !== 404) throw e;
        select(null); // the job is gone
      }
      if (doc && name === state.selected) {
        state.job = doc;
        mergeEvents(doc.events);
        renderJob();
      }
    }
    showError(null);
  } catch (e) {
    showError(e.status === 401 ? 'Logged out: log in again at /ui/login.' : 'Cannot read the cluster: ' + e.message);
  }
  reading = false;
  if (want.cluster || want.job) timer = setTimeout(read, 150);
}

function renderCluster() {
  const c = state.cluster;
  $('#cluster').textContent = c.cluster ? 'cluster ' + c.cluster : '';
  const most = Math.max(1, ...c.nodes.map((n) => n.ranks));
  const nodes = c.nodes.map((n) => {
    const st = [badge(n.alive ? 'alive' : 'dead')];
    if (n.spare) st.push(badge('spare'));
    if (n.drained) st.push(badge('drained'));
    const health = n.health && n.health.length ? [badge('unwell'), ' ' + n.health.join('; ')] : [badge('ok')];
    if (n.quarantined && n.quarantined.length) health.push(' ' + n.quarantined.length + ' damaged pack(s) set aside');
    return el('tr', { 'data-node': n.name },
      el('td', {}, n.name),
      el('td', {}, ...st),
      el('td', {}, ...health),
      el('td', {}, el('meter', { min: 0, max: most, value: n.ranks }), ' ' + n.ranks + (n.ranks === 1 ? ' rank' : ' ranks')),
      el('td', {}, (n.jobs || []).join(', ')),
      el('td', { class: 'mono' }, n.addr));
  });
  $('#nodes tbody').replaceChildren(...nodes);

  const jobs = c.jobs.map((j) => el('tr', { 'data-job': j.name, class: j.name === state.selected ? 'selected' : null },
    el('td', {}, el('a', { href: '#job=' + encodeURIComponent(j.name) }, j.name)),
    el('td', { title: j.reason || '' }, badge(j.state)),
    el('td', {}, j.ranks),
    el('td', {}, [...new Set(j.placement)].join(', ')),
    el('td', {}, j.last_ckpt ? j.last_ckpt : '-'),
    el('td', {}, j.restarts),
    el('td', {}, j.migrations)));
  $('#jobs tbody').replaceChildren(...jobs);
  $('#no-jobs').hidden = c.jobs.length > 0;

  if (!state.selected && c.jobs.length) {
    const running = c.jobs.find((j) => j.state === 'running');
    select((running || c.jobs[0]).name);
  }
}

function select(name) {
  if (name === state.selected) return;
  state.selected = name;
  state.job = null;
  state.events = [];
  for (const tr of document.querySelectorAll('#jobs tbody tr')) {
    tr.classList.toggle('selected', tr.dataset.job === name);
  }
  $('#job').hidden = true;
  if (name) refresh('job');
}

function mergeEvents(evs) {
  const seen = new Set(state.events.map((e) => e.seq));
  for (const e of evs) if (!seen.has(e.seq)) state.events.push(e);
  state.events.sort((a, b) => a.seq - b.seq);
  state.events = state.events.slice(-50);
}

function renderJob() {
  const d = state.job;
  const j = d.job;
  $('#job').hidden = false;
  $('#job-name').textContent = j.name;
  const st = $('#job-state');
  st.textContent = j.state;
  st.className = 'badge ' + j.state;
  const sum = [j.ranks + ' ranks', j.replicas + (j.replicas === 1 ? ' copy' : ' copies') + ' on other nodes'];
  if (j.on_failure) sum.push('on failure: ' + j.on_failure);
  if (j.checkpoint_every_ns) sum.push('checkpoint every ' + j.checkpoint_every_ns / 1e9 + ' s');
  if (j.mode) sum.push(j.mode);
  if (j.mpi) sum.push('MPI: ' + j.mpi);
  sum.push('created ' + new Date(j.created).toLocaleString());
  if (j.reason) sum.push(j.reason);
  $('#job-summary').textContent = sum.join(' · ');

  $('#ranks tbody').replaceChildren(...d.ranks.map((r) => el('tr', { 'data-rank': r.rank },
    el('td', {}, r.rank),
    el('td', {}, r.node),
    el('td', { class: 'mono' }, r.addr),
    el('td', {}, r.status + (r.exit_code !== undefined ? ' (' + r.exit_code + ')' : '') + (r.error ? ' (' + r.error + ')' : '')),
    el('td', {}, r.pid || '-'))));

  $('#timeline').replaceChildren(...d.timeline.slice().reverse().map((e) => {
    const li = el('li', { class: 'entry kind-' + e.kind, 'data-kind': e.kind, 'data-seq': e.seq || null, 'data-state': e.state || null },
      el('time', { datetime: e.time }, clock(e.time)),
      el('span', { class: 'title' }, e.title),
      e.state ? badge(e.state) : null,
      e.detail ? el('span', { class: 'detail' }, e.detail) : null);
    if (e.copies && e.copies.length) {
      li.append(el('span', { class: 'copies' }, e.copies.map((nodes, r) => 'rank ' + r + ': ' + (nodes || []).join(', ')).join(' · ')));
    }
    return li;
  }));
  renderEvents();
  renderChart();
}

function renderEvents() {
  $('#events').replaceChildren(...state.events.slice().reverse().map((e) => {
    const what = [];
    if (e.node) what.push('node ' + e.node);
    if (e.rank !== undefined) what.push('rank ' + e.rank);
    if (e.ckpt) what.push('#' + e.ckpt);
    if (e.peer) what.push('peer ' + e.peer);
    if (e.kind) what.push(e.kind);
    if (e.message) what.push(e.message);
    return el('li', { 'data-seq': e.seq }, el('time', { datetime: e.time }, clock(e.time)),
      el('span', { class: 'type' }, e.type), what.join(' · '));
  }));
}

// The chart: one lane per kind of entry, time from the job's creation to
// now; a checkpoint not yet protected is drawn open.
const lanes = { start: 14, checkpoint: 30, copy: 30, migration: 48, restart: 64, failure: 80 };

function renderChart() {
  const chart = $('#chart');
  if (!state.job) return;
  const d = state.job;
  const t0 = Math.min(Date.parse(d.job.created), ...d.timeline.map((e) => Date.parse(e.time)));
  const t1 = Math.max(Date.now(), t0 + 1000);
  const x = (t) => 10 + 980 * (Date.parse(t) - t0) / (t1 - t0);
  const from = svg('text', { x: 10, y: 9 });
  from.textContent = clock(t0);
  const to = svg('text', { x: 990, y: 9, 'text-anchor': 'end' });
  to.textContent = 'now';
  const out = [svg('line', { class: 'axis', x1: 10, x2: 990, y1: 90, y2: 90 }), from, to];
  for (const e of d.timeline) {
    const cx = x(e.time), cy = lanes[e.kind] || 80;
    const tip = clock(e.time) + ' ' + e.title + (e.state ? ' (' + e.state + ')' : '') + (e.detail ? ': ' + e.detail : '');
    const cls = 'mark kind-' + e.kind;
    let m;
    switch (e.kind) {
      case 'checkpoint':
        m = svg('circle', { cx, cy, r: 6, class: cls + (e.protected || e.state === 'aborted' ? '' : ' open') }, tip);
        break;
      case 'migration':
        m = svg('polygon', { points: `${cx},${cy - 7} ${cx + 7},${cy} ${cx},${cy + 7} ${cx - 7},${cy}`, class: cls }, tip);
        break;
      case 'failure':
        m = svg('polygon', { points: `${cx},${cy - 7} ${cx + 7},${cy + 6} ${cx - 7},${cy + 6}`, class: cls }, tip);
        break;
      case 'start':
        m = svg('rect', { x: cx - 2, y: cy - 8, width: 4, height: 16, class: cls }, tip);
        break;
      default:
        m = svg('rect', { x: cx - 5, y: cy - 5, width: 10, height: 10, class: cls }, tip);
    }
    m.setAttribute('data-kind', e.kind);
    out.push(m);
  }
  chart.replaceChildren(...out);
}

function onEvent(e) {
  refresh('cluster');
  if (!state.selected) return;
  if (e.job === state.selected) {
    mergeEvents([e]);
    renderEvents();
  }
  if (e.job === state.selected || e.type === 'node.lost') refresh('job');
}

function setLive(on) {
  const s = $('#live');
  s.className = 'live ' + (on ? 'on' : 'off');
  s.textContent = on ? 'live' : 'reconnecting';
}

// connect follows the event stream; EventSource reconnects by itself
// (resuming after the last event it had), and a stream that was refused
// is opened again a little later.
function connect() {
  const es = new EventSource('/ui/api/events');
  es.addEventListener('ready', () => {
    setLive(true);
    refresh('cluster');
    refresh('job');
  });
  es.onmessage = (m) => onEvent(JSON.parse(m.data));
  es.onerror = () => {
    setLive(false);
    if (es.readyState === EventSource.CLOSED) {
      setTimeout(connect, 5000);
      refresh('cluster'); // says why, if it is the login
    }
  };
}

function fromHash() {
  const m = /^#job=(.+)$/.exec(location.hash);
  if (m) select(decodeURIComponent(m[1]));
}

window.addEventListener('hashchange', fromHash);
fromHash();
connect();
setInterval(renderChart, 5000);
