"""Methods PEARL adds to each vLLM worker process (vLLM's `worker_extension_cls`), called through
`collective_rpc` by name: nothing but a path crosses the process boundary."""

from __future__ import annotations

from typing import Any


class PearlWorkerExtension:
    """Mixed into vLLM's worker class."""

    model_runner: Any

    def pearl_install_weights(self, weights_path: str) -> None:
        """Install a snapshot in place, then tie the output head to the embeddings again where the model
        ties them: vLLM's layer-wise reload finds no `lm_head` weights in a tied checkpoint and puts the
        old head back, which would leave the previous version's head on the new embeddings."""
        self.model_runner.reload_weights(weights_path=weights_path)
        model = self.model_runner.get_model()
        config = getattr(getattr(self.model_runner, "model_config", None), "hf_config", None)
        head, inner = getattr(model, "lm_head", None), getattr(model, "model", None)
        embed = getattr(inner, "embed_tokens", None)
        tied = getattr(config, "tie_word_embeddings", False)
        if tied and head is not None and embed is not None and head is not embed:
            head.weight = embed.weight
