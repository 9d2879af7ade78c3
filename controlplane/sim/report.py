"""HTML report of one scenario comparison: plotly figures with plotly.js inlined (no CDN)."""

from __future__ import annotations

import html
import itertools
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from controlplane.core.policies import REGISTRY, names
from controlplane.sim.cluster import RunResult
from controlplane.sim.scenario import Scenario


def policy_color(policy: str) -> str | None:
    """A policy's report colour (its `color` trait); None for a variant or a policy without one."""
    cls = REGISTRY.get(policy)
    return cls.color if cls is not None else None


def per_step_throughput(r: RunResult) -> list[tuple[int, float]]:
    """(step, tokens/s of step time) for every trained step after the first."""
    trained = [s for s in r.step_stats if s.train_end_s > 0]
    out = []
    for prev, cur in itertools.pairwise(trained):
        dt = cur.train_end_s - prev.train_end_s
        if dt > 0:
            out.append((cur.step, (cur.generated_tokens + cur.train_tokens) / dt))
    return out


def figures(sc: Scenario, results: dict[str, RunResult]) -> list[tuple[str, go.Figure]]:
    figs: list[tuple[str, go.Figure]] = []
    f = go.Figure()
    for p, r in results.items():
        pts = per_step_throughput(r)
        f.add_trace(
            go.Scatter(
                x=[a for a, _ in pts],
                y=[b for _, b in pts],
                mode="lines+markers",
                name=p,
                line={"color": policy_color(p)},
            )
        )
    f.update_layout(
        title="Throughput per step (rollout-generated + training tokens / step time)",
        xaxis_title="training step",
        yaxis_title="tokens/s",
        height=380,
    )
    figs.append(("throughput", f))
    focus = names.PEARL if names.PEARL in results else next(iter(results))
    r = results[focus]
    if r.timeline:
        t = [row["t"] for row in r.timeline]
        g = go.Figure()
        for key, color in (
            ("prefill", "#ff7f0e"),
            ("decode", "#1f77b4"),
            ("colocated", "#2ca02c"),
            ("transitioning", "#bbbbbb"),
        ):
            g.add_trace(
                go.Scatter(
                    x=t,
                    y=[row[key] for row in r.timeline],
                    name=f"{key} workers",
                    mode="lines",
                    line={"shape": "hv", "width": 0, "color": color},
                    stackgroup="w",
                )
            )
        g.add_trace(
            go.Scatter(
                x=t,
                y=[row["available_gpus"] / sc.cluster.tp for row in r.timeline],
                name="dedicated workers available (trace)",
                mode="lines",
                line={"shape": "hv", "dash": "dot", "color": "black"},
            )
        )
        g.add_trace(
            go.Scatter(
                x=t,
                y=[row["borrowed"] for row in r.timeline],
                name="of which borrowed (overlap)",
                mode="lines",
                line={"shape": "hv", "color": "#d62728"},
            )
        )
        g.update_layout(
            title=f"GPU–role timeline ({focus}): serving workers by role (TP{sc.cluster.tp})",
            xaxis_title="virtual time (s)",
            yaxis_title="workers",
            height=420,
        )
        figs.append(("timeline", g))
    b = go.Figure()
    for p, rr in results.items():
        if not rr.borrow_windows:
            continue
        b.add_trace(
            go.Bar(
                base=[w[0] for w in rr.borrow_windows],
                x=[w[1] - w[0] for w in rr.borrow_windows],
                y=[f"{p} slot {w[2]}" for w in rr.borrow_windows],
                orientation="h",
                name=p,
                marker={"color": policy_color(p)},
            )
        )
    b.update_layout(
        title="Borrowed training-GPU windows (activation .. return)",
        xaxis_title="virtual time (s)",
        height=max(300, 22 * sum(len({w[2] for w in rr.borrow_windows}) for rr in results.values())),
        barmode="overlay",
    )
    figs.append(("borrow", b))
    s = go.Figure()
    hi = 0.0
    for p, rr in results.items():
        makespans = [(st.predicted_makespan_s, st.makespan_s) for st in rr.step_stats if st.predicted_makespan_s]
        if not makespans:
            continue
        hi = max(hi, max(max(a, c) for a, c in makespans))
        s.add_trace(
            go.Scatter(
                x=[c for _, c in makespans],
                y=[a for a, _ in makespans],
                mode="markers",
                name=p,
                marker={"color": policy_color(p)},
            )
        )
    s.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", name="y = x", line={"dash": "dash", "color": "black"}))
    s.update_layout(
        title="Predicted (core predictor) vs simulated rollout makespan per step",
        xaxis_title="simulated makespan (s)",
        yaxis_title="predicted makespan (s)",
        height=420,
    )
    figs.append(("predicted", s))
    return figs


def summary_table(results: dict[str, RunResult]) -> str:
    cols = [
        "policy",
        "throughput_tok_s",
        "steps",
        "rollout_s_mean",
        "train_s_mean",
        "transitions",
        "borrowed_gpu_s",
        "return_deadline_misses",
        "lost_tokens",
        "predictor_mape",
    ]
    rows = ["<tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"]
    for p, r in results.items():
        d: dict[str, Any] = {"policy": p, **r.summary()}
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(d[c]))}</td>" for c in cols) + "</tr>")
    return "<table>" + "".join(rows) + "</table>"


def render_html(title: str, sections: list[tuple[str, str, list[tuple[str, go.Figure]]]]) -> str:
    """sections: (heading, html body, figures). plotly.js is inlined once, in the first figure."""
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:24px;max-width:1200px}"
        "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right;font-size:13px}th{background:#f4f4f4}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    first = True
    for heading, body, figs in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>{body}")
        for _, fig in figs:
            parts.append(pio.to_html(fig, include_plotlyjs=bool(first), full_html=False))
            first = False
    parts.append("</body></html>")
    return "\n".join(parts)


def write_scenario_html(sc: Scenario, results: dict[str, RunResult], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    body = f"<p>{html.escape(sc.description)} — seed {sc.seed}</p>" + summary_table(results)
    p.write_text(render_html(f"PEARL simulator: {sc.name}", [(sc.name, body, figures(sc, results))]))
    return p
