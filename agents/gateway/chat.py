"""Chat formats: messages (and tools) → prompt token ids, sampled ids → an assistant message.

Two formats behind one interface:

* `HFChatFormat`: a job's model directory (a `save_pretrained` folder) brings its tokenizer and chat
  template, applied with `transformers`. Tool calls in the Hermes / Qwen `<tool_call>{json}</tool_call>`
  form are parsed into OpenAI `tool_calls`; tool results are templated back by the template itself.
* `ByteChatFormat`: the built-in tiny model's byte tokenizer, with a ChatML-like template over its spare
  special ids (`agents.tokenizer.CHAT_*`), the same tool-call tags as ids.

Token-in, token-out needs one more thing of a format than rendering a whole conversation: the template
tokens of *new* messages that follow an assistant turn whose ids were sampled (`delta`), and the tokens
that close a sampled turn in the template (`closing`: the end-of-turn marker if the engine did not emit
it, the newline after it). HF templates get both with the fixed-base trick (render a fixed conversation
with and without the new messages and subtract), so the sampled ids are never re-tokenized.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from agents.tokenizer import CHAT_START_ID, TOKENIZER, TOOL_CALL_END_ID, TOOL_CALL_ID, hf_tokenizer, is_builtin

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


class TemplateError(ValueError):
    """Messages the template cannot render (→ 400 invalid_request_error)."""


@dataclass(slots=True)
class Answer:
    """A sampled turn as the agent sees it."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""  # the raw decoded completion (tags included)

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Hermes / Qwen tool calls: every `<tool_call>{"name":..., "arguments": {...}}</tool_call>` becomes an
    OpenAI tool call (arguments as a JSON string); the text around them is the content. A tag whose body is
    not a JSON object with a name stays in the content (the model's mistake, visible to the agent)."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    for m in TOOL_CALL_RE.finditer(text):
        try:
            body = json.loads(m.group(1))
        except ValueError:
            continue
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            continue
        args = body.get("arguments", body.get("parameters", {}))
        kept.append(text[pos : m.start()])
        pos = m.end()
        calls.append(
            {
                "id": "call_" + secrets.token_hex(12),
                "type": "function",
                "function": {"name": body["name"], "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
        )
    kept.append(text[pos:])
    content = "".join(kept).strip() if calls else text
    return (content or None) if calls else content, calls


def _arguments_as_objects(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI sends tool-call arguments as a JSON string; Qwen-style templates iterate or `tojson` them, so
    they get the parsed object (a string that is not JSON stays a string)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    with contextlib.suppress(ValueError):
                        fn["arguments"] = json.loads(fn["arguments"])
                calls.append({**c, "function": fn})
            m = {**m, "tool_calls": calls}
        if isinstance(m.get("content"), list):
            m = {**m, "content": "".join(p.get("text", "") for p in m["content"] if isinstance(p, dict))}
        out.append(m)
    return out


class ChatFormat(Protocol):
    name: str
    vocab_size: int
    stop_ids: frozenset[int]  # end-of-turn ids: a sampled turn ends at the first of them

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """A whole conversation, with the generation prompt of the assistant's turn."""

    def delta(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int] | None:
        """The tokens of `messages` (and the generation prompt) after a closed assistant turn; None if the
        template cannot say (the caller forks)."""

    def closing(self, sampled: list[int]) -> list[int]:
        """Template tokens that close a sampled assistant turn in the context."""

    def answer(self, sampled: list[int]) -> Answer: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


# ---------------------------------------------------------------- the tiny model's byte template
class ByteChatFormat:
    """`<start>role\\ncontent<eos>\\n` per message (ChatML over spare byte-tokenizer ids), BOS first; an
    assistant's tool call is `<tool_call>{json}</tool_call>` with the tags as ids; tools are listed in the
    system message. The engines stop at EOS, which ends every turn."""

    name = "byte-chatml"
    vocab_size = TOKENIZER.vocab_size
    stop_ids = frozenset({TOKENIZER.eos_id})

    def _message(self, m: dict[str, Any]) -> list[int]:
        role = str(m.get("role", ""))
        content = m.get("content") or ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise TemplateError(f"content of a {role!r} message must be a string or text parts")
        ids = [CHAT_START_ID, *TOKENIZER.encode(f"{role}\n{content}", add_bos=False)]
        for c in m.get("tool_calls") or []:
            fn = c.get("function") or {}
            args = fn.get("arguments", "{}")
            with contextlib.suppress(ValueError):
                args = json.loads(args) if isinstance(args, str) else args
            body = json.dumps({"name": fn.get("name", ""), "arguments": args}, separators=(",", ":"))
            ids += [TOOL_CALL_ID, *TOKENIZER.encode(body, add_bos=False), TOOL_CALL_END_ID]
        return [*ids, TOKENIZER.eos_id, *TOKENIZER.encode("\n", add_bos=False)]

    def _tools_message(self, tools: list[dict[str, Any]]) -> dict[str, Any]:
        listing = "\n".join(json.dumps(t.get("function", t), separators=(",", ":")) for t in tools)
        return {"role": "system", "content": f"# Tools\n{listing}\nCall one as <tool_call>{{json}}</tool_call>."}

    def _generation_prompt(self) -> list[int]:
        return [CHAT_START_ID, *TOKENIZER.encode("assistant\n", add_bos=False)]

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        ids = [TOKENIZER.bos_id]
        if tools:
            ids += self._message(self._tools_message(tools))
        for m in messages:
            ids += self._message(m)
        return ids + self._generation_prompt()

    def delta(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        ids: list[int] = []
        for m in messages:
            ids += self._message(m)
        return ids + self._generation_prompt()

    def closing(self, sampled: list[int]) -> list[int]:
        nl = TOKENIZER.encode("\n", add_bos=False)
        return nl if sampled and sampled[-1] == TOKENIZER.eos_id else [TOKENIZER.eos_id, *nl]

    def encode(self, text: str) -> list[int]:
        return TOKENIZER.encode(text, add_bos=False)

    def decode(self, ids: list[int]) -> str:
        out: list[str] = []
        run: list[int] = []
        for i in ids:
            if i in (TOOL_CALL_ID, TOOL_CALL_END_ID):
                out.append(TOKENIZER.decode(run))
                run = []
                out.append("<tool_call>" if i == TOOL_CALL_ID else "</tool_call>")
            else:
                run.append(i)
        out.append(TOKENIZER.decode(run))
        return "".join(out)

    def answer(self, sampled: list[int]) -> Answer:
        body = sampled[:-1] if sampled and sampled[-1] in self.stop_ids else sampled
        text = self.decode(body)
        content, calls = parse_tool_calls(text)
        return Answer(content, calls, text)


# ---------------------------------------------------------------- Hugging Face tokenizers
class HFChatFormat:
    """A `transformers` tokenizer with a chat template (Qwen / ChatML, Hermes tool calls)."""

    _BASE: ClassVar[list[dict[str, Any]]] = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]

    def __init__(self, tokenizer: Any, name: str = "hf") -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template")
        self.tok = tokenizer
        self.name = name
        self.vocab_size = len(tokenizer)
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the tokenizer has no eos token (the end of an assistant turn)")
        self.eos_id = int(eos)
        self.stop_ids = frozenset({self.eos_id})
        base = self._text(self._BASE, None, generation=False)
        eos_text = tokenizer.eos_token
        cut = base.rfind(eos_text)
        if cut < 0:
            raise ValueError(f"the chat template does not end an assistant turn with {eos_text!r}")
        self._closing_text = base[cut + len(eos_text) :]  # e.g. "\n" after <|im_end|>

    @classmethod
    def from_dir(cls, path: str | Path) -> HFChatFormat:
        # the process's one copy of the directory's tokenizer (the engines and environments share it)
        return cls(hf_tokenizer(str(path)), name=Path(path).name)

    def _text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *, generation: bool) -> str:
        try:
            return self.tok.apply_chat_template(
                _arguments_as_objects(messages), tools=tools or None, tokenize=False, add_generation_prompt=generation
            )
        except Exception as exc:  # jinja2 errors (raise_exception in the template, a bad message shape)
            raise TemplateError(f"the chat template cannot render these messages: {exc}") from None

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        return self.encode(self._text(messages, tools, generation=True))

    def delta(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int] | None:
        base = self._text(self._BASE, tools, generation=False)
        full = self._text(self._BASE + messages, tools, generation=True)
        if not full.startswith(base):  # the template renders earlier turns differently once more follow
            return None
        return self.encode(full[len(base) :])

    def closing(self, sampled: list[int]) -> list[int]:
        tail = self.encode(self._closing_text) if self._closing_text else []
        return tail if sampled and sampled[-1] == self.eos_id else [self.eos_id, *tail]

    def answer(self, sampled: list[int]) -> Answer:
        body = sampled[:-1] if sampled and sampled[-1] in self.stop_ids else sampled
        text = self.tok.decode(body, skip_special_tokens=False)
        special = [t for t in (self.tok.all_special_tokens or []) if t not in ("<tool_call>", "</tool_call>")]
        for t in special:
            text = text.replace(t, "")
        content, calls = parse_tool_calls(text)
        return Answer(content, calls, text)


def load_format(model: str) -> ChatFormat:
    """The chat format of a job's `model`: the tiny model's byte template, or the tokenizer of a local
    `save_pretrained` directory."""
    if is_builtin(model):
        return ByteChatFormat()
    return HFChatFormat.from_dir(model)
