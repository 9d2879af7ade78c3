"""Tiny Hugging Face model directories for the tests (`agents.hf_tiny` makes them, nothing downloaded), and
`bad_model_dir(root, what)`: one with a single thing wrong, for the submit-time checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from agents.hf_tiny import ARCHITECTURES, build_tokenizer, model_dir

__all__ = ["ARCHITECTURES", "bad_model_dir", "build_tokenizer", "model_dir"]


def bad_model_dir(root: Path | str, what: str) -> Path:
    """A Llama directory with one thing wrong: `no_weights`, `architecture` (a GPT-2 config), `no_template`,
    `no_config`; `missing` is a path that does not exist."""
    root = Path(root)
    if what == "missing":
        return root / "no-such-model"
    src = model_dir(root, "llama")
    path = root / f"bad-{what}"
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(src, path)
    if what == "no_weights":
        for f in path.glob("*.safetensors"):
            f.unlink()
    elif what == "no_config":
        (path / "config.json").unlink()
    elif what == "architecture":
        cfg = json.loads((path / "config.json").read_text())
        cfg.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
        (path / "config.json").write_text(json.dumps(cfg))
    elif what == "no_template":
        (path / "chat_template.jinja").unlink(missing_ok=True)
        tc = json.loads((path / "tokenizer_config.json").read_text())
        tc.pop("chat_template", None)
        (path / "tokenizer_config.json").write_text(json.dumps(tc))
    else:
        raise ValueError(f"unknown defect {what!r}")
    return path
