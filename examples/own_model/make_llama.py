"""Make a small Llama directory offline, as a user's own model would be (README, "Your own model"):

    .venv/bin/python examples/own_model/make_llama.py /tmp/pearl-demo/my-llama

A random-weight LlamaForCausalLM (2 layers, hidden 64, GQA 4:2) saved with `save_pretrained` (safetensors,
config.json, generation_config.json) beside a byte-level BPE tokenizer trained here with `tokenizers` on a few
lines of arithmetic, with ChatML specials and a chat template. Nothing is downloaded. Its answers are noise
until a job trains it; the point is the plumbing: load, train, checkpoint, export, load again.
"""

from __future__ import annotations

import argparse
from pathlib import Path

CHAT_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "user assistant system",
    *(f"{a}+{b}={a + b}" for a in range(10) for b in range(10)),
    "the quick brown fox jumps over the lazy dog 0123456789",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the directory to write (must not exist)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    out = Path(args.out).absolute()
    if out.exists():
        raise SystemExit(f"{out} exists")

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS * 4, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=512
    )
    tok.chat_template = CHAT_TEMPLATE
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    n = sum(t.numel() for t in model.parameters())
    print(f"wrote {out}: Llama, {n / 1e6:.2f} M parameters, vocabulary {len(tok)}, with a chat template")


if __name__ == "__main__":
    main()
