"""Methods PEARL adds to each vLLM worker process (vLLM's `worker_extension_cls`), called through
`collective_rpc` by name: nothing but a path crosses the process boundary."""

from __future__ import annotations

from typing import Any

import torch


def request_amx() -> None:
    """Ask Linux for this process's AMX tile state (arch_prctl XTILEDATA) where the CPU has AMX: vLLM's CPU
    attention for bf16 runs AMX tile instructions and never asks, so on a Sapphire Rapids VM the engine core
    died with SIGILL at its first attention (gdb: `cpu_attn_amx.hpp`); torch asks only for its own oneDNN
    kernels. The engine core imports this module (its worker extension) before it runs the model."""
    if torch.cpu._is_amx_tile_supported():
        torch.cpu._init_amx()


request_amx()


class PearlWorkerExtension:
    """Mixed into vLLM's worker class."""

    model_runner: Any

    def pearl_install_weights(self, weights_path: str) -> None:
        """Install a snapshot in place, then rebuild the tied output head's kernel.

        A tied checkpoint holds no `lm_head` weights, so vLLM's layer-wise reload loads the shared tensor
        through `embed_tokens` only and puts the head's old tensors back ("ParallelLMHead: Failed to load
        weights") without running the head's `process_weights_after_loading`. On CPU that step packs the
        head's weight into its own GEMM kernel (`cpu_linear`, a copy), so the logits kept coming from the
        previous version's head. Re-running it on the re-tied head packs the new weights."""
        self.model_runner.reload_weights(weights_path=weights_path)
        model = self.model_runner.get_model()
        config = getattr(getattr(self.model_runner, "model_config", None), "hf_config", None)
        head, inner = getattr(model, "lm_head", None), getattr(model, "model", None)
        embed = getattr(inner, "embed_tokens", None)
        if not getattr(config, "tie_word_embeddings", False) or head is None or embed is None or head is embed:
            return
        head.weight = embed.weight
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)
