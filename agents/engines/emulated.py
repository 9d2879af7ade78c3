"""emulated backend: the worker protocol and roles with time taken from a hardware x model profile.

Dynamo-mocker style. Every prefill pass, decode iteration, KV transfer, sleep/wake and weight load
waits the time `controlplane.core.profiles.get_profile(hardware, model, tp)` predicts for it,
multiplied by `time_factor` (so 10.0 runs ten times slower than the emulated GPU, 0.1 ten times
faster). One asyncio loop per worker runs the running batch; a sequence costs a few microseconds
per iteration, so one worker holds hundreds of sequences. Tokens are synthetic and deterministic: a
hash of (seed, position), so colocated and disaggregated runs of a request give the same tokens.
Telemetry durations are in emulated-GPU seconds (wall time / time_factor), comparable to the profile.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from agents.dataplane import DecodeRequest, GenerateRequest, GenerationResult, PrefillResult, SamplingParams
from agents.engines.base import Conflict, EngineError, LoopEngine
from agents.tokenizer import TOKENIZER
from controlplane.core import telemetry as tm
from controlplane.core.profiles import Profile, get_profile

PREFILL_TOKEN_BUDGET = 16384
MASK64 = (1 << 64) - 1


def synthetic_token(seed: int, position: int) -> int:
    """A byte from a 64-bit mix of (seed, position): deterministic across processes."""
    x = (seed * 0x9E3779B97F4A7C15 + (position + 1) * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 31
    x = (x * 0x94D049BB133111EB) & MASK64
    x ^= x >> 29
    return x & 0xFF


def synthetic_logprob(token: int) -> float:
    return -0.1 * (1 + token % 7)


@dataclass
class ESeq:
    request_id: str
    kind: str
    prompt_len: int
    params: SamplingParams
    weight_version: int
    future: asyncio.Future
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""
    prompt: list[int] = field(default_factory=list)

    def emit(self) -> None:
        tok = synthetic_token(self.params.seed, len(self.tokens))
        self.tokens.append(tok)
        self.logprobs.append(synthetic_logprob(tok))


class EmulatedEngine(LoopEngine):
    kind = "emulated"

    def __init__(self, *, model: str = "qwen3-8b", hardware: str = "H800", tp: int = 2, time_factor: float = 1.0,
                 worker_id: int = 0, role: str = "colocated", job: str = "", profile: Profile | None = None) -> None:
        super().__init__(worker_id=worker_id, role=role, job=job)
        self.profile = profile or get_profile(hardware, model, tp)
        if time_factor <= 0:
            raise ValueError("time_factor must be > 0")
        self.time_factor = time_factor
        self.vocab_size = TOKENIZER.vocab_size
        self._pending: list[ESeq] = []
        self._running: list[ESeq] = []
        self._by_id: dict[str, ESeq] = {}
        self._asleep_level = 0
        self._deadline: float | None = None
        self._last_end = 0.0
        # (predicted, observed) wall seconds of the last iterations: the fidelity check of the benchmark
        self.timing_log: list[tuple[int, float, float]] = []


    async def _wait_s(self, seconds: float) -> None:
        await asyncio.sleep(seconds * self.time_factor)

    # ---- data plane
    def _submit(self, req_id: str, kind: str, prompt: list[int], params: SamplingParams, version: int | None = None) -> ESeq:
        if req_id in self._by_id:
            raise Conflict(f"request {req_id!r} is already in flight on this worker")
        seq = ESeq(req_id, kind, len(prompt), params, self.weight_version if version is None else version,
                   asyncio.get_running_loop().create_future(), prompt=prompt)
        self._by_id[req_id] = seq
        self._pending.append(seq)
        self._wake()
        return seq

    async def _wait(self, seq: ESeq) -> ESeq:
        try:
            return await asyncio.shield(seq.future)
        except asyncio.CancelledError:
            self._finish(seq, "abort")  # the caller went away: free the slot
            raise

    def _result(self, s: ESeq) -> GenerationResult:
        return GenerationResult(request_id=s.request_id, tokens=list(s.tokens), logprobs=list(s.logprobs),
                                finish_reason=s.finish_reason, prompt_len=s.prompt_len, weight_version=s.weight_version,
                                worker_id=self.worker_id, text=TOKENIZER.decode(s.tokens))

    async def generate(self, req: GenerateRequest, prompt: list[int]) -> GenerationResult:
        return self._result(await self._wait(self._submit(req.request_id, "generate", prompt, req.sampling)))

    async def prefill(self, req: GenerateRequest, prompt: list[int]) -> PrefillResult:
        s = await self._wait(self._submit(req.request_id, "prefill", prompt, req.sampling))
        if s.finish_reason == "abort":
            raise EngineError("prefill aborted", 409)
        blob = st_save({"prompt_len": np.array([s.prompt_len], dtype=np.int64)},
                       metadata={"first_token": str(s.tokens[0]), "seed": str(s.params.seed), "weight_version": str(s.weight_version)})
        modeled = int(s.prompt_len * self.profile.kv_bytes_per_token)
        handle, token = self.kv.put(blob, s.prompt_len)
        self.kv.bytes_out += modeled - len(blob)  # count the emulated cache size, not the stub's
        return PrefillResult(request_id=s.request_id, handle=handle, kv_token=token, prompt_len=s.prompt_len,
                             first_token=s.tokens[0], first_logprob=s.logprobs[0], kv_bytes=modeled,
                             weight_version=s.weight_version, worker_id=self.worker_id)

    async def decode(self, req: DecodeRequest, kv_bytes: bytes) -> GenerationResult:
        try:
            tensors = st_load(kv_bytes)
            header = json.loads(kv_bytes[8 : 8 + int.from_bytes(kv_bytes[:8], "little")])
            meta = header.get("__metadata__") or {}
            prompt_len = int(tensors["prompt_len"][0])
            first = int(meta["first_token"])
            version = int(meta.get("weight_version", self.weight_version))
        except Exception as exc:
            raise EngineError(f"KV cache is not a valid emulated cache: {exc}") from exc
        t0 = time.perf_counter()
        await self._wait_s(self.profile.kv_transfer_s(prompt_len))  # the modeled inter-pool transfer
        modeled = int(prompt_len * self.profile.kv_bytes_per_token)
        self.counters.kv_bytes_in += modeled
        self.telemetry.append(tm.kv_transfer(time_s=time.time(), job=self.job, worker=self.worker_id, kv_bytes=modeled,
                                             duration_s=(time.perf_counter() - t0) / self.time_factor))
        seq = self._submit(req.request_id, "decode", [], req.sampling, version=min(version, self.weight_version))
        seq.prompt_len = prompt_len
        seq.tokens.append(first)
        seq.logprobs.append(synthetic_logprob(first))
        return self._result(await self._wait(seq))

    async def abort(self, request_id: str) -> GenerationResult | None:
        s = self._by_id.get(request_id)
        if s is None:
            return None
        self._finish(s, "abort")
        return self._result(s)

    async def abort_all(self) -> list[GenerationResult]:
        seqs = list(self._by_id.values())
        for s in seqs:
            self._finish(s, "abort")
        return [self._result(s) for s in seqs]

    def _finish(self, s: ESeq, reason: str) -> None:
        if s.future.done():
            return
        s.finish_reason = reason
        if s in self._pending:
            self._pending.remove(s)
        if s in self._running:
            self._running.remove(s)
        self._by_id.pop(s.request_id, None)
        s.future.set_result(s)

    def inflight(self) -> list[dict[str, Any]]:
        return [{"request_id": s.request_id, "kind": s.kind, "prompt_len": s.prompt_len, "tokens": list(s.tokens),
                 "logprobs": list(s.logprobs), "weight_version": s.weight_version} for s in list(self._by_id.values())]

    def running(self) -> int:
        return len(self._running)

    def waiting(self) -> int:
        return len(self._pending)

    async def sleep(self, level: int) -> None:
        if self._by_id:
            raise Conflict("drain the worker before putting it to sleep")
        self.kv.clear()
        await self._wait_s(self.profile.reconfig.intra_scale_deactivation_s)
        self._asleep_level = max(level, 1)
        self.state = "sleeping"

    async def wake(self) -> None:
        if self.state == "sleeping":
            cost = self.profile.reconfig.intra_scale_activation_s
            if self._asleep_level >= 2:  # level 2 dropped the weights: reload them as well
                cost += self.profile.weight_bytes / self.profile.bandwidth
            await self._wait_s(cost)
        self._asleep_level = 0
        self.state = "running"

    async def load_weights(self, version: int, data: bytes) -> None:
        from agents.weights import safetensors_header

        try:
            safetensors_header(data)
        except Exception as exc:
            raise EngineError(f"weights are not valid safetensors: {exc}") from exc
        await self._wait_s(self.profile.weight_bytes / self.profile.bandwidth)
        self.weight_version = version

    # ---- the iteration loop
    def _kv_in_use(self) -> float:
        """KV bytes reserved by the running batch: each sequence up to its max_tokens (no preemption)."""
        return sum(s.prompt_len + s.params.max_tokens for s in self._running) * self.profile.kv_bytes_per_token

    async def _loop(self) -> None:
        assert self._work is not None
        loop = asyncio.get_running_loop()
        while not self._closed:
            if not self._pending and not self._running:
                self._deadline = None
                self._work.clear()
                await self._work.wait()
                continue
            # Drift-free clock: each iteration starts at the previous one's deadline, so the
            # event loop's sleep overshoot is paid back by the next iteration instead of piling up
            # (unless the worker fell far behind, e.g. a starved CPU: then restart the clock).
            now = loop.time()
            if self._deadline is None or now - self._deadline > 0.05:
                self._deadline = self._last_end = now
            t_start = self._deadline
            # admit: prefill new prompts within the token budget and the KV capacity (H_max)
            budget, admitted, rest = PREFILL_TOKEN_BUDGET, [], []
            kv_used = self._kv_in_use()
            for s in self._pending:
                need = (s.prompt_len + s.params.max_tokens) * self.profile.kv_bytes_per_token
                fits = s.kind == "prefill" or kv_used + need <= self.profile.hbm_kv_capacity or not self._running
                if fits and (budget > 0 or not admitted):
                    admitted.append(s)
                    budget -= s.prompt_len if s.kind != "decode" else 0
                    kv_used += need if s.kind != "prefill" else 0
                else:
                    rest.append(s)
            self._pending = rest
            prefill_tokens = sum(s.prompt_len for s in admitted if s.kind != "decode")
            t_prefill = self.profile.prefill_s(prefill_tokens) if prefill_tokens else 0.0
            batch = len(self._running)
            mean_ctx = (sum(s.prompt_len + len(s.tokens) for s in self._running) / batch) if batch else 0.0
            t_decode = float(self.profile.decode_iteration_s(batch, mean_ctx)) if batch else 0.0
            predicted = (t_prefill + t_decode) * self.time_factor
            self._deadline = t_start + predicted
            await asyncio.sleep(max(0.0, self._deadline - loop.time()))
            end = loop.time()
            observed, self._last_end = end - self._last_end, end  # iteration end to iteration end
            # decode: every running sequence gets one token
            finished: list[ESeq] = []
            for s in self._running:
                s.emit()
                if len(s.tokens) >= s.params.max_tokens:
                    finished.append(s)
            if batch:
                c = self.counters
                c.decode_iterations += 1
                c.generated_tokens += batch
                c.iteration_s.append(observed)
                c.token_times.append((time.monotonic(), batch))
                share = t_decode / (t_prefill + t_decode)
                self.record_decode_iteration(batch, observed * share / self.time_factor)
                self.timing_log.append((batch, predicted, observed))
                if len(self.timing_log) > 4096:
                    del self.timing_log[:2048]
            if prefill_tokens:
                self.counters.prefill_tokens += prefill_tokens
                self.counters.prefill_s_total += t_prefill
                self.telemetry.append(tm.prefill(time_s=time.time(), job=self.job, worker=self.worker_id,
                                                 tokens=prefill_tokens, duration_s=t_prefill))
            for s in finished:
                self._finish(s, "length")
            for s in admitted:
                if s.future.done():  # aborted while its prefill ran
                    continue
                if s.kind != "decode":
                    s.emit()  # prefill produces the first token
                    self.counters.generated_tokens += 1
                if s.kind == "prefill" or len(s.tokens) >= s.params.max_tokens:
                    self._finish(s, "length")
                else:
                    self._running.append(s)
