"""Token-in, token-out accounting of one trajectory behind the gateway (pure: no I/O, no templates).

Why: an agent speaks in messages, the trainer needs the exact ids the policy sampled. Re-tokenizing the
decoded text does not give them back (BPE merges, stripped tool tags, templates that drop earlier
thinking), so the gateway keeps each trajectory's token context itself: a request whose messages extend
the ones already held appends only the new messages' template tokens after the sampled ids; a request
that rewrites history (compaction, an edited message) starts a *fork*, a new sample of the same
trajectory, and the fork is counted.

Every token of a sample carries its loss mask (1 = sampled by the policy, 0 = template, tool output,
observation), its log-prob (0.0 where masked) and the segment it came in: the weight version that
produced it, every worker that served the turn (in order: a turn resumed elsewhere lists each), its latency.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

PROMPT, SAMPLED = 0, 1  # loss-mask values


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of tokens that came in one piece: the template of new messages, or one sampled turn."""

    start: int
    end: int
    sampled: bool
    weight_version: int = -1  # sampled segments: the oldest weights that produced any of its tokens
    workers: tuple[int, ...] = ()  # sampled segments: the workers that served the turn, in order
    latency_s: float = 0.0


@dataclass(slots=True)
class Sample:
    """One token sequence of a trajectory: the first prompt, then alternating sampled / template segments."""

    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)

    @property
    def prompt_len(self) -> int:
        """Tokens before the first sampled one (the trainer's prompt)."""
        for s in self.segments:
            if s.sampled:
                return s.start
        return len(self.tokens)

    @property
    def turns(self) -> int:
        return sum(1 for s in self.segments if s.sampled)

    def append(
        self,
        ids: Iterable[int],
        *,
        sampled: bool,
        logprobs: Iterable[float] | None = None,
        weight_version: int = -1,
        workers: Iterable[int] = (),
        latency_s: float = 0.0,
    ) -> Segment:
        ids = list(ids)
        lps = [0.0] * len(ids) if logprobs is None else [float(x) for x in logprobs]
        if len(lps) != len(ids):
            raise ValueError(f"{len(ids)} tokens but {len(lps)} log-probs")
        if not sampled and any(x != 0.0 for x in lps):
            raise ValueError("template tokens carry no log-probs")
        seg = Segment(len(self.tokens), len(self.tokens) + len(ids), sampled, weight_version, tuple(workers), latency_s)
        self.tokens += ids
        self.mask += [SAMPLED if sampled else PROMPT] * len(ids)
        self.logprobs += lps
        self.segments.append(seg)
        return seg

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_len": self.prompt_len,
            "tokens": list(self.tokens),
            "mask": list(self.mask),
            "logprobs": list(self.logprobs),
            "weight_versions": [s.weight_version for s in self.segments if s.sampled],
            "workers": [list(s.workers) for s in self.segments if s.sampled],  # per turn: each worker that served it
            "latency_s": [round(s.latency_s, 6) for s in self.segments if s.sampled],
        }


def canonical(message: dict[str, Any]) -> str:
    """A message as compared across requests: role, text content, tool calls by name and parsed arguments,
    the tool result's call id. Call ids the agent echoes back and key order do not matter; `None` and ""
    content are the same."""
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts: the text parts, in order
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    calls = []
    for c in message.get("tool_calls") or []:
        fn = c.get("function") or {}
        args = fn.get("arguments")
        if isinstance(args, str):
            with contextlib.suppress(ValueError):
                args = json.loads(args)
        calls.append([fn.get("name"), args])
    out: dict[str, Any] = {"role": message.get("role"), "content": content or ""}
    if calls:
        out["tool_calls"] = calls
    if message.get("role") == "tool":
        out["tool_call_id"] = message.get("tool_call_id") or ""
    if message.get("name"):
        out["name"] = message["name"]
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


@dataclass(slots=True)
class Plan:
    """What the next turn appends: `extend` = the template tokens of the new messages after the held
    context; otherwise `fork` = a new sample starting from a whole new prompt."""

    fork: bool
    new_messages: list[dict[str, Any]]  # extend: the messages after the held ones; fork: all of them


class TrajectoryTokens:
    """The token record of one trajectory: its samples (the first, then one per fork), the messages the
    current sample holds tokens for, and the reward."""

    def __init__(self) -> None:
        self.samples: list[Sample] = []
        self.held: list[str] = []  # canonical messages whose tokens the current sample holds (incl. answers)
        self.context_key = ""  # tools / template options: a change forks too
        self.forks = 0
        self.reward: float | None = None

    @property
    def current(self) -> Sample:
        return self.samples[-1]

    def plan(self, messages: list[dict[str, Any]], context_key: str = "") -> Plan:
        """Extend when the held messages (our own answers included, as we returned them) are a strict
        prefix of `messages` and the tools are unchanged; else fork (the first request 'forks' from nothing,
        which is not counted)."""
        seen = [canonical(m) for m in messages]
        n = len(self.held)
        if self.samples and context_key == self.context_key and 0 < n < len(seen) and seen[:n] == self.held:
            return Plan(False, list(messages[n:]))
        return Plan(True, list(messages))

    def begin(self, plan: Plan, ids: list[int], messages: list[dict[str, Any]], context_key: str = "") -> list[int]:
        """Apply `plan` with the new messages' template tokens `ids`; returns the whole prompt of the turn."""
        if plan.fork:
            if self.samples:
                self.forks += 1
            self.samples.append(Sample())
            self.context_key = context_key
        if ids:
            self.current.append(ids, sampled=False)
        self.held = [canonical(m) for m in messages]
        return list(self.current.tokens)

    def sampled(
        self,
        ids: list[int],
        logprobs: list[float],
        answer: dict[str, Any],
        *,
        weight_version: int,
        workers: Iterable[int] = (),
        latency_s: float = 0.0,
        closing: list[int] | None = None,
    ) -> Segment:
        """Record a turn the policy sampled (`answer` = the assistant message returned for it). `closing`:
        template tokens that end the turn in the context (an end-of-turn marker the engine did not emit,
        the template's newline after it), masked out."""
        if not self.samples:
            raise ValueError("a turn was sampled before any prompt")
        seg = self.current.append(
            ids, sampled=True, logprobs=logprobs, weight_version=weight_version, workers=workers, latency_s=latency_s
        )
        if closing:
            self.current.append(closing, sampled=False)
        self.held.append(canonical(answer))
        return seg

    def to_json(self) -> dict[str, Any]:
        return {
            "samples": [s.to_json() for s in self.samples],
            "forks": self.forks,
            "reward": self.reward,
            "turns": sum(s.turns for s in self.samples),
        }
