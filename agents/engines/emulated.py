"""emulated backend: the worker protocol and roles with time taken from a hardware x model profile.

Dynamo-mocker style. Every prefill pass, decode iteration, KV transfer, sleep/wake and weight load
takes the time `controlplane.core.profiles.get_profile(hardware, model, tp)` predicts for it,
multiplied by `time_factor` (so 10.0 runs ten times slower than the emulated GPU, 0.1 ten times
faster). The continuous batching is the simulator's (`controlplane.core.batching.IterationScheduler`: chunked
prefill riding on the running decodes, KV admission against H_max, segments of iterations over
which the batch does not change), run on the wall clock: the loop sleeps once per segment, not once
per iteration, so the engine keeps the profile's pace at small time factors on a busy CPU, and an
arrival or an abort cuts the segment at the next iteration boundary. Prompts hit an automatic prefix
cache (vLLM's: chained hashes of full blocks, LRU over the KV the running batch leaves free), so a
multi-turn trajectory prefills only its new tokens on its sticky worker. Tokens are synthetic and
deterministic: a hash of (seed, position), so colocated and disaggregated runs of a request give the
same tokens. Telemetry durations are in emulated-GPU seconds (wall time / time_factor).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from agents.dataplane import DecodeRequest, GenerateRequest, GenerationResult, PrefillResult, SamplingParams
from agents.engines.base import EngineConflict, EngineError, LoopEngine
from agents.tokenizer import TOKENIZER
from controlplane.core import telemetry as tm
from controlplane.core.batching import CHUNK_TOKENS, IterationScheduler, Request, ScaledCosts, prefill_records
from controlplane.core.profiles import Profile, get_profile
from controlplane.core.state import Role

INTERFERENCE_MAX = 10.0  # bound of `EmulatedEngine(interference=...)`


def check_interference(value: float) -> None:
    """The one check of an emulated engine's interference factor (the engine's and the node CLI's)."""
    if not 0 < value <= INTERFERENCE_MAX:
        raise ValueError(f"interference must be in (0, {INTERFERENCE_MAX:g}]")


PREFIX_BLOCK = 16  # tokens per prefix-cache block (vLLM's default block size)
LATE_S = 0.05  # wall seconds behind schedule after which the segment clock restarts at "now"
# the engine's role -> the batching role: a decode worker finishes the prompts queued before it switched
BATCHING_ROLE = {"colocated": Role.COLOCATED, "decode": Role.COLOCATED, "prefill": Role.PREFILL}
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

    def emit(self, upto: int | None = None) -> None:
        """Append the next token (or every token up to a total of `upto`)."""
        for _ in range(1 if upto is None else max(0, upto - len(self.tokens))):
            tok = synthetic_token(self.params.seed, len(self.tokens))
            self.tokens.append(tok)
            self.logprobs.append(synthetic_logprob(tok))


class PrefixCache:
    """Automatic prefix caching as vLLM does it: a prompt's full blocks are keyed by a hash chained over
    every token before them, so a block matches only under the same prefix; blocks the running batch
    does not pin are evicted least recently used first."""

    def __init__(self, block: int = PREFIX_BLOCK) -> None:
        self.block = block
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def _hashes(self, prompt: list[int]) -> list[int]:
        out, h = [], 0
        for i in range(0, len(prompt) - self.block + 1, self.block):
            h = hash((h, tuple(prompt[i : i + self.block])))
            out.append(h)
        return out

    def match(self, prompt: list[int]) -> int:
        """Tokens of `prompt` already cached (whole blocks, at most all but the last token)."""
        n = 0
        for h in self._hashes(prompt[:-1]):
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            n += self.block
        return n

    def insert(self, prompt: list[int], free_tokens: float) -> None:
        for h in self._hashes(prompt):
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        self.fit(free_tokens)

    def fit(self, free_tokens: float) -> None:
        while self._blocks and len(self._blocks) * self.block > free_tokens:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()


