"""Engine backends behind one interface (`base.Engine`): torch, emulated, vllm (lazy)."""

from __future__ import annotations

from typing import Any


def build_engine(kind: str, **kw: Any) -> Any:
    """Import the backend lazily: torch/transformers and vllm are heavy, emulated needs neither."""
    if kind == "torch":
        from agents.engines.torch_engine import TorchEngine

        return TorchEngine(**{k: v for k, v in kw.items() if k in ("model", "worker_id", "role", "job", "threads")})
    if kind == "emulated":
        from agents.engines.emulated import EmulatedEngine

        return EmulatedEngine(
            **{
                k: v
                for k, v in kw.items()
                if k in ("model", "worker_id", "role", "job", "hardware", "time_factor", "tp", "interference")
            }
        )
    if kind == "vllm":
        from agents.engines.vllm_engine import VLLMEngine

        return VLLMEngine(**{k: v for k, v in kw.items() if k in ("model", "worker_id", "role", "job", "tp")})
    raise ValueError(f"unknown engine {kind!r}")
