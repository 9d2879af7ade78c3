"""torch backend: a real causal LM from `transformers` (the tiny Qwen3, or a Qwen3, Qwen2, Llama or Mistral
directory) with continuous batching and PD roles.

Why a hand-rolled loop instead of `generate`: continuous batching (sequences join the running
batch between iterations and leave when done) needs the KV cache per row under our control. The
running batch shares one left-padded, preallocated KV buffer per layer; rows are re-packed only when membership
changes. A prefill worker exports one sequence's cache as safetensors bytes; a decode worker
imports it and continues, with the same numbers as a colocated run (same batch shape -> same bits).
The model runs in a single executor thread so the worker's HTTP loop stays responsive.

Split after vLLM v1: `torch_model` (the decode forward), `torch_runner` (executes prefill, KV transfer and
decode over the KV buffer, and samples), `torch_scheduler` (the waiting queue, admission, aborts); this
module is the engine core: the `Engine` API and the continuous-batching loop that joins them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import time
from typing import Any

import torch
from safetensors.torch import load as st_load

from agents import models
from agents.dataplane import (
    DecodeRequest,
    GenerateRequest,
    GenerationResult,
    PrefillResult,
    SamplingParams,
)
from agents.engines.base import EngineConflict, EngineError, LoopEngine
from agents.engines.torch_model import FastDecoder
from agents.engines.torch_runner import TorchRunner, sample_token
from agents.engines.torch_scheduler import MAX_RUNNING, Seq, TorchScheduler, finished
from agents.tokenizer import load_tokenizer
from controlplane.core import telemetry as tm

ITERATION_SLICE_S = 0.02  # longest run of decode iterations between returns to the event loop


class TorchEngine(LoopEngine):
    kind = "torch"

    def __init__(
        self,
        *,
        model: str = "tiny",
        worker_id: int = 0,
        role: str = "colocated",
        job: str = "",
        threads: int | None = None,
        max_running: int = MAX_RUNNING,
    ) -> None:
        super().__init__(worker_id=worker_id, role=role, job=job)
        models.set_threads(threads)
        self.runner = TorchRunner(models.load_model(model))
        self.tokenizer = load_tokenizer(model)  # the directory's own, or the tiny model's bytes
        self.eos_id = self.tokenizer.eos_id
        self.scheduler = TorchScheduler(max_running)
        self.vocab_size = int(self.runner.model.config.vocab_size)
        self._by_id: dict[str, Seq] = {}
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="torch-engine")

    # ---- lifecycle
    async def shutdown(self) -> None:
        await super().shutdown()
        self._executor.shutdown(wait=True)

    # ---- data plane
    def _submit(
        self, req_id: str, kind: str, prompt: list[int], params: SamplingParams, kv_in: bytes | None = None
    ) -> Seq:
        limit = self.runner.max_positions
        if len(prompt) + params.max_tokens > limit:  # a decode request's prompt length is checked on import
            raise EngineError(
                f"prompt ({len(prompt)}) + max_tokens ({params.max_tokens}) exceeds the model's {limit} positions"
            )
        if req_id in self._by_id:
            raise EngineConflict(f"request {req_id!r} is already in flight on this worker")
        seq = Seq(
            req_id, kind, prompt, params, self.weight_version, asyncio.get_running_loop().create_future(), kv_in=kv_in
        )
        self._by_id[req_id] = seq
        seq.future.add_done_callback(lambda _f: self._forget(seq))
        self.scheduler.add(seq)
        self._wake()
        return seq

    async def _wait(self, seq: Seq) -> Seq:
        try:
            return await asyncio.shield(seq.future)
        except asyncio.CancelledError:
            # the caller went away (HTTP client disconnected): abort, as vLLM does, to free the slot
            self.scheduler.abort([seq.request_id])
            if self._work:
                self._work.set()
            raise

    def _forget(self, seq: Seq) -> None:
        if self._by_id.get(seq.request_id) is seq:
            del self._by_id[seq.request_id]

    async def generate(self, req: GenerateRequest, prompt: list[int]) -> GenerationResult:
        seq = await self._wait(self._submit(req.request_id, "generate", prompt, req.sampling))
        return self._result(seq)

    async def prefill(self, req: GenerateRequest, prompt: list[int]) -> PrefillResult:
        seq = await self._wait(self._submit(req.request_id, "prefill", prompt, req.sampling))
        if seq.finish_reason == "abort":
            raise EngineError("prefill aborted", 409)
        handle, token = self.kv.put(seq.kv_out, len(prompt))
        return PrefillResult(
            request_id=seq.request_id,
            handle=handle,
            kv_token=token,
            prompt_len=len(prompt),
            first_token=seq.out_tokens[0],
            first_logprob=seq.logprobs[0],
            kv_bytes=len(seq.kv_out),
            weight_version=seq.weight_version,
            worker_id=self.worker_id,
        )

    async def decode(self, req: DecodeRequest, kv_bytes: bytes) -> GenerationResult:
        self.counters.kv_bytes_in += len(kv_bytes)
        seq = await self._wait(self._submit(req.request_id, "decode", [], req.sampling, kv_in=kv_bytes))
        return self._result(seq)

    def _result(self, seq: Seq) -> GenerationResult:
        return GenerationResult(
            request_id=seq.request_id,
            tokens=list(seq.out_tokens),
            logprobs=list(seq.logprobs),
            finish_reason=seq.finish_reason,
            prompt_len=len(seq.prompt),
            weight_version=seq.weight_version,
            worker_id=self.worker_id,
            text=self.tokenizer.decode(seq.out_tokens),
        )

    async def abort(self, request_id: str) -> GenerationResult | None:
        seq = self._by_id.get(request_id)
        if seq is None:
            return None
        self.scheduler.abort([request_id])
        self._wake()
        await self._wait(seq)
        return self._result(seq)

    async def abort_all(self) -> list[GenerationResult]:
        seqs = list(self._by_id.values())
        self.scheduler.abort(s.request_id for s in seqs)
        if self._work:
            self._work.set()
        for s in seqs:
            await self._wait(s)
        return [self._result(s) for s in seqs]

    def inflight(self) -> list[dict[str, Any]]:
        return [
            {
                "request_id": s.request_id,
                "kind": s.kind,
                "prompt_len": len(s.prompt),
                "tokens": list(s.out_tokens),
                "logprobs": list(s.logprobs),
                "weight_version": s.weight_version,
            }
            for s in list(self._by_id.values())
        ]

    def running(self) -> int:
        return len(self.runner.rows)

    def waiting(self) -> int:
        return len(self.scheduler.waiting)

    async def sleep(self, level: int) -> None:
        if self._by_id:
            raise EngineConflict("drain the worker before putting it to sleep")
        self.kv.clear()
        self.state = "sleeping"

    async def wake(self) -> None:
        self.state = "running"

    async def load_weights(self, version: int, data: bytes) -> None:
        def install() -> None:
            try:
                tensors = st_load(data)
            except Exception as exc:
                raise EngineError(f"weights are not valid safetensors: {exc}") from exc
            try:
                models.load_wire_state(self.runner.model, tensors)
            except ValueError as exc:
                raise EngineError(str(exc)) from exc
            self.runner.decoder = FastDecoder(self.runner.model)  # re-fuse the new weights

        # Runs between decode iterations (same single thread), like vLLM's in-flight weight update
        # in "keep" mode; each result reports the oldest version that produced its tokens.
        await asyncio.get_running_loop().run_in_executor(self._executor, install)
        self.weight_version = version

    # ---- the continuous-batching loop
    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._work is not None
        while not self._closed:
            if not self.runner.rows and not self.scheduler.waiting:
                self._work.clear()
                await self._work.wait()
                continue
            try:
                done = await loop.run_in_executor(self._executor, self._iterations)
            except Exception as exc:  # a bug or bad input must not kill the loop silently
                for s in list(self._by_id.values()):
                    if not s.future.done():
                        s.future.set_exception(EngineError(f"engine iteration failed: {exc}", 500))
                self.runner.remove([])
                self.scheduler.clear()
                continue
            for seq, err in done:
                if seq.future.done():
                    continue
                if err is not None:
                    seq.future.set_exception(err)
                else:
                    seq.future.set_result(seq)

    def _iterations(self) -> list[tuple[Seq, Exception | None]]:
        """Run iterations back to back in the engine thread until something needs the event loop:
        a sequence finished, a request or abort arrived, or ITERATION_SLICE_S passed. Handing back
        to the loop after every iteration costs a thread switch per token (milliseconds on a busy
        machine)."""
        t0 = time.perf_counter()
        while True:
            done = self._iteration()
            if done or not self.runner.rows or self.scheduler.waiting or self.scheduler.aborts or self._closed:
                return done
            if time.perf_counter() - t0 > ITERATION_SLICE_S:
                return done

    def _iteration(self) -> list[tuple[Seq, Exception | None]]:
        """One iteration in the engine thread: aborts, admit + prefill, one decode iteration."""
        scheduled = self.scheduler.schedule(len(self.runner.rows))
        admitted, aborts = scheduled.admitted, scheduled.aborts
        done: list[tuple[Seq, Exception | None]] = [(s, None) for s in scheduled.aborted]
        if aborts and self.runner.rows:
            keep = []
            for i, s in enumerate(self.runner.rows):
                if s.request_id in aborts:
                    s.finish_reason = "abort"
                    done.append((s, None))
                else:
                    keep.append(i)
            if len(keep) != len(self.runner.rows):
                self.runner.remove(keep)
        # admit: prefill new prompts, import pulled caches
        to_prefill = [s for s in admitted if s.kind != "decode"]
        if to_prefill:
            t0 = time.perf_counter()
            outs = self.runner.prefill([s.prompt for s in to_prefill])
            dt = time.perf_counter() - t0
            ntok = sum(len(s.prompt) for s in to_prefill)
            self.counters.prefill_tokens += ntok
            self.counters.prefill_s_total += dt
            self.telemetry.append(
                tm.prefill(time_s=time.time(), job=self.job, worker=self.worker_id, tokens=ntok, duration_s=dt)
            )
            for s, (logits, kv) in zip(to_prefill, outs):
                tok, lp = sample_token(logits, s.params, 0)
                s.out_tokens.append(tok)
                s.logprobs.append(lp)
                self.counters.generated_tokens += 1
                if s.kind == "prefill":
                    s.kv_out = self.runner.export_kv(
                        kv,
                        {
                            "first_token": tok,
                            "first_logprob": lp,
                            "weight_version": s.weight_version,
                            "seed": s.params.seed,
                        },
                        s.prompt,
                    )
                    s.finish_reason = "length"
                    done.append((s, None))
                elif finished(s, self.eos_id):
                    done.append((s, None))
                else:
                    self.runner.join(s, kv)
        for s in admitted:
            if s.kind != "decode":
                continue
            try:
                kv, prompt, meta = self.runner.import_kv(s.kv_in or b"")
            except EngineError as exc:
                done.append((s, exc))
                continue
            s.kv_in = None
            s.prompt = prompt
            if len(prompt) + s.params.max_tokens > self.runner.max_positions:
                done.append(
                    (
                        s,
                        EngineError(
                            f"prompt ({len(prompt)}) + max_tokens exceeds the model's "
                            f"{self.runner.max_positions} positions"
                        ),
                    )
                )
                continue
            s.out_tokens.append(int(meta.get("first_token", 0)))
            s.logprobs.append(float(meta.get("first_logprob", 0.0)))
            s.weight_version = min(s.weight_version, int(meta.get("weight_version", s.weight_version)))
            if finished(s, self.eos_id):
                done.append((s, None))
            else:
                self.runner.join(s, kv)
        # one decode iteration over the running batch
        if self.runner.rows:
            t0 = time.perf_counter()
            batch = len(self.runner.rows)
            logits = self.runner.decode_iteration()
            greedy = [i for i, s in enumerate(self.runner.rows) if s.params.temperature <= 0.0]
            if greedy:
                sel = logits[greedy].float()
                logp = torch.log_softmax(sel, dim=-1)
                toks = torch.argmax(sel, dim=-1)
                lps = logp.gather(1, toks.unsqueeze(1)).squeeze(1)
                for j, i in enumerate(greedy):
                    s = self.runner.rows[i]
                    s.out_tokens.append(int(toks[j]))
                    s.logprobs.append(float(lps[j]))
            for i, s in enumerate(self.runner.rows):
                if s.params.temperature > 0.0:
                    tok, lp = sample_token(logits[i], s.params, len(s.out_tokens))
                    s.out_tokens.append(tok)
                    s.logprobs.append(lp)
            dt = time.perf_counter() - t0
            c = self.counters
            c.decode_iterations += 1
            c.generated_tokens += batch
            c.iteration_s.append(dt)
            c.token_times.append((time.monotonic(), batch))
            self.record_decode_iteration(batch, dt)
            keep = []
            for i, s in enumerate(self.runner.rows):
                if finished(s, self.eos_id):
                    done.append((s, None))
                else:
                    keep.append(i)
            if len(keep) != batch:
                self.runner.remove(keep)
        return done


def seed_of(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 2
