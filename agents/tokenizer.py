"""Byte-level tokenizer: ids 0..255 are bytes, then a few specials; and a model directory's tokenizer behind
the same interface (`load_tokenizer`).

Why bytes: the tests and the tiny model need a tokenizer with no files to download and an exact
round trip for any text, so outputs can be compared token for token across processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
NUM_SPECIALS = 8  # 256..263; room for tool/turn markers without changing the vocabulary
VOCAB_SIZE = 256 + NUM_SPECIALS


@dataclass(frozen=True, slots=True)
class ByteTokenizer:
    """UTF-8 bytes <-> ids. `decode` drops specials and replaces invalid UTF-8."""

    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    pad_id: int = PAD_ID
    vocab_size: int = VOCAB_SIZE

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


TOKENIZER = ByteTokenizer()


# Chat markers over the spare specials (agents.gateway.chat.ByteChatFormat): the start of a message and the
# Hermes tool-call tags; EOS ends every message. 262..263 stay free.
CHAT_START_ID = 259
TOOL_CALL_ID = 260
TOOL_CALL_END_ID = 261


class Tokenizer(Protocol):
    """What the engines, the environments and the trainer need of a tokenizer: the byte tokenizer's interface."""

    @property
    def bos_id(self) -> int | None: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class HFTokenizer:
    """A model directory's `transformers` tokenizer behind the byte tokenizer's interface. `eos_id` is the
    tokenizer's end of a turn (the chat template's, e.g. <|im_end|>); `add_bos` adds the model's BOS only where
    the tokenizer has one (Qwen's has none); `pad_id` falls back to EOS (padding is masked wherever it is used)."""

    def __init__(self, tok: Any) -> None:
        if tok.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token (the end of an assistant turn)")
        self.tok = tok
        self.eos_id: int = int(tok.eos_token_id)
        self.bos_id: int | None = None if tok.bos_token_id is None else int(tok.bos_token_id)
        self.pad_id: int = int(tok.pad_token_id) if tok.pad_token_id is not None else self.eos_id
        self.vocab_size: int = len(tok)

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        ids = list(self.tok.encode(text, add_special_tokens=False))
        return [self.bos_id, *ids] if add_bos and self.bos_id is not None else ids

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=True))


def is_builtin(model: str) -> bool:
    """`tiny` (and its variants) is the byte tokenizer's model; anything else names a model directory, or a
    profile's model that only the emulated engine runs."""
    return model in ("", "tiny") or model.startswith("tiny")


@lru_cache(maxsize=8)
def hf_tokenizer(path: str) -> Any:
    """A directory's `transformers` tokenizer, loaded once per process (local files only, never a download)."""
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise ValueError(f"model directory {path!r} does not exist")
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def load_tokenizer(model: str) -> Tokenizer:
    """The tokenizer of a job's `model`: the byte tokenizer for `tiny` and for a name that is not a directory
    (an emulated model: its tokens are synthetic), else the directory's own."""
    if is_builtin(model) or not Path(model).is_dir():
        return TOKENIZER
    return HFTokenizer(hf_tokenizer(model))
