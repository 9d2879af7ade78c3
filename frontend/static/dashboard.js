// The cluster page: one snapshot on connect, then small deltas. Nodes keep a stable order (pool group,
// then name); a node delta re-renders only that node's row (detail) or block (heatmap).
(function () {
  "use strict";
  const { $, el, esc, api, confirmAction, toast, live, fmt, canOperate, chartLayout } = window.PEARL;
  const state = { nodes: new Map(), jobs: new Map(), shares: [] };
  const SHARES_KEPT = 500;
  const ROLE_LETTER = { prefill: "P", decode: "D", colocated: "C", training: "T" };
  const COLORS = { prefill: "#4c8df6", decode: "#b072f5", colocated: "#2fb6a4", training: "#e3a008", none: "#2a323d" };
  const POOL_ORDER = { reserved: 0, elastic: 1, training: 2 };
  const HEATMAP_ABOVE = 2048; // auto view: a compact heatmap above this many GPUs
  const prefs = Object.assign({ mode: "auto", group: true, pool: "", status: "", role: "", job: "", q: "" },
    JSON.parse(localStorage.getItem("pearl.map") || "{}"));
  let layout = null; // heatmap: node id -> block geometry

  // ---- GPU semantics -----------------------------------------------------------------------------
  function gpuView(g) {
    const ws = g.workers || [];
    const active = ws.find((w) => w.activity === "active");
    const trainer = ws.find((w) => w.role === "training");
    const borrowed = g.zone === "overlap" && active && active.role !== "training";
    const role = borrowed ? active.role : (g.role || "none");
    const activity = g.present ? (g.activity || "idle") : "gone";
    return { role, activity, borrowed: !!borrowed, trainer, workers: ws };
  }

  function gpuTitle(n, g, v) {
    const who = v.workers.map((w) => `${w.job}/w${w.slot} ${w.role} on ${w.hardware || g.hardware} (${w.activity}, weights v${w.weight_version})`).join("\n");
    const lent = v.borrowed ? `\nlent by ${v.trainer ? v.trainer.job + "/w" + v.trainer.slot + " training" : "training"} to ${v.role}` : "";
    return `${n.name} GPU ${g.index} · ${g.hardware} · ${g.zone}${g.present ? "" : " · gone"}${lent}${who ? "\n" + who : "\nidle"}`;
  }

  // a job's colour, the same in the share chart and under its GPUs on the map
  function jobColor(name) {
    let h = 0; for (const ch of name) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
    return `hsl(${h % 360}, 65%, 60%)`;
  }

  // the job that holds the GPU: its serving rollout worker's (a lent training GPU: the borrower's), else any
  function holder(v) {
    const w = v.workers.find((x) => x.activity === "active" && x.role !== "training") || v.workers[0];
    return w ? w.job : "";
  }

  function gpuHtml(n, g) {
    const v = gpuView(g);
    const cls = `gpu role-${v.role} act-${v.activity}${v.borrowed ? " borrowed" : ""}${g.present ? "" : " gone"}`;
    const job = holder(v);
    const vars = (v.borrowed ? `--brole:var(--${v.role});` : "") + (job ? `--job:${jobColor(job)};` : "");
    const style = vars ? ` style="${vars}"` : "";
    return `<span class="${cls}"${style} data-gpu="${g.index}" data-role="${v.role}" data-activity="${v.activity}"` +
      (job ? ` data-job="${esc(job)}"` : "") +
      `${v.borrowed ? ' data-borrowed="1"' : ""} title="${esc(gpuTitle(n, g, v))}">${ROLE_LETTER[v.role] || "·"}</span>`;
  }

  // ---- filters -----------------------------------------------------------------------------------
  function matches(n) {
    if (prefs.pool && n.pool !== prefs.pool) return false;
    if (prefs.status && n.status !== prefs.status) return false;
    if (prefs.q && !n.name.includes(prefs.q)) return false;
    if (prefs.role) {
      const ok = n.gpus.some((g) => { const v = gpuView(g); return prefs.role === "borrowed" ? v.borrowed : prefs.role === "idle" ? v.role === "none" : v.role === prefs.role || v.workers.some((w) => w.role === prefs.role); });
      if (!ok) return false;
    }
    if (prefs.job && !n.gpus.some((g) => (g.workers || []).some((w) => w.job === prefs.job))) return false;
    return true;
  }

  function sortedNodes() {
    const key = (n) => (prefs.group ? POOL_ORDER[n.pool] ?? 9 : 0);
    return [...state.nodes.values()].filter(matches).sort((a, b) => key(a) - key(b) || a.name.localeCompare(b.name));
  }

  function effectiveMode() {
    if (prefs.mode !== "auto") return prefs.mode;
    let gpus = 0; for (const n of state.nodes.values()) gpus += n.gpus.length;
    return gpus > HEATMAP_ABOVE ? "heatmap" : "detail";
  }

  // ---- detail view -------------------------------------------------------------------------------
  function actionsHtml(n) {
    if (!canOperate()) return "";
    const b = [];
    if (n.status === "ready" || n.status === "not_ready") b.push(`<button class="small" data-action="drain" data-id="${n.id}">Drain</button>`);
    if (n.status === "draining" || n.status === "gone") b.push(`<button class="small" data-action="undrain" data-id="${n.id}">Return to service</button>`);
    if (n.pool === "elastic" && n.status !== "gone" && !n.preemption_deadline) b.push(`<button class="small" data-action="preempt" data-id="${n.id}">Preemption notice…</button>`);
    return `<div class="node-actions">${b.join("")}</div>`;
  }

  function nodeHtml(n) {
    const cd = n.preemption_deadline ? `<span class="countdown" data-deadline="${esc(n.preemption_deadline)}"></span>` : "";
    return `<div class="node status-${esc(n.status)}" data-node="${esc(n.name)}" data-id="${n.id}" data-pool="${esc(n.pool)}" data-hardware="${esc(n.hardware)}">` +
      `<div class="node-head"><strong class="node-name">${esc(n.name)}</strong><span class="pill pool-${esc(n.pool)}">${esc(n.pool)}</span>` +
      `<span class="pill st-${esc(n.status)}" data-status="${esc(n.status)}">${esc(n.status)}</span>` +
      `<span class="muted">${esc(n.hardware)} · ${n.gpus.length} GPU · epoch ${n.epoch} · gen ${n.applied_generation}/${n.generation}` +
      (n.ray_node_id ? ` · Ray ${esc(n.ray_node_id.slice(0, 12))} @ ${esc(n.ray_address)}` : "") + `</span>` +
      `<span class="muted hb" data-heartbeat="${esc(n.last_heartbeat || "")}"></span>${cd}</div>` +
      `<div class="gpus">${n.gpus.map((g) => gpuHtml(n, g)).join("")}</div>${actionsHtml(n)}</div>`;
  }

  function renderDetail(nodes) {
    const box = $("nodes");
    if (!nodes.length) { box.innerHTML = `<p class="empty">${state.nodes.size ? "No node matches the filters." : "No nodes have registered yet."}</p>`; return; }
    const parts = []; let group = null;
    for (const n of nodes) {
      if (prefs.group && n.pool !== group) {
        if (group !== null) parts.push("</div>");
        group = n.pool; const count = nodes.filter((x) => x.pool === group).length;
        parts.push(`<div class="pool-group" data-pool-group="${esc(group)}"><h3>${esc(group)} pool · ${count} node(s)</h3>`);
      }
      parts.push(nodeHtml(n));
    }
    if (group !== null) parts.push("</div>");
    box.innerHTML = parts.join("");
  }

  // ---- heatmap view (canvas) ---------------------------------------------------------------------
  const CELL = 8, GAP = 1, PER_ROW = 8, NODE_GAP = 6, HEADER = 18;
  function renderHeatmap(nodes) {
    const canvas = $("heatmap"), wrap = $("heatmap-wrap");
    const width = Math.max(400, wrap.clientWidth || 1200);
    layout = new Map();
    let x = 0, y = 0, rowH = 0, group = null; const headers = [];
    for (const n of nodes) {
      if (prefs.group && n.pool !== group) {
        if (group !== null) { y += rowH + NODE_GAP; }
        group = n.pool; x = 0; rowH = 0; headers.push([group, y]); y += HEADER;
      }
      const cols = Math.min(PER_ROW, Math.max(1, n.gpus.length)), rows = Math.ceil(Math.max(1, n.gpus.length) / PER_ROW);
      const w = cols * (CELL + GAP) + 2, h = rows * (CELL + GAP) + 2;
      if (x + w > width) { x = 0; y += rowH + NODE_GAP; rowH = 0; }
      layout.set(String(n.id), { x, y, w, h, cols });
      x += w + NODE_GAP; rowH = Math.max(rowH, h);
    }
    const ratio = window.devicePixelRatio || 1;
    canvas.width = width * ratio; canvas.height = (y + rowH + 4) * ratio;
    canvas.style.width = width + "px"; canvas.style.height = (y + rowH + 4) + "px";
    const ctx = canvas.getContext("2d"); ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.fillStyle = "#8792a2"; ctx.font = "12px system-ui";
    for (const [g, gy] of headers) ctx.fillText(`${g} pool · ${nodes.filter((n) => n.pool === g).length} node(s)`, 0, gy + 12);
    for (const n of nodes) drawNode(ctx, n);
  }

  function drawNode(ctx, n) {
    const b = layout.get(String(n.id)); if (!b) return;
    ctx.clearRect(b.x - 1, b.y - 1, b.w + 2, b.h + 2);
    const edge = { draining: "#d29922", not_ready: "#f85149", gone: "#f85149" }[n.status];
    if (edge) { ctx.strokeStyle = edge; ctx.lineWidth = 1; ctx.strokeRect(b.x + 0.5, b.y + 0.5, b.w - 1, b.h - 1); }
    n.gpus.forEach((g, i) => {
      const v = gpuView(g);
      const cx = b.x + 1 + (i % b.cols) * (CELL + GAP), cy = b.y + 1 + Math.floor(i / b.cols) * (CELL + GAP);
      ctx.globalAlpha = v.activity === "gone" ? 0.2 : v.activity === "inactive" ? 0.35 : 1;
      if (v.borrowed) {
        ctx.fillStyle = COLORS.training; ctx.beginPath(); ctx.moveTo(cx, cy); ctx.lineTo(cx + CELL, cy); ctx.lineTo(cx, cy + CELL); ctx.fill();
        ctx.fillStyle = COLORS[v.role]; ctx.beginPath(); ctx.moveTo(cx + CELL, cy); ctx.lineTo(cx + CELL, cy + CELL); ctx.lineTo(cx, cy + CELL); ctx.fill();
      } else { ctx.fillStyle = COLORS[v.role] || COLORS.none; ctx.fillRect(cx, cy, CELL, CELL); }
      if (v.activity === "transitioning") { ctx.strokeStyle = "#000a"; ctx.beginPath(); ctx.moveTo(cx, cy + CELL); ctx.lineTo(cx + CELL, cy); ctx.stroke(); }
      ctx.globalAlpha = 1;
    });
  }

  function hitTest(ev) {
    const r = $("heatmap").getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top;
    for (const [id, b] of layout || []) {
      if (x >= b.x && x < b.x + b.w && y >= b.y && y < b.y + b.h) {
        const n = state.nodes.get(id); const i = Math.floor((y - b.y - 1) / (CELL + GAP)) * b.cols + Math.floor((x - b.x - 1) / (CELL + GAP));
        return { n, g: n.gpus[i], x, y };
      }
    }
    return null;
  }

  // ---- render scheduling -------------------------------------------------------------------------
  let full = true; const dirty = new Set(); let scheduled = false;
  function schedule() { if (!scheduled) { scheduled = true; requestAnimationFrame(flush); } }
  function flush() {
    scheduled = false;
    const mode = effectiveMode();
    $("nodes").hidden = mode !== "detail"; $("heatmap-wrap").hidden = mode !== "heatmap";
    if (!full) {
      for (const id of dirty) if (!patchNode(id, mode)) { full = true; break; }
    }
    if (full) {
      const nodes = sortedNodes();
      if (mode === "detail") renderDetail(nodes); else renderHeatmap(nodes);
      $("shown").textContent = `${nodes.length} of ${state.nodes.size} nodes shown`;
    }
    full = false; dirty.clear();
    totals(); tick();
    document.body.dataset.renderedAt = String(performance.now());
  }

  // Replace one node in place; false when its position could move (new node, filter or pool change).
  function patchNode(id, mode) {
    const n = state.nodes.get(id);
    if (!n || !matches(n)) return false;
    if (mode === "detail") {
      const row = $("nodes").querySelector(`.node[data-id="${id}"]`);
      if (!row || row.dataset.pool !== n.pool) return false;
      row.outerHTML = nodeHtml(n); return true;
    }
    if (!layout || !layout.has(id)) return false;
    const b = layout.get(id); if (Math.ceil(Math.max(1, n.gpus.length) / PER_ROW) * (CELL + GAP) + 2 !== b.h) return false;
    const ctx = $("heatmap").getContext("2d"); drawNode(ctx, n); return true;
  }

  function totals() {
    let gpus = 0, active = 0, borrowed = 0;
    for (const n of state.nodes.values()) for (const g of n.gpus) { gpus++; const v = gpuView(g); if (v.activity === "active") active++; if (v.borrowed) borrowed++; }
    $("totals").textContent = `${state.nodes.size} nodes · ${gpus} GPUs · ${active} active · ${borrowed} lent by training`;
  }

  function tick() {
    const now = Date.now();
    if ($("nodes").hidden) return;
    for (const hb of document.querySelectorAll(".hb")) {
      const t = hb.dataset.heartbeat; hb.textContent = t ? `heartbeat ${Math.max(0, Math.round((now - Date.parse(t)) / 1000))}s ago` : "no heartbeat";
    }
    for (const c of document.querySelectorAll(".countdown")) {
      const left = Math.round((Date.parse(c.dataset.deadline) - now) / 1000);
      c.textContent = left > 0 ? `preempted in ${left}s` : "preemption deadline passed";
    }
  }

  // ---- jobs and events ---------------------------------------------------------------------------
  function renderJobs() {
    const body = $("jobs"); body.replaceChildren();
    const jobs = [...state.jobs.values()].sort((a, b) => b.id - a.id);
    const sel = $("f-job"), keep = sel.value; sel.replaceChildren(el("option", null, "all")); sel.firstChild.value = "";
    for (const j of jobs) { const o = el("option", null, j.name); o.value = j.name; sel.appendChild(o); }
    sel.value = keep;
    if (!jobs.length) { body.innerHTML = '<tr class="empty"><td colspan="8">No jobs yet.</td></tr>'; return; }
    for (const j of jobs) {
      const tr = el("tr"); tr.dataset.job = j.name;
      const name = el("td"); const a = el("a", null, j.name); a.href = `/jobs/${j.id}/`; name.appendChild(a);
      const st = el("td"); st.appendChild(el("span", `st-${j.status}`, j.status)); if (j.failure_reason || j.status_reason) st.title = j.failure_reason || j.status_reason;
      const ov = el("td"); if (j.override) ov.appendChild(el("span", "pill pill-override", j.override)); else ov.appendChild(el("span", "muted", "none (policy decides)"));
      tr.append(name, st, el("td", null, j.policy), el("td", "config", fmt.config(j)), ov, el("td", null, String(j.step)),
        el("td", null, `v${j.weight_version}`), el("td", null, j.training_active ? "computing" : "idle"));
      body.appendChild(tr);
    }
  }

  // ---- each job's share over time (the arbiter's divisions; plotly, served locally) ----------------
  function renderShares() {
    if (typeof Plotly === "undefined") return;
    const pts = state.shares, jobs = [];
    for (const p of pts) for (const name of [...Object.keys(p.gpus), ...Object.keys(p.lent || {})]) if (!jobs.includes(name)) jobs.push(name);
    const x = pts.map((p) => p.t), text = pts.map((p) => p.why);
    const traces = [];
    for (const name of jobs) {
      const color = jobColor(name);
      traces.push({ x, y: pts.map((p) => p.gpus[name] || 0), text, name, stackgroup: "units", line: { shape: "hv", color },
        fillcolor: color, hovertemplate: `${name}: %{y} GPUs<br>%{text}<extra></extra>` });
      if (pts.some((p) => (p.lent || {})[name]))
        traces.push({ x, y: pts.map((p) => (p.lent || {})[name] || 0), text, name: `${name} (borrowed)`, stackgroup: "units",
          line: { shape: "hv", color }, fillcolor: "rgba(0,0,0,0)", fillpattern: { shape: "/", fgcolor: color },
          hovertemplate: `${name} borrowed: %{y} training GPUs<br>%{text}<extra></extra>` });
    }
    const empty = pts.length ? {} : { annotations: [{ text: "no division yet: the arbiter divides when a job arrives", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 }] };
    Plotly.react("chart-shares", traces, chartLayout("Rollout GPUs per job over time", Object.assign({ xaxis: { type: "date", gridcolor: "#2a323d" }, yaxis: { title: "GPUs", gridcolor: "#2a323d", rangemode: "tozero" } }, empty)),
      { displayModeBar: false, responsive: true });
  }

  function addEvent(e) {
    const list = $("events"); const li = el("li");
    li.append(el("time", "muted", new Date(e.created).toLocaleTimeString()), el("code", null, e.kind), document.createTextNode(" " + e.message));
    if (e.actor && !e.actor.startsWith("agent:") && e.actor !== "system") li.append(el("span", "muted", ` — ${e.actor}`));
    list.prepend(li); while (list.children.length > 50) list.lastChild.remove();
  }

  function apply(msg) {
    if (msg.type === "snapshot") {
      state.nodes = new Map(msg.cluster.nodes.map((n) => [String(n.id), n]));
      state.jobs = new Map(msg.jobs.map((j) => [String(j.id), j]));
      $("events").replaceChildren();
      for (const e of [...(msg.events || [])].reverse()) addEvent(e);
      state.shares = msg.shares || []; renderShares();
      renderJobs(); full = true;
      if (!msg.more) schedule(); // a large cluster's nodes follow in snapshot_more messages
      return;
    }
    if (msg.type === "snapshot_more") {
      for (const n of msg.nodes) state.nodes.set(String(n.id), n);
      if (msg.last) { full = true; schedule(); }
      return;
    }
    if (msg.type !== "delta") return;
    if (msg.kind === "node") { const known = state.nodes.has(msg.key); state.nodes.set(msg.key, msg.data); if (!known) full = true; dirty.add(msg.key); schedule(); }
    else if (msg.kind === "heartbeat") {
      const n = state.nodes.get(msg.key);
      if (n) {
        const statusChanged = n.status !== msg.data.status;
        Object.assign(n, { last_heartbeat: msg.data.last_heartbeat, status: msg.data.status, applied_generation: msg.data.applied_generation });
        if (statusChanged) { dirty.add(msg.key); schedule(); }
        else { const hb = $("nodes").querySelector(`.node[data-id="${msg.key}"] .hb`); if (hb) hb.dataset.heartbeat = n.last_heartbeat; }
      }
    }
    else if (msg.kind === "leases") {
      // every node's last renewal, one delta per sweep (heartbeats push none): the age ticks here, in tick()
      const cards = new Map([...$("nodes").querySelectorAll(".node[data-id] .hb")].map((hb) => [hb.closest(".node").dataset.id, hb]));
      for (const [id, ts] of Object.entries(msg.data.seen || {})) {
        const n = state.nodes.get(id); if (!n) continue;
        const seen = new Date(ts * 1000).toISOString();
        if (n.last_heartbeat && Date.parse(n.last_heartbeat) >= ts * 1000) continue;
        n.last_heartbeat = seen; const hb = cards.get(id); if (hb) hb.dataset.heartbeat = seen;
      }
    }
    else if (msg.kind === "job") { state.jobs.set(msg.key, Object.assign(state.jobs.get(msg.key) || { override: "" }, msg.data)); renderJobs(); }
    else if (msg.kind === "override") { const j = state.jobs.get(msg.key); if (j) { j.override = msg.data.summary || ""; renderJobs(); } }
    else if (msg.kind === "event") addEvent(msg.data);
    else if (msg.kind === "allotment") { state.shares.push(msg.data); state.shares.splice(0, state.shares.length - SHARES_KEPT); renderShares(); }
  }

  // ---- node actions (confirmation first; the API decides) ----------------------------------------
  async function nodeAction(action, id) {
    const n = state.nodes.get(id); if (!n) return;
    const workers = new Set(n.gpus.flatMap((g) => (g.workers || []).map((w) => `${w.job}/w${w.slot}`))).size;
    let text, body, url = `/api/nodes/${id}/${action}/`, extra = null, input = null;
    if (action === "drain") text = `Drain ${n.name}? No new work is placed on it and its ${workers} worker(s) finish what they are doing and leave; the planner re-plans the affected jobs.`;
    else if (action === "undrain") text = `Return ${n.name} to service? ${n.preemption_deadline ? "Its preemption notice is cancelled. " : ""}It becomes ready again${n.status === "gone" ? " if its agent still heartbeats" : ""} and the planner may place work on it.`;
    else {
      url = `/api/nodes/${id}/preemption/`;
      text = `Send a preemption notice to ${n.name}? It drains now and is removed at the deadline.`;
      extra = el("label", null, "Deadline, seconds from now "); input = el("input"); input.type = "number"; input.min = "1"; input.value = "30"; input.id = "deadline-s"; extra.appendChild(input);
    }
    if (!(await confirmAction(text, { extra, ok: action === "undrain" ? "Return" : action === "drain" ? "Drain" : "Send notice", danger: action !== "undrain" }))) return;
    if (input) body = { deadline_s: Number(input.value) };
    const res = await api("POST", url, body);
    if (res.ok) toast(`${n.name}: ${action === "preempt" ? "preemption notice sent" : action === "drain" ? "draining" : "returned to service"}`);
    else toast(`${n.name}: ${res.data.detail || res.status}`, true);
  }

  // ---- wiring ------------------------------------------------------------------------------------
  const controls = { mode: "f-mode", group: "f-group", pool: "f-pool", status: "f-status", role: "f-role", job: "f-job", q: "f-q" };
  for (const [k, id] of Object.entries(controls)) {
    const c = $(id);
    if (c.type === "checkbox") c.checked = !!prefs[k]; else c.value = prefs[k];
    c.addEventListener(c.type === "search" ? "input" : "change", () => {
      prefs[k] = c.type === "checkbox" ? c.checked : c.value;
      localStorage.setItem("pearl.map", JSON.stringify(prefs)); full = true; schedule();
    });
  }
  $("nodes").addEventListener("click", (ev) => { const b = ev.target.closest("button[data-action]"); if (b) nodeAction(b.dataset.action, b.dataset.id); });
  const canvas = $("heatmap"), tip = $("tip");
  canvas.addEventListener("mousemove", (ev) => {
    const h = hitTest(ev);
    if (!h) { tip.style.display = "none"; return; }
    tip.textContent = h.g ? gpuTitle(h.n, h.g, gpuView(h.g)) + `\nnode ${h.n.status}` : `${h.n.name} (${h.n.status})`;
    tip.style.left = h.x + 14 + "px"; tip.style.top = h.y + 14 + "px"; tip.style.display = "block";
  });
  canvas.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  canvas.addEventListener("click", (ev) => { const h = hitTest(ev); if (h) { prefs.q = h.n.name; prefs.mode = "detail"; $("f-q").value = h.n.name; $("f-mode").value = "detail"; full = true; schedule(); } });
  window.addEventListener("resize", () => { if (effectiveMode() === "heatmap") { full = true; schedule(); } });
  setInterval(tick, 1000);
  window.__pearlState = state;
  live({}, apply);
})();
