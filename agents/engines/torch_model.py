"""The torch engine's model: the decode forward of a Qwen3, Qwen2, Llama or Mistral model written against its
parameters (the prefill is the `transformers` model's own forward, in the runner)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from agents import models

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm, op for op (fp32)."""
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def _fuse(*ts: torch.Tensor) -> torch.Tensor:
    """One weight from several projections' weights, stacked on the output dimension."""
    return torch.cat([t.detach() for t in ts])


def _fuse_bias(*ts: torch.Tensor | None) -> torch.Tensor | None:
    """The fused projections' bias, or None when any of them has none (Qwen3 has none)."""
    present = [t for t in ts if t is not None]
    return _fuse(*present) if len(present) == len(ts) else None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FastDecoder:
    """The decode forward (one iteration: one token per row) of a Llama-family model, written against its parameters.

    Why: at small batch, `transformers`' per-call machinery (mask builders, cache objects, module
    hooks, output dataclasses) costs more than the arithmetic, and `DynamicCache` concatenates the
    whole cache every iteration. This path does the same operations (RMSNorm, q/k-norm, RoPE, GQA SDPA,
    SwiGLU) over a preallocated KV buffer that each iteration writes one column of. It reads the live
    parameters, so loading new weights into the model is seen at the next iteration. The architectures differ
    only in what this reads as optional: Qwen3's q/k-norm, Qwen2's q/k/v bias, Llama's optional biases; a
    sliding window is not implemented (the runner caps a sequence at the window, where attention is full).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        cfg = model.config
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise ValueError(f"the fast decode path implements SwiGLU (silu), not {cfg.hidden_act!r}")
        inner = model.model
        self.embed = inner.embed_tokens.weight.detach()
        self.norm_w, self.norm_eps = inner.norm.weight.detach(), inner.norm.variance_epsilon
        self.lm_head = model.lm_head.weight.detach()
        # the config fills an unset num_key_value_heads with num_attention_heads (MHA); `or` says so to the types
        self.nh, self.hd = cfg.num_attention_heads, models.head_dim(cfg)
        self.nkv: int = cfg.num_key_value_heads or cfg.num_attention_heads
        self.layers = []
        for layer in inner.layers:
            a, mlp = layer.self_attn, layer.mlp
            if getattr(a, "sliding_window", None):
                raise ValueError("sliding-window attention is not supported by the fast decode path")
            # fused q|k|v and gate|up projections: fewer, larger GEMMs per iteration
            self.layers.append(
                (
                    layer.input_layernorm.weight.detach(),
                    layer.input_layernorm.variance_epsilon,
                    _fuse(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight),
                    _fuse_bias(a.q_proj.bias, a.k_proj.bias, a.v_proj.bias),
                    a.o_proj.weight.detach(),
                    None if a.o_proj.bias is None else a.o_proj.bias.detach(),
                    None if getattr(a, "q_norm", None) is None else a.q_norm.weight.detach(),
                    None if getattr(a, "k_norm", None) is None else a.k_norm.weight.detach(),
                    a.q_norm.variance_epsilon if getattr(a, "q_norm", None) is not None else 0.0,
                    layer.post_attention_layernorm.weight.detach(),
                    layer.post_attention_layernorm.variance_epsilon,
                    _fuse(mlp.gate_proj.weight, mlp.up_proj.weight),
                    _fuse_bias(mlp.gate_proj.bias, mlp.up_proj.bias),
                    mlp.down_proj.weight.detach(),
                    None if mlp.down_proj.bias is None else mlp.down_proj.bias.detach(),
                )
            )
        self.inter = cfg.intermediate_size
        rope = inner.rotary_emb
        positions = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
        freqs = positions[:, None] * rope.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        dtype = self.embed.dtype
        self.cos = (emb.cos() * rope.attention_scaling).to(dtype)
        self.sin = (emb.sin() * rope.attention_scaling).to(dtype)

    @torch.no_grad()
    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        K: list[torch.Tensor],
        V: list[torch.Tensor],
        col: int,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """ids/positions [B]; writes K/V column `col`; attends to columns [0, col]. Returns logits [B, V]."""
        F = torch.nn.functional
        B = ids.shape[0]
        h = F.embedding(ids, self.embed).unsqueeze(1)  # [B, 1, H]
        cos = self.cos[positions].view(B, 1, 1, -1)
        sin = self.sin[positions].view(B, 1, 1, -1)
        nq, nk = self.nh * self.hd, self.nkv * self.hd
        for li, (ln1, e1, wqkv, bqkv, wo, bo, qn, kn, eqk, ln2, e2, wgu, bgu, wd, bd) in enumerate(self.layers):
            qkv = F.linear(_rms(h, ln1, e1), wqkv, bqkv)
            q = qkv[..., :nq].reshape(B, 1, self.nh, self.hd)
            k = qkv[..., nq : nq + nk].reshape(B, 1, self.nkv, self.hd)
            if qn is not None and kn is not None:  # Qwen3's per-head q/k RMSNorm
                q, k = _rms(q, qn, eqk), _rms(k, kn, eqk)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = qkv[..., nq + nk :].reshape(B, 1, self.nkv, self.hd).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            K[li][:, :, col] = k[:, :, 0]
            V[li][:, :, col] = v[:, :, 0]
            att = F.scaled_dot_product_attention(
                q, K[li][:, :, : col + 1], V[li][:, :, : col + 1], attn_mask=mask, enable_gqa=True
            )
            h = h + F.linear(att.transpose(1, 2).reshape(B, 1, self.nh * self.hd), wo, bo)
            gu = F.linear(_rms(h, ln2, e2), wgu, bgu)
            h = h + F.linear(F.silu(gu[..., : self.inter]) * gu[..., self.inter :], wd, bd)
        return F.linear(_rms(h[:, 0], self.norm_w, self.norm_eps), self.lm_head)
