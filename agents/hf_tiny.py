"""Tiny random Hugging Face causal LMs made offline, nothing downloaded: a `save_pretrained` directory per
architecture (Llama, Qwen2, Mistral, Qwen3: 2 layers, hidden 64) with a small byte-level BPE tokenizer trained
here with `tokenizers` and a ChatML chat template (Hermes tool calls), as a user's own model directory is. Their
answers are noise until a job trains them; they exercise the plumbing (load, train, checkpoint, export, load
again) where no model hub can be reached: the tests, the README's own-model walk-through and the demo.

    python -m agents.hf_tiny DIR [--arch llama] [--seed 0]

`write(path, arch)` writes one at path (deterministic in its seed); `model_dir(root, arch)` one under root, reused.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

ARCHITECTURES = ("llama", "qwen2", "mistral", "qwen3")

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "Call one as <tool_call>{json}</tool_call>.<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls or [] %}<tool_call>"
    '{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}</tool_call>{% endfor %}'
    "<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
_CORPUS = [
    "user assistant system tool",
    *(f"{a}+{b}?" for a in range(10) for b in range(10)),
    *(f"={c}" for c in range(19)),
    "the quick brown fox jumps over the lazy dog 0123456789",
    '{"name": "add", "arguments": {"a": 1, "b": 2}}',
    "Call one as <tool_call>{json}</tool_call>. # Tools",
]


def build_tokenizer(vocab_size: int = 384) -> Any:
    """A byte-level BPE (every text encodes) trained on a few lines, with the ChatML specials and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=512
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_config(arch: str, tokenizer: Any, **overrides: Any) -> Any:
    """The architecture's `transformers` config at test size (2 layers, hidden 64, GQA 4:2, head dim 16)."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig, "qwen3": Qwen3Config}[arch]
    kw: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=arch == "qwen3",
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    if arch == "mistral":
        kw["sliding_window"] = None
    kw.update(overrides)
    return cls(**kw)


def write(path: Path | str, arch: str = "llama", *, seed: int = 0, **overrides: Any) -> Path:
    """A random `arch` model and its tokenizer saved at path, atomically (a temporary sibling, then a rename)."""
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path)
    tok = build_tokenizer()
    cfg = build_config(arch, tok, **overrides)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    finally:
        torch.random.set_rng_state(state)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    tmp.rename(path)
    return path


def model_dir(root: Path | str, arch: str, *, seed: int = 0, **overrides: Any) -> Path:
    """A random `arch` model and its tokenizer under root/arch (written once; reused if present)."""
    path = Path(root) / (arch if not overrides and not seed else f"{arch}-{seed}-{abs(hash(repr(overrides)))}")
    if (path / "config.json").exists():
        return path
    return write(path, arch, seed=seed, **overrides)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m agents.hf_tiny", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the directory to write (must not exist)")
    p.add_argument("--arch", choices=ARCHITECTURES, default="llama")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    out = Path(args.out).absolute()
    if out.exists():
        raise SystemExit(f"{out} exists")
    out.parent.mkdir(parents=True, exist_ok=True)
    write(out, args.arch, seed=args.seed)
    cfg = json.loads((out / "config.json").read_text())
    print(f"wrote {out}: {cfg['architectures'][0]}, vocabulary {cfg['vocab_size']}, with a chat template")


if __name__ == "__main__":
    main()
