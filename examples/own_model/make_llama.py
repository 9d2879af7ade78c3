"""Make a small Llama directory offline, as a user's own model would be (README, "Your own model"):

    .venv/bin/python examples/own_model/make_llama.py /tmp/pearl-demo/my-llama

A random-weight LlamaForCausalLM (2 layers, hidden 64, GQA 4:2) saved with `save_pretrained` (safetensors,
config.json, generation_config.json) beside a byte-level BPE tokenizer trained here with `tokenizers`, with
ChatML specials and a chat template: `python -m agents.hf_tiny DIR --arch llama`, which also makes Qwen2,
Mistral and Qwen3 directories. Nothing is downloaded. Its answers are noise until a job trains it; the point is
the plumbing: load, train, checkpoint, export, load again.
"""

from __future__ import annotations

import sys

from agents.hf_tiny import main

if __name__ == "__main__":
    main([*sys.argv[1:], "--arch", "llama"])
