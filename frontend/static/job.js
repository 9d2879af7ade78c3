// The job page: status and failure reason, configuration and the override in force, plotly charts of
// the per-step history, the latest decision, transitions and events; live over /ws/dashboard/?view=job.
(function () {
  "use strict";
  const { $, el, api, confirmAction, toast, live, fmt, canOperate, chartLayout } = window.PEARL;
  const initial = JSON.parse($("initial").textContent);
  let S = initial.status; // the job_status read model
  const series = initial.series; // {steps: [...], train: [...]}
  const jobId = S.job.id;
  let evFilter = "";

  // ---- header and cards --------------------------------------------------------------------------
  function renderHeader() {
    const j = S.job;
    const st = $("job-status"); st.textContent = j.status; st.className = `pill st-${j.status}`; st.dataset.status = j.status;
    const paused = j.status === "paused" ? `Paused at step ${j.step}: its rollout workers are released; its trainer (weights v${j.weight_version}), ` +
      "its step and its trajectories are kept, and Resume brings it back where it was." : "";
    const why = j.failure_reason ? `Failed: ${j.failure_reason}` : (paused || (j.status_reason ? `Waiting: ${j.status_reason}` : ""));
    const f = $("failure"); f.hidden = !why; f.textContent = why;
    const stop = $("stop"); if (stop) stop.disabled = j.status === "stopped" || j.status === "failed";
    const pause = $("pause"); if (pause) pause.hidden = j.status !== "running";
    const resume = $("resume"); if (resume) resume.hidden = j.status !== "paused";
    const d = S.latest_decision, st8 = S.staleness;
    const cards = [
      ["Configuration", `${fmt.config(j)} ${j.mode}`, "config"],
      ["Policy", j.policy + (S.override_summary ? " (override)" : ""), "policy"],
      ["Step", String(j.step), "step"],
      ["Predicted makespan", d ? fmt.s(d.predicted_makespan_s) : "–", "predicted"],
      ["Weights", `v${j.weight_version}` + (st8.workers_min !== null ? ` · workers v${st8.workers_min}–v${st8.workers_max}` : ""), "weights"],
      // the lag of the workers that serve; asleep overlap workers pull the weights lazily when woken
      ["Staleness", (st8.lag === null ? "no serving worker" : `lag ${st8.lag} / bound ${st8.max_staleness}${st8.within_bound ? "" : " (over!)"}`) +
        (st8.asleep ? ` · ${st8.asleep} asleep (pull on wake)` : "") +
        (st8.stale_aborted_last_step ? ` · ${st8.stale_aborted_last_step} aborted` : ""), "staleness"],
      ["Trainer", j.training_active ? "computing (borrowed GPUs returned)" : "idle (training GPUs may be lent)", "training"],
      ["Spec", `${j.model} · ${j.engine} · ${hardwareText(j)} · TP${j.tp} · B=${j.batch_size} · G=${j.group_size} · ${j.rollout_gpus}+${j.training_gpus} GPUs`, "spec"],
      // the cluster arbiter's share of the rollout GPUs (issue 35)
      ...(j.sharing ? [["Share", (j.sharing.allotted_rollout_gpus === null ? "not divided yet" : `allotted ${j.sharing.allotted_rollout_gpus}`) +
        ` of ≤ ${j.sharing.max_rollout_gpus || "all"} rollout GPUs · holds ${j.sharing.held_rollout_gpus} · guaranteed ${j.sharing.min_rollout_gpus}` +
        ` · priority ${j.sharing.priority} · weight ${j.sharing.weight}` + lendsText(j.sharing), "share"]] : []),
      ["Submitted", `${j.submitted_by || j.created_by || "unknown"} at ${fmt.time(j.created)}`, "submitted"],
    ];
    const box = $("cards"); box.replaceChildren();
    for (const [k, v, id] of cards) { const c = el("div", "card"); c.dataset.card = id; c.append(el("div", "k", k), el("div", "v", v)); box.appendChild(c); }
    $("override-summary").textContent = S.override_summary || "none — the policy decides";
  }

  // cross-job lends of idle training GPUs (issue 35), each until the owner's next Training Begin
  function lendsText(sh) {
    const part = (m, f) => Object.entries(m || {}).map(([job, n]) => f(job, n));
    return [...part(sh.borrows, (job, n) => ` · borrows ${n} of ${job}'s training GPUs`),
            ...part(sh.lends, (job, n) => ` · lends ${n} training GPUs to ${job}`),
            ...(sh.not_lending ? [` · lends no training GPU: ${sh.not_lending}`] : [])].join("");
  }

  // training on `hardware`; the rollout pool on the types the job accepts (issue 23: mixed pools)
  function hardwareText(j) {
    const types = j.hardware_types && j.hardware_types.length ? j.hardware_types : [j.hardware];
    return types.length === 1 && types[0].toLowerCase() === j.hardware.toLowerCase() ? j.hardware : `train ${j.hardware}, rollout ${types.join("+")}`;
  }

  // ---- workers: each one's node and chip type ------------------------------------------------------
  function renderWorkers() {
    const ws = S.workers || [], body = $("workers").querySelector("tbody"); body.replaceChildren();
    $("workers-empty").hidden = ws.length > 0;
    const counts = {};
    for (const w of ws) {
      const tr = el("tr"); tr.dataset.slot = w.slot; tr.dataset.hardware = w.hardware;
      for (const v of [`w${w.slot}`, w.role, w.activity, w.node, w.pool, w.hardware, w.gpus.join(","), `v${w.weight_version}`]) tr.appendChild(el("td", null, v));
      body.appendChild(tr);
      if (w.role !== "training") counts[w.hardware] = (counts[w.hardware] || 0) + 1;
    }
    $("workers-summary").textContent = Object.keys(counts).length ? "rollout workers: " + Object.entries(counts).sort().map(([h, n]) => `${n} on ${h}`).join(", ") : "";
  }

  // ---- overrides ---------------------------------------------------------------------------------
  function fillOverrides() {
    const o = S.override || {};
    const mode = o.force_n_prefill && o.force_n_decode ? "disaggregated" : (o.force_mode || "auto");
    for (const r of document.querySelectorAll("input[name=mode]")) r.checked = r.value === mode;
    $("ov-p").value = o.force_n_prefill || ""; $("ov-d").value = o.force_n_decode || "";
    for (const r of document.querySelectorAll("input[name=pd_kind]")) r.checked = r.value === (o.force_n_prefill && !o.force_exact ? "ratio" : "exact");
    $("ov-freeze").checked = !!o.freeze; $("ov-borrowing").checked = o.borrowing !== false; $("ov-elasticity").checked = o.elasticity !== false;
    pdEnabled();
    if (!canOperate()) for (const i of $("overrides").querySelectorAll("input")) i.disabled = true;
  }
  function pdEnabled() {
    const dis = document.querySelector("input[name=mode]:checked")?.value === "disaggregated";
    for (const i of $("pd-fields").querySelectorAll("input")) i.disabled = !dis || !canOperate();
  }
  function overrideBody() {
    const mode = document.querySelector("input[name=mode]:checked")?.value || "auto";
    const p = $("ov-p").value, d = $("ov-d").value, pd = mode === "disaggregated" && (p !== "" || d !== "");
    return {
      force_mode: mode === "auto" ? "" : mode,
      force_n_prefill: pd && p !== "" ? Number(p) : null, force_n_decode: pd && d !== "" ? Number(d) : null,
      force_exact: pd && document.querySelector("input[name=pd_kind]:checked")?.value === "exact",
      freeze: $("ov-freeze").checked, borrowing: $("ov-borrowing").checked, elasticity: $("ov-elasticity").checked,
    };
  }
  function describe(o) {
    const parts = [];
    if (o.force_n_prefill || o.force_n_decode) parts.push(o.force_exact ? `exactly ${o.force_n_prefill}P${o.force_n_decode}D` : `P:D ratio ${o.force_n_prefill}:${o.force_n_decode} scaled to the budget`);
    else parts.push(o.force_mode ? `force ${o.force_mode}` : "auto mode");
    parts.push(o.freeze ? "frozen" : "not frozen", o.borrowing ? "borrowing on" : "borrowing off", o.elasticity ? "elasticity on" : "elasticity off");
    return parts.join(", ");
  }
  $("overrides").addEventListener("change", (ev) => { if (ev.target.name === "mode") pdEnabled(); });
  $("overrides").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    for (const e of $("overrides").querySelectorAll(".field-error")) e.textContent = "";
    $("ov-error").textContent = "";
    const body = overrideBody();
    if (!(await confirmAction(`Set the overrides of ${S.job.name} to: ${describe(body)}? The planner re-plans the job at once.`, { ok: "Apply" }))) return;
    const res = await api("PUT", `/api/jobs/${jobId}/overrides/`, body);
    if (res.ok) { toast("overrides applied; re-planning"); return; }
    const slot = res.data.field && $("err_" + res.data.field);
    if (slot) slot.textContent = res.data.detail; else $("ov-error").textContent = res.data.detail || `error ${res.status}`;
  });
  const stop = $("stop");
  if (stop) stop.addEventListener("click", async () => {
    if (!(await confirmAction(`Stop ${S.job.name}? Every worker of the job is released; this cannot be undone.`, { ok: "Stop job", danger: true }))) return;
    const res = await api("POST", `/api/jobs/${jobId}/stop/`);
    if (!res.ok) toast(res.data.detail || `error ${res.status}`, true); else toast("job stopped");
  });
  // pause: the rollout workers drain and are released, the trainer (an update in progress finishes), the
  // driver's step and trajectories, the checkpoint and the records stay; resume: it runs again where it was
  const jobAction = (id, verb, text, done) => {
    const b = $(id);
    if (b) b.addEventListener("click", async () => {
      if (!(await confirmAction(text(), { ok: verb }))) return;
      const res = await api("POST", `/api/jobs/${jobId}/${id}/`);
      if (!res.ok) { toast(res.data.detail || `error ${res.status}`, true); return; }
      S.job.status = res.data.status; renderHeader(); toast(done);
    });
  };
  jobAction("pause", "Pause", () => `Pause ${S.job.name}? Its rollout workers finish or hand back their turns and are released; ` +
    "its trainer, its step and its finished trajectories are kept, and Resume brings it back where it was.", "job paused");
  jobAction("resume", "Resume", () => `Resume ${S.job.name} at step ${S.job.step}? The planner places its rollout workers again.`, "job resumed");

  // ---- decision, transitions, events ---------------------------------------------------------------
  function renderDecision() {
    const d = S.latest_decision, box = $("decision");
    if (!d) { box.innerHTML = '<p class="empty">No decision yet.</p>'; return; }
    const head = el("div");
    head.append(el("p", null, `${fmt.time(d.created)} · signal ${d.signal} · budget ${d.budget.dedicated_workers ?? "?"} dedicated + ${d.borrow} borrowed worker(s)` +
      (d.confidence !== null ? ` · predictor confidence ${(100 * d.confidence).toFixed(0)}%` : "")));
    const verdict = el("p"); verdict.id = "decision-verdict";
    verdict.append(el("strong", null, `Chose ${d.label}`), document.createTextNode(` (predicted ${fmt.s(d.predicted_makespan_s)}), expected gain ${fmt.pct(d.expected_gain)} — `),
      el("span", d.admitted ? "pill pill-ok" : "pill pill-wait", d.admitted ? "admitted" : "suppressed"));
    const reason = el("p", null, d.reason); reason.id = "decision-reason";
    if (d.budget && d.budget.training_active !== undefined) reason.title = JSON.stringify(d.profile.gate || "");
    const gate = d.profile && d.profile.gate ? el("p", "muted", `Borrowing: ${d.profile.gate}`) : null;
    const pi = d.profile ? d.profile.prefill_interference : undefined;
    const interference = typeof pi === "number" ? el("p", "muted", `PD interference: prefill next to running decodes costs ${pi.toFixed(2)}× prefill alone ` +
      `(measured from the engines' prefill records; 1.00 until both kinds are seen). Colocated candidates carry it, prefill workers do not.`) : null;
    if (interference) interference.id = "decision-interference";
    const cands = [...d.candidates];
    const shown = cands.length > 200 ? cands.filter((c) => c.feasible).sort((a, b) => a.makespan_s - b.makespan_s).slice(0, 199) : cands;
    if (shown.length < cands.length && !shown.some((c) => c.label === d.label)) { const c = cands.find((x) => x.label === d.label); if (c) shown.push(c); }
    const t = el("table"); t.id = "candidates";
    t.innerHTML = "<thead><tr><th>candidate</th><th>predicted makespan</th><th>prefill</th><th>decode</th><th>KV transfer</th><th>env</th><th>feasible</th></tr></thead>";
    const tb = el("tbody");
    for (const c of shown) {
      const tr = el("tr", (c.label === d.label ? "chosen" : "") + (c.feasible ? "" : " infeasible")); tr.dataset.label = c.label;
      tr.append(el("td", null, c.label + (c.label === d.label ? " ◀ chosen" : "")), el("td", null, fmt.s(c.makespan_s)), el("td", null, fmt.s(c.prefill_s)),
        el("td", null, fmt.s(c.decode_s)), el("td", null, fmt.s(c.kv_transfer_s)), el("td", null, fmt.s(c.env_s)), el("td", null, c.feasible ? "yes" : `no: ${c.why_infeasible}`));
      tb.appendChild(tr);
    }
    t.appendChild(tb);
    const wrap = el("div", "scroll"); wrap.appendChild(t);
    const total = d.candidates_total || cands.length;
    const note = shown.length < total ? el("p", "muted", `showing the ${shown.length} best of ${total} candidates (colocation and the choice always)`) : null;
    box.replaceChildren(head, verdict, reason, ...(gate ? [gate] : []), ...(interference ? [interference] : []), wrap, ...(note ? [note] : []));
  }

  function renderTransitions() {
    const box = $("transitions"); box.replaceChildren();
    if (!S.transitions.length) { box.appendChild(el("p", "empty", "No transition yet.")); return; }
    for (const t of S.transitions) {
      const d = el("div", "card"); d.dataset.transition = t.id; d.dataset.status = t.status;
      d.append(el("div", null, `#${t.id} → ${t.plan.target || "?"} · ${t.status} · ${fmt.time(t.created)}` +
        ` · +${Object.keys(t.plan.add || {}).length} −${(t.plan.remove || []).length} re-role ${Object.keys(t.plan.reassign || {}).length}` + (t.error ? ` · ${t.error}` : "")));
      const steps = el("div", "steps");
      for (const s of t.steps) { const c = el("span", `step ${s.status}`, `${s.index}. ${s.kind}${s.worker_slot !== null ? " w" + s.worker_slot : ""}`); c.title = `${s.status}, ${s.attempts} attempt(s)${s.error ? ": " + s.error : ""}`; steps.appendChild(c); }
      d.appendChild(steps); box.appendChild(d);
    }
  }

  function renderEvents() {
    const list = $("events"); list.replaceChildren();
    for (const e of S.events.filter((e) => !evFilter || (evFilter.endsWith(".") ? e.kind.startsWith(evFilter) : e.kind === evFilter))) {
      const li = el("li"); li.append(el("time", "muted", fmt.time(e.created)), el("code", null, e.kind), document.createTextNode(" " + e.message));
      if (e.actor) li.append(el("span", "muted", ` — ${e.actor}`)); list.appendChild(li);
    }
    const audit = $("audit"); audit.replaceChildren();
    for (const e of S.events.filter((e) => e.kind === "override.set")) {
      const li = el("li"); li.append(el("time", "muted", fmt.time(e.created)), document.createTextNode(` ${e.actor}: ${describe(e.data.before || {})} → ${describe(e.data.after || {})}`));
      audit.appendChild(li);
    }
    if (!audit.children.length) audit.appendChild(el("li", "muted", "No override changes yet."));
  }
  $("ev-filter").addEventListener("change", (ev) => { evFilter = ev.target.value; renderEvents(); });

  // ---- checkpoints (issue 36): Hugging Face directories to take home; the trackers and what they took ----
  async function loadCheckpoints() {
    const r = await api("GET", `/api/jobs/${jobId}/checkpoints/`);
    if (!r.ok) return;
    const body = $("checkpoints").querySelector("tbody"); body.replaceChildren();
    $("checkpoints-empty").hidden = r.data.length > 0;
    const j = S.job;
    $("checkpoints-summary").textContent = `every ${j.checkpoint_every} updates, ${j.checkpoint_keep ? "newest " + j.checkpoint_keep + " kept" : "all kept"}` +
      (j.init_from ? ` · started from ${j.init_from}` : "");
    for (const c of r.data.slice().reverse()) {
      const tr = el("tr"); tr.dataset.step = c.step;
      for (const v of [String(c.step), `v${c.weight_version}`, fmt.time(c.written), `${(c.size_bytes / 1e6).toFixed(1)} MB`, c.tokenizer, c.path]) tr.appendChild(el("td", null, v));
      const a = el("a", null, "download (tar)"); a.href = `/api/jobs/${jobId}/checkpoints/${c.step}/`;
      const td = el("td"); td.appendChild(a); tr.appendChild(td); body.appendChild(tr);
    }
  }
  function renderTrackers() {
    const conf = S.job.tracking || {}, state = S.job.tracking_state || {}, ul = $("trackers"); ul.replaceChildren();
    $("trackers-empty").hidden = Object.keys(conf).length > 0;
    for (const [name, c] of Object.entries(conf)) {
      const st = state[name] || {};
      const where = c.logdir || c.uri || c.project || "";
      const li = el("li", st.error ? "tracker-failed" : null,
        `${name} (${where}): ` + (st.error ? `failing — ${st.error}` : st.step >= 0 ? `logged through step ${st.step}` : "no trained step yet"));
      li.dataset.tracker = name; ul.appendChild(li);
    }
  }

  // ---- charts (plotly, served locally) -------------------------------------------------------------
  const EMPTY = { annotations: [{ text: "no step has finished yet: points appear as the rollout driver reports them", showarrow: false, font: { color: "#8792a2" } }] };
  function charts() {
    if (!window.Plotly) return;
    const st = series.steps, tr = series.train, steps = st.map((s) => s.step);
    const cfg = { displaylogo: false, responsive: true };
    Plotly.react("chart-makespan", [
      { x: steps, y: st.map((s) => s.makespan_s), name: "observed", mode: "lines+markers" },
      { x: steps, y: st.map((s) => s.predicted_makespan_s || null), name: "predicted (configuration used)", mode: "lines+markers" },
      { x: steps, y: st.map((s) => s.predicted_at_start_s || null), name: "predicted at step start", mode: "lines", line: { dash: "dot" } },
      { x: steps, y: st.map((s) => s.confidence), name: "predictor confidence", yaxis: "y2", mode: "lines", line: { dash: "dash", color: "#8792a2" } },
    ], chartLayout("Rollout makespan per step: predicted vs observed", Object.assign({ xaxis: { title: "step", gridcolor: "#2a323d" }, yaxis: { title: "s", gridcolor: "#2a323d" },
      yaxis2: { title: "confidence", overlaying: "y", side: "right", range: [0, 1] } }, st.length ? {} : EMPTY)), cfg);
    Plotly.react("chart-throughput", [{ x: steps, y: st.map((s) => s.throughput_tok_s), type: "bar", name: "tokens/s",
      hovertext: st.map((s) => `${s.mode} ${s.mode === "disaggregated" ? s.n_prefill + "P" + s.n_decode + "D" : s.n_colocated + "C"}`) }],
      chartLayout("Throughput per step ((generated + training tokens) / step time)", Object.assign({ xaxis: { title: "step" }, yaxis: { title: "tokens/s" } }, st.length ? {} : EMPTY)), cfg);
    Plotly.react("chart-reward", [{ x: steps, y: st.map((s) => s.reward_mean), mode: "lines+markers", name: "mean reward",
      error_y: { type: "data", array: st.map((s) => s.reward_std || 0), visible: true, color: "#8792a2" } }],
      chartLayout("Reward per step", Object.assign({ xaxis: { title: "step" }, yaxis: { title: "mean reward" } }, st.length ? {} : EMPTY)), cfg);
    const t0 = Math.min(...st.map((s) => s.time_s).concat(tr.map((t) => t.time_s - t.duration_s)).filter((x) => x > 0), Infinity);
    const rel = (x) => (isFinite(t0) ? x - t0 : x);
    const shapes = tr.map((t) => ({ type: "rect", xref: "x", yref: "paper", x0: rel(t.time_s - t.duration_s), x1: rel(t.time_s), y0: 0, y1: 1, fillcolor: "#e3a008", opacity: 0.18, line: { width: 0 } }));
    Plotly.react("chart-borrow", [
      { x: st.map((s) => rel(s.time_s)), y: st.map((s) => s.borrowed_gpu_s), type: "bar", name: "borrowed GPU-s in the step", marker: { color: "#b072f5" } },
      { x: tr.map((t) => rel(t.time_s)), y: tr.map((t) => t.return_latency_s), mode: "markers", name: "return latency (s)", yaxis: "y2", marker: { color: "#f85149", symbol: "x" },
        hovertext: tr.map((t) => `training step ${t.step}: ${fmt.s(t.duration_s)}, return ${fmt.s(t.return_latency_s)} (deadline ${fmt.s(t.return_deadline_s)})`) },
    ], chartLayout("Borrowed training GPUs vs training steps (shaded)", Object.assign({ shapes, xaxis: { title: "time (s)" }, yaxis: { title: "GPU-seconds" },
      yaxis2: { title: "return latency (s)", overlaying: "y", side: "right" } }, st.length || tr.length ? {} : EMPTY)), cfg);
    const ds = S.decisions;
    Plotly.react("chart-decisions", [{ x: ds.map((d) => d.created), y: ds.map((d) => d.predicted_makespan_s), mode: "lines+markers+text", name: "chosen configuration",
      text: ds.map((d) => d.label), textposition: "top center", line: { shape: "hv" },
      marker: { size: 9, color: ds.map((d) => (d.admitted ? "#3fb950" : "#8792a2")) },
      hovertext: ds.map((d) => `${d.label} (${d.admitted ? "admitted" : "suppressed"}, ${d.signal}): ${d.reason}`), hoverinfo: "text" }],
      chartLayout("Decisions over time (predicted makespan of the choice; grey = suppressed)", { yaxis: { title: "s" } }), cfg);
  }

  function addSeriesRecord(kind, rec) {
    if (kind === "train") { series.train.push(rec); charts(); return; }
    const prev = series.steps[series.steps.length - 1];
    const dur = prev && rec.time_s > prev.time_s ? rec.time_s - prev.time_s : rec.makespan_s || 0;
    const tokens = (rec.generated_tokens_total || 0) + (rec.train_tokens || 0);
    series.steps.push(Object.assign({ confidence: S.latest_decision ? S.latest_decision.confidence : null }, rec, { duration_s: dur, throughput_tok_s: dur > 0 ? tokens / dur : null }));
    charts();
  }

  // ---- trajectory browser (environment agent) -------------------------------------------------------
  // a step's trajectories; one opened as its chat transcript and its tokens, mask 0 (template, tool
  // output, observation: not trained on) greyed, mask 1 (sampled by the policy) with its log-prob
  const tr = { step: null, rows: [], open: null, steps: [] };
  async function loadTrajectorySteps() {
    if (!$("trajectories-section")) return;
    const r = await api("GET", `/api/jobs/${jobId}/trajectories/steps/`);
    if (!r.ok) return;
    tr.steps = r.data;
    const sel = $("tr-step"), keep = sel.value;
    sel.replaceChildren();
    for (const s of tr.steps) {
      // given up: members that failed agent_max_attempts times (out of the batch); groups dropped: left with < 2
      const outOfBatch = (s.given_up ? `, ${s.given_up} given up` : "") + (s.dropped_groups ? `, ${s.dropped_groups} groups dropped` : "");
      // the audit (issue 34): trained by the step's committed update, untrained (done, left out of it: the row says
      // why), rerun (regenerated after a crash), resumed (continued from a kept prefix)
      const audit = ` · trained ${s.trained || 0}, untrained ${s.untrained || 0}, rerun ${s.rerun || 0}, resumed ${s.resumed || 0}`;
      const o = el("option", null, `step ${s.step} · ${s.total} (${s.done || 0} done, ${s.failed || 0} failed, ${s.aborted || 0} aborted${outOfBatch})${audit}`);
      o.value = String(s.step); sel.appendChild(o);
    }
    if (!tr.steps.length) { $("tr-empty").hidden = false; return; }
    $("tr-empty").hidden = true;
    sel.value = tr.steps.some((s) => String(s.step) === keep) ? keep : String(tr.steps[0].step);
    if (sel.value !== String(tr.step)) await loadTrajectories(Number(sel.value));
  }
  async function loadTrajectories(step) {
    tr.step = step;
    const status = $("tr-status").value;
    const r = await api("GET", `/api/jobs/${jobId}/trajectories/?step=${step}&limit=200` + (status ? `&status=${status}` : ""));
    if (!r.ok) { $("tr-more").textContent = r.data.detail || `error ${r.status}`; return; }
    tr.rows = r.data.results;
    $("tr-more").textContent = r.data.count > tr.rows.length ? `showing ${tr.rows.length} of ${r.data.count}` : "";
    const tb = $("trajectories").querySelector("tbody"); tb.replaceChildren();
    for (const t of tr.rows) {
      const row = el("tr", `tr-${t.status}`); row.dataset.name = t.name; row.tabIndex = 0;
      const sampled = t.mask.reduce((a, m) => a + m, 0);
      row.append(el("td", null, t.name), el("td", null, t.trained === false ? `${t.status} (not trained)` : t.status), el("td", null, t.reward === null ? "–" : t.reward.toFixed(3)),
        el("td", null, String(t.turns)), el("td", null, String(t.forks)), el("td", null, `${sampled}/${t.token_count}${t.truncated ? "+" : ""}`),
        el("td", "muted", t.reason || ""));
      row.addEventListener("click", () => openTrajectory(t));
      row.addEventListener("keydown", (ev) => { if (ev.key === "Enter") openTrajectory(t); });
      tb.appendChild(row);
    }
    if (tr.open) { const again = tr.rows.find((t) => t.name === tr.open); if (again) openTrajectory(again); }
  }
  // a turn's workers, in order (a turn resumed on another worker lists each; older rows hold one id)
  function servedBy(w) {
    const ids = (Array.isArray(w) ? w : w === undefined ? [] : [w]).filter((x) => x >= 0);
    return ids.length ? ids.join(" → ") : "–";
  }
  function openTrajectory(t) {
    tr.open = t.name;
    for (const row of $("trajectories").querySelectorAll("tbody tr")) row.classList.toggle("chosen", row.dataset.name === t.name);
    const box = $("transcript"); box.replaceChildren();
    box.append(el("h3", null, `${t.name} · ${t.status}` + (t.reward === null ? "" : ` · reward ${t.reward}`)));
    if (t.reason) box.append(el("p", "failure", t.reason));
    if (t.stderr) { const pre = el("pre", "stderr", t.stderr); box.append(el("p", "muted", "stderr (tail):"), pre); }
    const chat = el("div", "chat"); chat.id = "transcript-chat";
    for (const m of t.messages) {
      const b = el("div", `msg msg-${m.role}`); b.dataset.role = m.role;
      b.append(el("div", "msg-role", m.role + (m.tool_call_id ? ` (${m.tool_call_id})` : "")), el("div", "msg-text", m.content || ""));
      if (m.tool_calls) b.append(el("code", "muted", m.tool_calls));
      chat.appendChild(b);
    }
    if (!t.messages.length) chat.append(el("p", "empty", "no messages"));
    box.append(el("h4", null, "Chat"), chat);
    const turns = el("table"); turns.id = "transcript-turns";
    turns.innerHTML = "<thead><tr><th>turn</th><th>weights</th><th>worker</th><th>latency</th></tr></thead>";
    const tb = el("tbody");
    t.weight_versions.forEach((v, i) => {
      const row = el("tr"); row.append(el("td", null, String(i + 1)), el("td", null, `v${v}`),
        el("td", null, servedBy(t.workers[i])), el("td", null, fmt.s(t.latency_s[i])));
      tb.appendChild(row);
    });
    turns.appendChild(tb);
    box.append(el("h4", null, `Turns (${t.turns}${t.forks ? `, ${t.forks} fork(s)` : ""})`), turns);
    const toks = el("div", "tokens"); toks.id = "transcript-tokens";
    let i = 0;
    for (const n of t.sample_lens.length ? t.sample_lens : [t.tokens.length]) {
      const sample = el("div", "sample");
      for (const end = Math.min(t.tokens.length, i + n); i < end; i++) {
        const sp = el("span", t.mask[i] ? "tok tok-sampled" : "tok tok-masked", String(t.tokens[i]));
        sp.dataset.mask = String(t.mask[i]);
        sp.title = t.mask[i] ? `sampled · log-prob ${t.logprobs[i]}` : "mask 0: not trained on";
        sample.append(sp, document.createTextNode(" "));
      }
      toks.appendChild(sample);
    }
    box.append(el("h4", null, `Tokens (${t.token_count}${t.truncated ? `, the first ${t.tokens.length} shown` : ""}) — greyed: mask 0`), toks);
  }
  if ($("trajectories-section")) {
    $("tr-step").addEventListener("change", (ev) => loadTrajectories(Number(ev.target.value)));
    $("tr-status").addEventListener("change", () => { if (tr.step !== null) loadTrajectories(tr.step); });
    $("tr-refresh").addEventListener("click", () => loadTrajectorySteps());
    loadTrajectorySteps();
  }
  let lastStep = S.job.step;

  // ---- live ----------------------------------------------------------------------------------------
  let refreshTimer = null;
  function refreshSoon() { // decisions and transitions carry tables: fetch the read model once, after a burst
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(async () => { const r = await api("GET", `/api/jobs/${jobId}/status/`); if (r.ok) { S = r.data; renderAll(false); } }, 150);
  }
  function renderAll(resetForm) { renderHeader(); if (resetForm) fillOverrides(); renderDecision(); renderTransitions(); renderWorkers(); renderEvents(); renderTrackers(); charts(); }

  function apply(msg) {
    if (msg.type === "snapshot") {
      S = msg.status; series.steps = msg.series.steps; series.train = msg.series.train; renderAll(true); return;
    }
    if (msg.type !== "delta") return;
    const d = msg.data;
    if (msg.kind === "job") {
      Object.assign(S.job, d); renderHeader();
      if (d.step !== undefined && d.step !== lastStep) { lastStep = d.step; loadTrajectorySteps(); } // a step ended: its trajectories
    }
    else if (msg.kind === "override") { S.override = d; S.override_summary = d.summary || ""; renderHeader(); fillOverrides(); }
    else if (msg.kind === "decision") {
      $("decision").dataset.pending = String(d.id);
      const r = $("decision-reason"); if (r) r.textContent = d.reason; // at once; the table follows
      refreshSoon();
    }
    else if (msg.kind === "event") {
      S.events.unshift(d); S.events.length = Math.min(S.events.length, 200); renderEvents();
      if (d.kind.startsWith("transition.") || d.kind.startsWith("tracking.")) refreshSoon();
      if (d.kind === "checkpoint.written") loadCheckpoints();
    }
    else if (msg.kind === "transition") refreshSoon();
    else if (msg.kind === "series") addSeriesRecord(d.kind, d.record);
  }

  renderAll(true);
  loadCheckpoints();
  live({ view: "job", job: jobId }, apply);
})();
