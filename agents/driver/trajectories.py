"""What the driver reports of its trajectories: each ended trajectory's record (an agent's, bring your own agent,
issue 19: `agents.envs.agent.AgentRunner.records`; a built-in environment's: `episode_record`) cut to the bounds of
`core.driver_link.TrajectorySummary`, in reports that fit one link frame. The trainer gets the full
samples elsewhere; this is what the job page's trajectory browser and `pearl trajectories` show.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from controlplane.core import driver_link as dl

_STEP = re.compile(r"^s(\d+)-")
MESSAGES_BYTES = 256 << 10  # a trajectory's messages as JSON at most (the link frame is 1 MiB)
MAX_WORKERS_PER_TURN = 16  # a turn resumed more often than this lists its first workers


def step_of(name: str, default: int = 0) -> int:
    """The step a loop trajectory id (`s<step>-t<index>[-r<n>]`) belongs to."""
    m = _STEP.match(name)
    return int(m.group(1)) if m else default


def _text(value: Any, limit: int = dl.MAX_MESSAGE_CHARS) -> str:
    s = value if isinstance(value, str) else ("" if value is None else str(value))
    s = s.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")  # storable: no NUL, no surrogate
    return s if len(s) <= limit else s[: limit - 20] + f"… [{len(s) - limit + 20} more]"


def _message(m: Any) -> dict[str, Any]:
    """A chat message with its text cut to the bound (a big tool call is shown as its cut JSON)."""
    if not isinstance(m, Mapping):
        return {"role": "unknown", "content": _text(m)}
    out: dict[str, Any] = {"role": _text(m.get("role", ""), 32), "content": _text(m.get("content"))}
    if m.get("tool_calls"):
        out["tool_calls"] = _text(json.dumps(m["tool_calls"], default=str))
    if m.get("tool_call_id"):
        out["tool_call_id"] = _text(m["tool_call_id"], 128)
    return out


def _messages(ms: Any) -> list[dict[str, Any]]:
    ms = list(ms) if isinstance(ms, list) else []
    n = dl.MAX_TRAJECTORY_MESSAGES
    if len(ms) > n:  # the task (first) and the latest turns
        ms = ms[:1] + ms[-(n - 1) :]
    out = [_message(m) for m in ms]
    while len(out) > 1 and len(json.dumps(out)) > MESSAGES_BYTES:
        del out[1]  # the oldest turns go first; the task stays
    return out


def _finite(x: Any, lo: float, hi: float) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return min(hi, max(lo, v)) if math.isfinite(v) else 0.0


def _served(turn: Any) -> list[int]:
    """A turn's workers, in order (an older record's single worker id as a list of one), cut to a bound."""
    ids = turn if isinstance(turn, list) else [turn]
    return [max(-1, int(w)) for w in ids[:MAX_WORKERS_PER_TURN]]


def episode_record(samples: list[dict[str, Any]], reward: float, *, tokens: bool = True) -> dict[str, Any]:
    """A built-in environment's finished trajectory (the driver's per-turn samples: each turn's context, its
    response, log-probs, weights and workers) as a record in the agent runner's shape: one token sequence, the
    responses masked in with their log-probs, the context each turn added masked out. Without `tokens` (an
    emulated model's synthetic ones, which mean nothing), only the turns' weights and workers."""
    seq: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for s in samples if tokens else []:
        added = s["prompt_tokens"][len(seq) :]  # a built-in environment's context only grows
        seq += added + s["completion_tokens"]
        mask += [0] * len(added) + [1] * len(s["completion_tokens"])
        logprobs += [0.0] * len(added) + list(s["logprobs"])
    sample = {
        "tokens": seq,
        "mask": mask,
        "logprobs": logprobs,
        "weight_versions": [s["weight_version"] for s in samples],
        "workers": [list(s.get("workers") or []) for s in samples],
    }
    return {"samples": [sample], "reward": reward, "turns": len(samples), "status": "done"}


def summarize(name: str, record: Mapping[str, Any]) -> dl.TrajectorySummary:
    """One trajectory's record within the link's bounds; `truncated` says the tokens were cut."""
    tokens: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    lens: list[int] = []
    versions: list[int] = []
    workers: list[list[int]] = []
    latency: list[float] = []
    for s in record.get("samples") or []:
        toks = [int(t) for t in s.get("tokens") or []]
        n = len(toks)
        lens.append(n)
        tokens += toks
        mask += [1 if m else 0 for m in (list(s.get("mask") or []) + [0] * n)[:n]]
        logprobs += [round(_finite(x, -1e9, 1e9), 4) for x in (list(s.get("logprobs") or []) + [0.0] * n)[:n]]
        versions += [max(0, int(v)) for v in s.get("weight_versions") or []]
        workers += [_served(w) for w in s.get("workers") or []]
        latency += [round(_finite(x, 0.0, 1e7), 6) for x in s.get("latency_s") or []]
    limit, turns = dl.MAX_TRAJECTORY_TOKENS, dl.MAX_TRAJECTORY_TURNS
    reward = record.get("reward")
    status = str(record.get("status", "done"))
    return dl.TrajectorySummary(
        name=name[:128],
        status=status if status in dl.TRAJECTORY_STATUSES else "done",
        reward=float(reward) if isinstance(reward, (int, float)) and math.isfinite(reward) else None,
        turns=max(0, int(record.get("turns") or len(versions))),
        forks=max(0, int(record.get("forks") or 0)),
        reason=_text(record.get("reason") or ""),
        stderr=_text((record.get("stderr") or "")[-dl.MAX_MESSAGE_CHARS :]),
        messages=_messages(record.get("messages")),
        tokens=tokens[:limit],
        mask=mask[:limit],
        logprobs=logprobs[:limit],
        sample_lens=lens[:turns],
        token_count=len(tokens),
        truncated=len(tokens) > limit,
        weight_versions=versions[:turns],
        workers=workers[:turns],
        latency_s=latency[:turns],
        trained=record["trained"] if isinstance(record.get("trained"), bool) else None,
        rerun=bool(record.get("rerun")),
        resumed=bool(record.get("resumed")),
    )


def reports(summaries: Iterable[tuple[int, dl.TrajectorySummary]]) -> list[dl.TrajectoryReport]:
    """(step, summary) pairs as reports, one step each, each frame under MAX_REPORT_BYTES."""
    by_step: dict[int, list[dl.TrajectorySummary]] = {}
    for step, summary in summaries:
        by_step.setdefault(step, []).append(summary)
    out: list[dl.TrajectoryReport] = []
    for step, items in sorted(by_step.items()):
        chunk: list[dl.TrajectorySummary] = []
        size = 0
        for item in items:
            n = len(json.dumps(dl.DRIVER_LINK.dump(dl.TrajectoryReport(step, [item]))))
            if chunk and (size + n > dl.MAX_REPORT_BYTES or len(chunk) >= dl.MAX_TRAJECTORIES):
                out.append(dl.TrajectoryReport(step, chunk))
                chunk, size = [], 0
            chunk.append(item)
            size += n
        if chunk:
            out.append(dl.TrajectoryReport(step, chunk))
    return out
