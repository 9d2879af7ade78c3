"""A user's model directory: whether a `save_pretrained` directory can be a job's model, and the planner's
prior for it (its profile derived from config.json). The check is pure, over what the caller read from it
(its file names, `config.json`, `tokenizer_config.json`, `chat_template.jinja`), so that a directory that is
missing, has no weights, has an unsupported architecture or a tokenizer without a chat template is refused at
submission, naming which, rather than crashing a worker later. The control plane (a selector reads the
directory) and the agents (before loading it) ask the same question."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from controlplane.core.profiles import ModelSpec, Profile, profile_for_spec, register_model

# model_type values whose decoder the torch engine's fast decode path implements (RMSNorm, RoPE, GQA, SwiGLU;
# Qwen3's q/k-norm, Qwen2's q/k/v bias) and that vLLM serves natively
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


class ModelDirError(ValueError):
    """What is wrong with a model directory, in words a user can act on."""


def is_model_dir_spec(model: str) -> bool:
    """A job's `model` names a directory (an absolute path) rather than a profile's model name."""
    return model.startswith("/")


def weight_files(files: Iterable[str]) -> list[str]:
    """The safetensors weights of a directory (a single file, shards, or an index); PEARL loads no pickles."""
    return sorted(f for f in files if f.endswith(".safetensors") or f == "model.safetensors.index.json")


def check_model_dir(
    path: str,
    *,
    exists: bool,
    files: Iterable[str],
    config: dict[str, Any] | None,
    tokenizer_config: dict[str, Any] | None,
    chat_template: str | None,
) -> str:
    """The directory's `model_type` if it can be a job's model, else `ModelDirError` naming the first problem.
    `config` is the parsed config.json (None when absent), `tokenizer_config` the parsed tokenizer_config.json,
    `chat_template` the text of chat_template.jinja (transformers 5 keeps the template there)."""
    if not exists:
        raise ModelDirError(f"model directory {path!r} does not exist (or is not a directory)")
    names = set(files)
    if config is None:
        raise ModelDirError(f"model directory {path!r} has no config.json (a save_pretrained layout)")
    if not weight_files(names):
        raise ModelDirError(f"model directory {path!r} has no weights (*.safetensors)")
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    model_type = str((cfg or {}).get("model_type", ""))
    if model_type not in SUPPORTED_MODEL_TYPES:
        archs = config.get("architectures") or []
        named = f"{model_type!r}" + (f" ({', '.join(map(str, archs))})" if archs else "")
        raise ModelDirError(
            f"model directory {path!r} has an unsupported architecture {named}; supported model types: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    if tokenizer_config is None or not names & set(TOKENIZER_FILES):
        raise ModelDirError(f"model directory {path!r} has no tokenizer (tokenizer_config.json and tokenizer.json)")
    template = (tokenizer_config or {}).get("chat_template") or chat_template
    if not template:
        raise ModelDirError(
            f"model directory {path!r} has a tokenizer without a chat template (tokenizer_config.json's "
            "chat_template or chat_template.jinja)"
        )
    return model_type


@dataclass(frozen=True, slots=True)
class ModelDir:
    """A checked model directory: its architecture and parsed config.json (the planner derives its profile)."""

    path: str
    model_type: str
    config: dict[str, Any]


def inspect_model_dir(
    path: str,
    *,
    is_dir: Callable[[str], bool],
    list_dir: Callable[[str], list[str]],
    read_text: Callable[[str], str],
) -> ModelDir:
    """`check_model_dir` over a directory read through the caller's I/O (core reads no files): `read_text` of a
    path below `path`, `list_dir` its file names. Unreadable or invalid JSON is the directory's problem too."""
    if not is_dir(path):
        check_model_dir(path, exists=False, files=(), config=None, tokenizer_config=None, chat_template=None)
    files = list_dir(path)

    def parsed(name: str) -> dict[str, Any] | None:
        if name not in files:
            return None
        try:
            value = json.loads(read_text(f"{path.rstrip('/')}/{name}"))
        except (OSError, ValueError) as exc:
            raise ModelDirError(f"model directory {path!r}: {name} is not readable JSON ({exc})") from None
        if not isinstance(value, dict):
            raise ModelDirError(f"model directory {path!r}: {name} is not a JSON object")
        return value

    config = parsed("config.json")
    tokenizer_config = parsed("tokenizer_config.json")
    template = None
    if "chat_template.jinja" in files:
        try:
            template = read_text(f"{path.rstrip('/')}/chat_template.jinja")
        except (OSError, ValueError):
            template = None
    model_type = check_model_dir(
        path, exists=True, files=files, config=config, tokenizer_config=tokenizer_config, chat_template=template
    )
    assert config is not None
    return ModelDir(path, model_type, config)


# --------------------------------------------------------------------------------------------
# The planner's prior: a ModelSpec from config.json (PROFILES.md, "Profiles from a config")

