// Live cluster map: one snapshot on connect, then small deltas pushed after each commit.
(function () {
  "use strict";
  const state = { nodes: new Map(), jobs: new Map() };
  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => { const e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined) e.textContent = text; return e; };
  const ROLE_LETTER = { prefill: "P", decode: "D", colocated: "C", training: "T" };

  function stamp(ts) {
    const d = ts ? new Date(ts * 1000) : new Date();
    const t = $("last-updated"); t.textContent = d.toLocaleTimeString(); t.dateTime = d.toISOString();
  }

  function gpuCell(g) {
    const role = g.role || "none";
    const cell = el("span", `gpu role-${role} act-${g.activity || "idle"}`, g.role ? ROLE_LETTER[g.role] : "·");
    cell.dataset.gpu = g.index; cell.dataset.role = role; cell.dataset.activity = g.activity || "idle";
    const who = (g.workers || []).map((w) => `${w.job}/w${w.slot} ${w.role} (${w.activity}, weights v${w.weight_version})`).join("\n");
    cell.title = `GPU ${g.index} · ${g.hardware} · ${g.zone}${g.present ? "" : " · gone"}${who ? "\n" + who : "\nidle"}`;
    return cell;
  }

  function renderNodes() {
    const box = $("nodes"); box.replaceChildren();
    const nodes = [...state.nodes.values()].sort((a, b) => a.name.localeCompare(b.name));
    if (!nodes.length) { box.appendChild(el("p", "empty", "No nodes have registered yet.")); }
    let gpus = 0, active = 0;
    for (const n of nodes) {
      const row = el("div", `node status-${n.status}`); row.dataset.node = n.name;
      const head = el("div", "node-head");
      head.append(el("strong", "node-name", n.name), el("span", `pill pool-${n.pool}`, n.pool), el("span", `pill st-${n.status}`, n.status),
        el("span", "muted", `${n.hardware} · epoch ${n.epoch} · gen ${n.applied_generation}/${n.generation}`));
      const hb = el("span", "muted hb"); hb.dataset.heartbeat = n.last_heartbeat || ""; head.append(hb);
      const cells = el("div", "gpus");
      for (const g of n.gpus) { cells.appendChild(gpuCell(g)); gpus++; if (g.activity === "active") active++; }
      row.append(head, cells); box.appendChild(row);
    }
    $("totals").textContent = `${nodes.length} nodes · ${gpus} GPUs · ${active} active`;
    tickHeartbeats();
  }

  function tickHeartbeats() {
    const now = Date.now();
    for (const hb of document.querySelectorAll(".hb")) {
      const t = hb.dataset.heartbeat; hb.textContent = t ? `heartbeat ${Math.max(0, Math.round((now - Date.parse(t)) / 1000))}s ago` : "no heartbeat";
    }
  }

  function renderJobs() {
    const body = $("jobs"); body.replaceChildren();
    const jobs = [...state.jobs.values()].sort((a, b) => b.id - a.id);
    if (!jobs.length) { const tr = el("tr", "empty"); const td = el("td", null, "No jobs yet."); td.colSpan = 7; tr.appendChild(td); body.appendChild(tr); return; }
    for (const j of jobs) {
      const tr = el("tr"); tr.dataset.job = j.name;
      const conf = j.mode === "disaggregated" ? `${j.n_prefill}P${j.n_decode}D` : `${j.n_colocated}C`;
      for (const v of [j.name, j.status, j.policy, conf, j.step, `v${j.weight_version}`, j.training_active ? "computing" : "idle"]) tr.appendChild(el("td", null, String(v)));
      body.appendChild(tr);
    }
  }

  function addEvent(e) {
    const list = $("events"); const li = el("li");
    li.append(el("time", "muted", new Date(e.created).toLocaleTimeString()), el("code", null, e.kind), document.createTextNode(" " + e.message));
    list.prepend(li); while (list.children.length > 50) list.lastChild.remove();
  }

  function apply(msg) {
    if (msg.type === "snapshot") {
      state.nodes = new Map(msg.cluster.nodes.map((n) => [String(n.id), n]));
      state.jobs = new Map(msg.jobs.map((j) => [String(j.id), j]));
      $("events").replaceChildren();
      for (const e of [...(msg.events || [])].reverse()) addEvent(e);
      renderNodes(); renderJobs(); stamp();
      return;
    }
    if (msg.type !== "delta") return;
    if (msg.kind === "node") { state.nodes.set(msg.key, msg.data); renderNodes(); }
    else if (msg.kind === "heartbeat") {
      const n = state.nodes.get(msg.key);
      if (n) { n.last_heartbeat = msg.data.last_heartbeat; n.status = msg.data.status; n.applied_generation = msg.data.applied_generation; renderNodes(); }
    }
    else if (msg.kind === "job") { state.jobs.set(msg.key, Object.assign(state.jobs.get(msg.key) || {}, msg.data)); renderJobs(); }
    else if (msg.kind === "event") { addEvent(msg.data); }
    stamp(msg.ts);
  }

  let backoff = 500;
  function connect() {
    const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/dashboard/`);
    const conn = $("conn");
    ws.onopen = () => { conn.textContent = "live"; conn.className = "pill pill-ok"; conn.dataset.state = "live"; backoff = 500; };
    ws.onmessage = (ev) => apply(JSON.parse(ev.data));
    ws.onclose = () => { conn.textContent = "reconnecting…"; conn.className = "pill pill-wait"; conn.dataset.state = "reconnecting"; setTimeout(connect, backoff); backoff = Math.min(backoff * 2, 10000); };
  }
  setInterval(tickHeartbeats, 1000);
  connect();
})();