class EmulatedEngine(LoopEngine):
    kind = "emulated"

    def __init__(
        self,
        *,
        model: str = "qwen3-8b",
        hardware: str = "H800",
        tp: int = 2,
        time_factor: float = 1.0,
        worker_id: int = 0,
        role: str = "colocated",
        job: str = "",
        profile: Profile | None = None,
        interference: float = 1.0,
    ) -> None:
        """`interference`: a prefill next to running decodes costs this × its roofline time (1: the additive
        roofline, the simulator's calibrated engine), to emulate an engine with more PD interference."""
        super().__init__(worker_id=worker_id, role=role, job=job)
        self.profile = profile or get_profile(hardware, model, tp)
        self.hardware = self.profile.hardware  # its records name the chip whose pace it emulates
        if time_factor <= 0:
            raise ValueError("time_factor must be > 0")
        check_interference(interference)
        self.time_factor = time_factor
        self.vocab_size = TOKENIZER.vocab_size
        self.batching = IterationScheduler(
            worker_id,
            "",
            BATCHING_ROLE[role],
            ScaledCosts(self.profile),
            chunk_tokens=CHUNK_TOKENS,
            kv_capacity=int(self.profile.hbm_kv_capacity // self.profile.kv_bytes_per_token),
            mixed_penalty=interference,
        )
        self.prefix_cache = PrefixCache()
        self._by_id: dict[str, ESeq] = {}
        self._reqs: dict[str, Request] = {}
        self._asleep_level = 0
        self._origin = 0.0  # wall time (event-loop clock) of model time 0
        self._next_t: float | None = None  # model time the next segment starts (the last one's end)
        # (running batch, iterations, predicted, observed wall seconds) of the last segments: the benchmark's
        # fidelity check
        self.timing_log: list[tuple[int, int, float, float]] = []

    async def start(self) -> None:
        self._origin = asyncio.get_running_loop().time()
        await super().start()

    def _now(self) -> float:
        """Model seconds since the engine started."""
        return (asyncio.get_running_loop().time() - self._origin) / self.time_factor

    async def _wait_s(self, seconds: float) -> None:
        await asyncio.sleep(seconds * self.time_factor)

    # ---- data plane
    def _submit(
        self,
        req_id: str,
        kind: str,
        prompt: list[int],
        params: SamplingParams,
        version: int | None = None,
        prompt_len: int | None = None,
    ) -> ESeq:
        if req_id in self._by_id:
            raise EngineConflict(f"request {req_id!r} is already in flight on this worker")
        n = len(prompt) if prompt_len is None else prompt_len
        seq = ESeq(
            req_id,
            kind,
            n,
            params,
            self.weight_version if version is None else version,
            asyncio.get_running_loop().create_future(),
            prompt=prompt,
        )
        self._by_id[req_id] = seq
        w, t = self.batching, self._now()
        if kind == "decode":  # the first token came with the KV cache
            r = Request(seq, 0, 0, n + 1, max(0, params.max_tokens - 1), arrive_s=t)
            w.submit_decode(r)
        else:
            self.prefix_cache.fit(w.kv_capacity - w.kv_used)
            cached = self.prefix_cache.match(prompt)
            r = Request(
                seq,
                len(prompt) - cached,
                cached,
                len(prompt),
                0 if kind == "prefill" else max(0, params.max_tokens - 1),
                arrive_s=t,
            )
            w.submit_prompt(r)
        self._reqs[req_id] = r
        w.interrupt(t)  # admitted at the next iteration boundary
        self._wake()
        return seq

    async def _wait(self, seq: ESeq) -> ESeq:
        try:
            return await asyncio.shield(seq.future)
        except asyncio.CancelledError:
            self._finish(seq, "abort")  # the caller went away: free the slot
            raise

    def _result(self, s: ESeq) -> GenerationResult:
        return GenerationResult(
            request_id=s.request_id,
            tokens=list(s.tokens),
            logprobs=list(s.logprobs),
            finish_reason=s.finish_reason,
            prompt_len=s.prompt_len,
            weight_version=s.weight_version,
            worker_id=self.worker_id,
            text=TOKENIZER.decode(s.tokens),
        )

    async def generate(self, req: GenerateRequest, prompt: list[int]) -> GenerationResult:
        return self._result(await self._wait(self._submit(req.request_id, "generate", prompt, req.sampling)))

    async def prefill(self, req: GenerateRequest, prompt: list[int]) -> PrefillResult:
        s = await self._wait(self._submit(req.request_id, "prefill", prompt, req.sampling))
        if s.finish_reason == "abort":
            raise EngineError("prefill aborted", 409)
        meta = {"first_token": str(s.tokens[0]), "seed": str(s.params.seed), "weight_version": str(s.weight_version)}
        blob = st_save({"prompt_len": np.array([s.prompt_len], dtype=np.int64)}, metadata=meta)
        modeled = int(s.prompt_len * self.profile.kv_bytes_per_token)
        handle, token = self.kv.put(blob, s.prompt_len)
        self.kv.bytes_out += modeled - len(blob)  # count the emulated cache size, not the stub's
        return PrefillResult(
            request_id=s.request_id,
            handle=handle,
            kv_token=token,
            prompt_len=s.prompt_len,
            first_token=s.tokens[0],
            first_logprob=s.logprobs[0],
            kv_bytes=modeled,
            weight_version=s.weight_version,
            worker_id=self.worker_id,
        )

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
        self.telemetry.append(
            tm.kv_transfer(
                time_s=time.time(),
                job=self.job,
                worker=self.worker_id,
                kv_bytes=modeled,
                duration_s=(time.perf_counter() - t0) / self.time_factor,
            )
        )
        seq = self._submit(
            req.request_id, "decode", [], req.sampling, version=min(version, self.weight_version), prompt_len=prompt_len
        )
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
        r = self._reqs.pop(s.request_id, None)
        if r is not None and reason == "abort":
            g = self.batching.remove(r, self._now())  # cuts the segment: the batch changed
            if g:
                s.emit(upto=1 + g)
            if self._work is not None:
                self._wake()
        s.finish_reason = reason
        self._by_id.pop(s.request_id, None)
        s.future.set_result(s)

    def inflight(self) -> list[dict[str, Any]]:
        t = self._now()
        out = []
        for s in list(self._by_id.values()):
            r = self._reqs.get(s.request_id)
            g = self.batching.generated(r, t) if r is not None else 0
            if g:
                s.emit(upto=1 + g)
            out.append(
                {
                    "request_id": s.request_id,
                    "kind": s.kind,
                    "prompt_len": s.prompt_len,
                    "tokens": list(s.tokens),
                    "logprobs": list(s.logprobs),
                    "weight_version": s.weight_version,
                }
            )
        return out

    def running(self) -> int:
        return len(self.batching.running)

    def waiting(self) -> int:
        w = self.batching
        return len(w.pq) + len(w.joinq) + (len(w.seg.batch) if w.seg is not None else 0)

    async def sleep(self, level: int) -> None:
        if self._by_id:
            raise EngineConflict("drain the worker before putting it to sleep")
        self.kv.clear()
        self.prefix_cache.clear()
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
        self.prefix_cache.clear()  # KV computed under the old weights is not reused (vLLM resets it too)
        self.weight_version = version

    # ---- the batching loop
    async def _loop(self) -> None:
        assert self._work is not None
        loop = asyncio.get_running_loop()
        w = self.batching
        while not self._closed:
            w.role = BATCHING_ROLE.get(self.role, Role.COLOCATED)
            if w.seg is None:
                now = self._now()
                # drift-free: a segment starts where the previous one ended, unless the loop fell far behind
                nxt = self._next_t
                t = nxt if nxt is not None and now - nxt <= LATE_S / self.time_factor else now
                if w.plan(t) is None:
                    self._next_t = None
                    self._work.clear()
                    await self._work.wait()
                    continue
            seg = w.seg
            assert seg is not None
            self._work.clear()
            delay = seg.end_s * self.time_factor + self._origin - loop.time()
            if delay > 0:
                try:
                    await asyncio.wait_for(self._work.wait(), delay)
                    continue  # new work or an abort: the segment may have been cut, sleep to its new end
                except TimeoutError:
                    pass
            if w.seg is not seg or self._closed:
                continue
            self._end_segment(loop.time())

    def _end_segment(self, wall_end: float) -> None:
        """Apply the finished segment: first tokens of the prefilled prompts, finished turns, telemetry."""
        w = self.batching
        n = len(w.running)
        tokens_before = w.tokens_out
        prefilled, done, seg = w.finish()
        self._next_t = t = seg.end_s
        carried = seg.kind == "decode" or (w.role is Role.COLOCATED and n > 0)  # iterations that decoded
        first_tokens = 0
        if seg.kind == "prefill":
            self.counters.prefill_tokens += seg.prefill_tokens
            self.counters.prefill_s_total += seg.prefill_s
            self.telemetry.extend(
                prefill_records(seg, time_s=time.time(), job=self.job, worker=self.worker_id, hardware=self.hardware)
            )
            free = w.kv_capacity - w.kv_used
            for r in seg.batch:
                s: ESeq = r.traj
                if s.future.done():  # aborted while its prefill ran
                    w.remove(r, t)
                    continue
                self.prefix_cache.insert(s.prompt, free)
                s.emit()  # the prefill pass produces the first token
                first_tokens += 1
                if s.kind == "prefill" or r.remaining == 0:
                    w.remove(r, t)
                    self._finish(s, "length")
                elif r in prefilled:  # a prompt queued before the worker became prefill-only: decode it here
                    w.submit_decode(r)
        for r in done:
            s = r.traj
            s.emit(upto=1 + r.remaining)
            self._finish(s, "length")
        decoded = w.tokens_out - tokens_before
        c = self.counters
        c.generated_tokens += decoded + first_tokens
        predicted = (seg.end_s - seg.t0) * self.time_factor
        observed = wall_end - (seg.t0 * self.time_factor + self._origin)
        if carried and n and seg.k:
            c.decode_iterations += seg.k
            c.iteration_s.append(observed / seg.k)
            c.token_times.append((time.monotonic(), decoded))
            prefilling = seg.kind == "prefill" and seg.end_s > seg.t0
            share = 1.0 - (seg.prefill_s / (seg.end_s - seg.t0) if prefilling else 0.0)
            self.record_decode_iteration(n, observed * share / seg.k / self.time_factor)
            self.timing_log.append((n, seg.k, predicted, observed))
            if len(self.timing_log) > 4096:
                del self.timing_log[:2048]
