"""The torch engine's scheduler (after vLLM v1's): which sequences run in the next iteration. Requests wait
in arrival order; an iteration admits them while the running batch has room (`max_running`) and the new
prompt tokens stay within `PREFILL_TOKEN_BUDGET` (so that decode keeps moving), and takes the aborts that
arrived. The event loop adds and aborts, the engine thread schedules: one lock between them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from agents.dataplane import SamplingParams
from agents.tokenizer import TOKENIZER

MAX_RUNNING = 256  # sequences in one decode iteration
PREFILL_TOKEN_BUDGET = 4096  # new prompt tokens admitted per iteration (keeps decode moving)


@dataclass
class Seq:
    """One request as the scheduler and the runner see it (vLLM's `Request`)."""

    request_id: str
    kind: str  # generate | prefill | decode
    prompt: list[int]
    params: SamplingParams
    weight_version: int
    future: asyncio.Future
    out_tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    kv_in: bytes | None = None  # decode: the imported cache
    finish_reason: str = ""
    kv_out: bytes = b""  # prefill: the exported cache
    length: int = 0  # tokens in this row's cache (excluding the last sampled token)


@dataclass
class SchedulerOutput:
    """One iteration's schedule."""

    admitted: list[Seq]  # to prefill (generate, prefill) or to import (decode), in arrival order
    aborted: list[Seq]  # waiting sequences aborted before they ran (finish_reason set)
    aborts: set[str]  # every request id aborted since the last iteration: running rows among them leave


class TorchScheduler:
    def __init__(self, max_running: int = MAX_RUNNING) -> None:
        self.max_running = max_running
        self.waiting: list[Seq] = []
        self.aborts: set[str] = set()
        self.lock = threading.Lock()

    def add(self, seq: Seq) -> None:
        with self.lock:
            self.waiting.append(seq)

    def abort(self, request_ids: Iterable[str]) -> None:
        with self.lock:
            self.aborts.update(request_ids)

    def clear(self) -> None:
        with self.lock:
            self.waiting.clear()

    def schedule(self, running: int) -> SchedulerOutput:
        """Admit waiting sequences next to `running` rows; at least one if the batch has room, even past
        the prefill budget (a long prompt is not starved)."""
        with self.lock:
            aborts, self.aborts = self.aborts, set()
            aborted: list[Seq] = []
            admitted: list[Seq] = []
            budget, rest = PREFILL_TOKEN_BUDGET, []
            for s in self.waiting:
                if s.request_id in aborts:
                    s.finish_reason = "abort"
                    aborted.append(s)
                elif running + len(admitted) < self.max_running and (budget > 0 or not admitted):
                    admitted.append(s)
                    budget -= len(s.prompt)
                else:
                    rest.append(s)
            self.waiting = rest
        return SchedulerOutput(admitted, aborted, aborts)


def finished(s: Seq, eos_id: int = TOKENIZER.eos_id) -> bool:
    """Whether `s` is done (the model's EOS when it stops at EOS, or max_tokens); sets its finish reason."""
    if s.params.stop_at_eos and s.out_tokens and s.out_tokens[-1] == eos_id:
        s.finish_reason = "stop"
        return True
    if len(s.out_tokens) >= s.params.max_tokens:
        s.finish_reason = "length"
        return True
    return False