_DTYPE_BYTES = {"float32": 4.0, "float": 4.0, "bfloat16": 2.0, "float16": 2.0, "half": 2.0, "float8_e4m3fn": 1.0}
# a MoE's grouped-GEMM/routing overhead per layer per iteration: the one calibrated figure (qwen3-30b-a3b's)
_MOE_DISPATCH_S_PER_LAYER = 40e-6


def _int(config: dict[str, Any], *keys: str, default: int | None = None) -> int:
    for k in keys:
        v = config.get(k)
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)) and v > 0:
            return int(v)
    if default is None:
        raise ValueError(f"config.json has no {keys[0]}")
    return default


def model_spec_from_config(config: dict[str, Any], name: str) -> ModelSpec:
    """A model's dimensions from its parsed `config.json` (a `transformers` config: layers, hidden size, heads and
    KV heads, head dim, intermediate size, experts and active experts, vocabulary, tied head, dtype), counted the
    way the sourced specs are: N_lin is the attention and active MLP projections of every layer (plus the
    router), the total adds every expert and the embedding and head matrices. A multimodal config's
    `text_config` is the language model's."""
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    assert isinstance(cfg, dict)
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _int(cfg, "hidden_size", "n_embd", "d_model")
    q_heads = _int(cfg, "num_attention_heads", "n_head")
    kv_heads = _int(cfg, "num_key_value_heads", "num_kv_heads", default=q_heads)
    head_dim = _int(cfg, "head_dim", default=hidden // q_heads)
    vocab = _int(cfg, "vocab_size")
    inter = _int(cfg, "intermediate_size", default=4 * hidden)
    experts = _int(cfg, "num_experts", "num_local_experts", "n_routed_experts", default=0)
    topk = _int(cfg, "num_experts_per_tok", "moe_topk", default=0) if experts else 0
    moe_inter = _int(cfg, "moe_intermediate_size", default=inter) if experts else 0
    shared_inter = _int(cfg, "shared_expert_intermediate_size", default=0) if experts else 0
    if experts and not 0 < topk <= experts:
        raise ValueError(f"config.json: num_experts_per_tok must be in 1..{experts}")
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype") or "bfloat16")
    dtype_bytes = _DTYPE_BYTES.get(dtype.removeprefix("torch."), 2.0)
    d_q, d_kv = q_heads * head_dim, kv_heads * head_dim
    attn = hidden * d_q + 2 * hidden * d_kv + d_q * hidden
    embed = vocab * hidden
    head = 0 if cfg.get("tie_word_embeddings", False) else vocab * hidden
    if not experts:
        mlp = 3 * hidden * inter
        return ModelSpec(
            name,
            layers=layers,
            hidden=hidden,
            q_heads=q_heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            params_total=float(layers * (attn + mlp) + embed + head),
            params_linear_active=float(layers * (attn + mlp)),
            weight_dtype_bytes=dtype_bytes,
            kv_dtype_bytes=dtype_bytes,
        )
    expert = 3 * hidden * moe_inter
    router = hidden * experts
    shared = 3 * hidden * shared_inter
    return ModelSpec(
        name,
        layers=layers,
        hidden=hidden,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        params_total=float(layers * (attn + router + shared + experts * expert) + embed + head),
        params_linear_active=float(layers * (attn + router + shared + topk * expert)),
        weight_dtype_bytes=dtype_bytes,
        kv_dtype_bytes=dtype_bytes,
        experts=experts,
        experts_topk=topk,
        expert_bytes_per_layer=expert * 2.0,  # in BF16 bytes, as the sourced spec (scaled by dtype when read)
        attn_bytes_per_layer=(attn + router + shared) * 2.0,
        lm_head_bytes=vocab * hidden * 2.0,
        moe_dispatch_s_per_layer=_MOE_DISPATCH_S_PER_LAYER,
    )


def profile_from_config(hardware: str, config: dict[str, Any], tp: int = 2, *, name: str = "") -> Profile:
    """The planner's prior for a model known only by its parsed `config.json`: the same roofline formulas as the
    sourced profiles over the dimensions `model_spec_from_config` reads; the tracker corrects it online."""
    return profile_for_spec(
        hardware, model_spec_from_config(config, name or str(config.get("model_type", "model"))), tp
    )


def register_model_config(name: str, config: dict[str, Any]) -> ModelSpec:
    """`get_profile(hardware, name, tp)` answers for this config from now on, in this process (the planner, the
    driver's selector and the submit check each register a job's model directory before asking)."""
    spec = model_spec_from_config(config, name)
    register_model(spec)
    return spec


__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "ModelDir",
    "ModelDirError",
    "check_model_dir",
    "inspect_model_dir",
    "is_model_dir_spec",
    "model_spec_from_config",
    "profile_from_config",
    "register_model_config",
    "weight_files",
]
