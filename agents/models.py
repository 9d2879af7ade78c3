"""The causal LM the torch engine and the trainer run.

`tiny` is a seeded random Qwen3 (0.2 M parameters) so that every process that builds it with the
same seed holds bit-identical weights without shipping a file; a local directory written by
`save_pretrained` loads the real thing through `AutoModelForCausalLM`, any of the architectures
`controlplane.core.model_dir.SUPPORTED_MODEL_TYPES` names (Qwen3, Qwen2, Llama, Mistral). Weights travel
only as safetensors.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agents.tokenizer import VOCAB_SIZE, is_builtin
from controlplane.core.model_dir import ModelDir, inspect_model_dir

if TYPE_CHECKING:  # transformers is imported lazily: it is slow to import and only the torch paths need it
    from transformers import PreTrainedModel

TINY_SEED = 0


def tiny_config(**overrides: Any) -> Any:
    from transformers import Qwen3Config

    kw: dict[str, Any] = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        bos_token_id=256,
        eos_token_id=257,
        pad_token_id=258,
    )
    kw.update(overrides)
    cfg = Qwen3Config(**kw)
    cfg._attn_implementation = "sdpa"
    return cfg


def read_model_dir(path: str) -> ModelDir:
    """The core check of a model directory over this machine's files (`ModelDirError` names what is wrong)."""
    return inspect_model_dir(
        path,
        is_dir=os.path.isdir,
        list_dir=lambda p: sorted(os.listdir(p)),
        read_text=lambda p: Path(p).read_text(encoding="utf-8"),
    )


def load_model(spec: str = "tiny", *, seed: int = TINY_SEED) -> PreTrainedModel:
    """`tiny` (seeded random weights) or a local `save_pretrained` directory of a supported architecture
    (`AutoModelForCausalLM`, safetensors only, local files only). Eval mode, fp32."""
    from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

    model: PreTrainedModel
    if is_builtin(spec):
        cfg = tiny_config()
        # A private generator keeps the weights independent of whatever the caller seeded.
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            model = Qwen3ForCausalLM(cfg)
        finally:
            torch.random.set_rng_state(state)
    else:
        read_model_dir(spec)  # a clear error, not a transformers traceback, for a directory that cannot load
        model = AutoModelForCausalLM.from_pretrained(
            spec, dtype=torch.float32, use_safetensors=True, local_files_only=True, attn_implementation="sdpa"
        )
        model.config._attn_implementation = "sdpa"
    return model.eval()


def head_dim(cfg: Any) -> int:
    """The attention head size: the config's, or hidden / heads where the config leaves it out (Qwen2)."""
    return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


def state_dict_for_wire(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters without tied duplicates (safetensors refuses shared storage)."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        ptr = tensor.data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        out[name] = tensor.detach().contiguous().clone()
    return out


def tied_keys(model: torch.nn.Module) -> set[str]:
    """Names that share storage with an earlier parameter (e.g. lm_head.weight when tied)."""
    seen: set[int] = set()
    tied: set[str] = set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            tied.add(name)
        seen.add(tensor.data_ptr())
    return tied


def load_wire_state(model: PreTrainedModel, tensors: dict[str, torch.Tensor]) -> None:
    """Load a wire state dict strictly (only tied keys may be absent); shapes must match."""
    expected = model.state_dict()
    missing = set(expected) - set(tensors) - tied_keys(model)
    unknown = set(tensors) - set(expected)
    if missing or unknown:
        raise ValueError(f"weights do not fit the model: missing {sorted(missing)[:4]}, unknown {sorted(unknown)[:4]}")
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(expected[name].shape) or t.dtype != expected[name].dtype:
            raise ValueError(f"weights do not fit the model: {name} is {tuple(t.shape)}/{t.dtype}")
    with torch.no_grad():
        model.load_state_dict(tensors, strict=False)
        if hasattr(model, "tie_weights"):
            model.tie_weights()


def fingerprint(model: PreTrainedModel) -> str:
    """Short hash of the architecture, so a KV cache is only imported into a matching model."""
    cfg = model.config
    text = (
        f"{cfg.model_type}/{cfg.num_hidden_layers}/{cfg.num_key_value_heads}/{head_dim(cfg)}/{cfg.hidden_size}"
        f"/{cfg.vocab_size}"
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def set_threads(n: int | None = None) -> None:
    """One torch thread per worker by default: the machine's cores are shared by several workers."""
    n = n or int(os.environ.get("PEARL_TORCH_THREADS", "1"))
    torch.set_num_threads(max(1, n))
