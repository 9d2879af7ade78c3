// Simulator page: ask a Celery worker for a comparison, watch its status live, then browse the policies
// side by side: summary, throughput per step, configuration per step (the decisions), GPU-role timeline.
(function () {
  "use strict";
  const { $, el, api, toast, live, fmt, chartLayout } = window.PEARL;
  const runs = new Map();
  let current = null;
  const COLORS = { pearl: "#d62728", fixed: "#7f7f7f", "fixed-large": "#1f77b4", elastic: "#2ca02c", oracle: "#9467bd" };

  function scenarioChanged() {
    const o = $("sim-scenario").selectedOptions[0]; if (!o) return;
    $("sim-description").textContent = o.dataset.description;
    const box = $("sim-policies"); box.replaceChildren();
    for (const p of o.dataset.policies.split(",")) {
      const l = el("label"); const c = el("input"); c.type = "checkbox"; c.checked = true; c.value = p; c.name = "policy";
      l.append(c, document.createTextNode(" " + p + " ")); box.appendChild(l);
    }
  }
  $("sim-scenario").addEventListener("change", scenarioChanged); scenarioChanged();

  $("sim-form").addEventListener("submit", async (ev) => {
    ev.preventDefault(); $("sim-error").textContent = "";
    const policies = [...document.querySelectorAll("input[name=policy]:checked")].map((c) => c.value);
    const res = await api("POST", "/api/simulations/", { scenario: $("sim-scenario").value, seed: Number($("sim-seed").value || 0), policies });
    if (!res.ok) { $("sim-error").textContent = res.data.detail || `error ${res.status}`; return; }
    runs.set(String(res.data.id), res.data); renderRuns(); toast(`simulation #${res.data.id} queued`);
  });

  function renderRuns() {
    const body = $("runs"); body.replaceChildren();
    for (const r of [...runs.values()].sort((a, b) => b.id - a.id)) {
      const tr = el("tr"); tr.dataset.run = r.id; tr.dataset.status = r.status; tr.style.cursor = "pointer";
      tr.append(el("td", null, `#${r.id}`), el("td", null, r.scenario), el("td", null, String(r.seed)), el("td", `st-${r.status === "succeeded" ? "running" : r.status}`, r.status + (r.error ? `: ${r.error}` : "")),
        el("td", null, r.wall_s ? `${r.wall_s.toFixed(1)} s` : "–"), el("td", null, r.created_by || ""));
      tr.addEventListener("click", () => show(r.id)); body.appendChild(tr);
    }
    if (!runs.size) body.innerHTML = '<tr class="empty"><td colspan="6">No simulation yet: pick a scenario and run a comparison.</td></tr>';
  }

  async function show(id) {
    const res = await api("GET", `/api/simulations/${id}/`);
    if (!res.ok || res.data.status !== "succeeded") { toast(res.ok ? `run #${id} is ${res.data.status}` : res.data.detail, !res.ok); return; }
    current = res.data; $("run-title").textContent = `#${id} ${current.scenario} (seed ${current.seed})`;
    const pol = current.result.policies, base = pol.fixed ? pol.fixed.throughput_tok_s : null;
    const t = el("table"); t.id = "sim-summary";
    t.innerHTML = "<thead><tr><th>policy</th><th>tokens/s</th><th>vs ROLL</th><th>steps</th><th>rollout s</th><th>transitions</th><th>borrowed GPU-s</th><th>misses</th><th>lost</th><th>MAPE %</th></tr></thead>";
    const tb = el("tbody");
    for (const [p, s] of Object.entries(pol)) {
      const tr = el("tr"); tr.dataset.policy = p;
      for (const v of [p, Math.round(s.throughput_tok_s).toLocaleString(), base ? (s.throughput_tok_s / base).toFixed(2) + "×" : "–", s.steps, s.rollout_s_mean.toFixed(1),
        s.transitions, Math.round(s.borrowed_gpu_s).toLocaleString(), s.return_deadline_misses, s.lost_tokens, s.predictor_mape ?? "–"]) tr.appendChild(el("td", null, String(v)));
      tb.appendChild(tr);
    }
    t.appendChild(tb); $("summary").replaceChildren(t);
    const focus = $("sim-focus"); focus.replaceChildren();
    for (const p of Object.keys(current.result.series)) { const o = el("option", null, p); o.value = p; focus.appendChild(o); }
    focus.value = current.result.series.pearl ? "pearl" : focus.firstChild.value;
    charts();
  }
  $("sim-focus").addEventListener("change", charts);

  function charts() {
    if (!current) return;
    const ser = current.result.series, cfg = { displaylogo: false, responsive: true };
    Plotly.react("sim-throughput", Object.entries(ser).map(([p, s]) => ({ x: s.throughput.map((a) => a[0]), y: s.throughput.map((a) => a[1]), name: p, mode: "lines+markers", line: { color: COLORS[p] } })),
      chartLayout("Throughput per step (generated + training tokens / step time)", { xaxis: { title: "step" }, yaxis: { title: "tokens/s" } }), cfg);
    Plotly.react("sim-steps", Object.entries(ser).map(([p, s]) => ({ x: s.steps.map((a) => a.step), y: s.steps.map((a) => a.makespan_s), name: p, mode: "lines+markers", line: { color: COLORS[p] },
      hovertext: s.steps.map((a) => `${a.configuration}: simulated ${fmt.s(a.makespan_s)}, predicted ${fmt.s(a.predicted_makespan_s)}`) })),
      chartLayout("Rollout makespan per step (hover: configuration chosen)", { xaxis: { title: "step" }, yaxis: { title: "s" } }), cfg);
    const p = $("sim-focus").value, s = ser[p], tl = s.timeline, t = tl.map((r) => r.t);
    const traces = ["prefill", "decode", "colocated", "transitioning"].map((k) => ({ x: t, y: tl.map((r) => r[k]), name: `${k} workers`, mode: "lines", stackgroup: "w", line: { shape: "hv", width: 0 } }));
    traces.push({ x: t, y: tl.map((r) => r.available_workers), name: "dedicated workers available (trace)", mode: "lines", line: { shape: "hv", dash: "dot", color: "#fff" } });
    traces.push({ x: t, y: tl.map((r) => r.borrowed), name: "of which borrowed", mode: "lines", line: { shape: "hv", color: "#f85149" } });
    Plotly.react("sim-timeline", traces, chartLayout(`GPU–role timeline (${p})`, { xaxis: { title: "virtual time (s)" }, yaxis: { title: "workers" } }), cfg);
    const bw = s.borrow_windows;
    Plotly.react("sim-borrow", [{ base: bw.map((w) => w[0]), x: bw.map((w) => w[1] - w[0]), y: bw.map((w) => `slot ${w[2]}`), type: "bar", orientation: "h", marker: { color: COLORS[p] || "#b072f5" } }],
      chartLayout(`Borrowed training-GPU windows (${p})`, { xaxis: { title: "virtual time (s)" } }), cfg);
    const rows = s.steps.map((a) => `<tr><td>${a.step}</td><td>${a.start_s.toFixed(0)}</td><td>${a.configuration}</td><td>${fmt.s(a.predicted_makespan_s)}</td><td>${fmt.s(a.makespan_s)}</td></tr>`);
    $("sim-decisions").innerHTML = `<table><thead><tr><th>step</th><th>start (s)</th><th>${p} chose</th><th>predicted</th><th>simulated</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
  }

  function apply(msg) {
    if (msg.type === "snapshot") { runs.clear(); for (const r of msg.runs) runs.set(String(r.id), r); renderRuns(); return; }
    if (msg.type === "delta" && msg.kind === "simulation") {
      runs.set(msg.key, Object.assign(runs.get(msg.key) || {}, msg.data)); renderRuns();
      if (msg.data.status === "succeeded" && (!current || String(current.id) === msg.key || !current)) show(msg.data.id);
    }
  }
  live({ view: "sim" }, apply);
})();
