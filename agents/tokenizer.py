"""Byte-level tokenizer: ids 0..255 are bytes, then a few specials.

Why bytes: the tests and the tiny model need a tokenizer with no files to download and an exact
round trip for any text, so outputs can be compared token for token across processes.
"""

from __future__ import annotations

from dataclasses import dataclass

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
