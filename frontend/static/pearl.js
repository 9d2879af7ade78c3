// Shared by every page: the live socket (stale marking, resync on reconnect), the REST client the
// pages act through (the same API as the CLI), a confirmation dialog, and small DOM helpers.
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => { const e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined && text !== null) e.textContent = text; return e; };
  const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  const canOperate = () => document.body.dataset.canOperate === "1";

  function cookie(name) {
    const m = document.cookie.match(new RegExp("(?:^|; )" + name + "=([^;]*)"));
    return m ? decodeURIComponent(m[1]) : "";
  }

  // REST call with the session and CSRF token; resolves {ok, status, data}. Errors keep the API's shape
  // {"error", "field", "detail", "errors"?} so forms can put each message beside its field.
  async function api(method, url, body) {
    const opts = { method, headers: { Accept: "application/json" }, credentials: "same-origin" };
    if (body !== undefined) { opts.headers["Content-Type"] = "application/json"; opts.body = JSON.stringify(body); }
    if (method !== "GET") opts.headers["X-CSRFToken"] = cookie("csrftoken");
    let res;
    try { res = await fetch(url, opts); } catch (e) { return { ok: false, status: 0, data: { detail: "the server cannot be reached: " + e.message } }; }
    let data = null;
    try { data = await res.json(); } catch (e) { data = { detail: `${res.status} ${res.statusText}` }; }
    return { ok: res.ok, status: res.status, data };
  }

  // A modal confirmation; `extra` may add inputs (read them in onConfirm before the dialog closes).
  function confirmAction(text, { extra = null, ok = "Confirm", danger = false } = {}) {
    const dlg = $("confirm");
    $("confirm-text").textContent = text;
    const box = $("confirm-extra"); box.replaceChildren(); if (extra) box.appendChild(extra);
    const okBtn = $("confirm-ok"); okBtn.textContent = ok; okBtn.className = danger ? "danger" : "primary";
    return new Promise((resolve) => {
      dlg.addEventListener("close", () => resolve(dlg.returnValue === "ok"), { once: true });
      dlg.returnValue = ""; dlg.showModal();
    });
  }

  function toast(text, bad) {
    let t = $("toast");
    if (!t) { t = el("div"); t.id = "toast"; t.style.cssText = "position:fixed;right:16px;bottom:16px;padding:8px 12px;border-radius:6px;z-index:10;max-width:480px"; document.body.appendChild(t); }
    t.textContent = text; t.style.background = bad ? "#5a1d1d" : "#1d3b27"; t.dataset.kind = bad ? "error" : "ok";
    clearTimeout(t._h); t._h = setTimeout(() => { t.textContent = ""; t.style.background = "transparent"; }, 6000);
  }

  // The live feed. While the socket is down the page says so and greys the live data (it is stale);
  // on reconnect the server sends a fresh snapshot, which replaces everything (resynchronised).
  function live(params, onMessage) {
    let backoff = 500, staleSince = null;
    const conn = $("conn");
    const setState = (state, text, cls) => { if (conn) { conn.dataset.state = state; conn.textContent = text; conn.className = "pill " + cls; } };
    function connect() {
      const q = new URLSearchParams(params).toString();
      const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/dashboard/${q ? "?" + q : ""}`);
      window.__pearlSocket = ws;
      ws.onopen = () => { setState("live", "live", "pill-ok"); backoff = 500; };
      ws.onmessage = (ev) => {
        const msg = JSON.parse(ev.data);
        if (msg.type === "snapshot") { document.body.classList.remove("stale"); staleSince = null; }
        onMessage(msg); stamp(msg.ts);
      };
      ws.onclose = () => {
        if (!staleSince) { staleSince = new Date(); const s = $("stale-since"); if (s) s.textContent = staleSince.toLocaleTimeString(); }
        document.body.classList.add("stale");
        setState("reconnecting", "disconnected — reconnecting…", "pill-bad");
        setTimeout(connect, backoff); backoff = Math.min(backoff * 2, 5000);
      };
    }
    connect();
  }

  function stamp(ts) {
    const t = $("last-updated"); if (!t) return;
    const d = ts ? new Date(ts * 1000) : new Date();
    t.textContent = d.toLocaleTimeString(); t.dateTime = d.toISOString();
  }

  const fmt = {
    s: (x) => (x === null || x === undefined || !isFinite(x)) ? "–" : `${Number(x).toFixed(x < 10 ? 2 : 1)} s`,
    pct: (x) => (x === null || x === undefined) ? "–" : `${(100 * x).toFixed(1)}%`,
    time: (iso) => iso ? new Date(iso).toLocaleTimeString() : "–",
    config: (j) => j.mode === "disaggregated" ? `${j.n_prefill}P${j.n_decode}D` : `${j.n_colocated}C`,
  };

  // plotly's dark layout, shared by every chart
  const chartLayout = (title, extra) => Object.assign({
    title: { text: title, font: { size: 14 } }, paper_bgcolor: "#161c24", plot_bgcolor: "#161c24",
    font: { color: "#d8dee9", size: 11 }, margin: { l: 55, r: 55, t: 36, b: 40 }, height: 300,
    legend: { orientation: "h", y: -0.2 }, xaxis: { gridcolor: "#2a323d" }, yaxis: { gridcolor: "#2a323d" },
  }, extra || {});

  window.PEARL = { $, el, esc, api, confirmAction, toast, live, fmt, canOperate, chartLayout };
})();
