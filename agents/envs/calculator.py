"""A multi-turn tool-use task with a checkable answer, small enough for the tiny torch model to learn.

The question is "a+b?" (one-digit result). The policy may call the calculator — any lowercase
letter as its turn — and gets "=c" back; its next turn is the answer. Reward: 0.1 for using the
tool, up to 0.4 for a digit close to c (1 − |answer − c|/9), and 0.5 for c itself. A random policy
scores about 0.02; using the tool and answering digits is found within tens of GRPO steps, copying
the tool's result takes longer (BENCHMARKS.md has the measured curve).

The tiny model sees raw bytes; a model directory's model sees the question as a user message and the tool's
result as a tool message through its own chat template, and its turn is read as the first character of its
first token's text (a letter calls the tool, a digit answers).
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

from agents.envs.base import Environment, Turn, register, text
from agents.gateway.chat import ChatFormat, load_format
from agents.tokenizer import TOKENIZER, load_tokenizer

W_TOOL, W_CLOSE, W_CORRECT = 0.1, 0.4, 0.5
MAX_TURNS = 3


DIGITS = "0123456789"


def _is_call(c: str) -> bool:
    return "a" <= c <= "z" and len(c) == 1  # a lowercase letter


@lru_cache(maxsize=4)
def _chat(model: str) -> ChatFormat:
    """A model directory's chat format, built once per process (it renders its template to learn its markers)."""
    return load_format(model)


class Calculator(Environment):
    temperature = 1.0

    def __init__(self, *, task: int, seed: int = 0, model: str = "tiny", **_: object) -> None:
        rng = random.Random(seed * 1_000_003 + task)
        self.a = rng.randint(0, 9)
        self.b = rng.randint(0, 9 - self.a)
        self.result = self.a + self.b
        self.called = False
        self.turns = 0
        self.tokenizer = load_tokenizer(model)
        self.chat: ChatFormat | None = None if self.tokenizer is TOKENIZER else _chat(model)

    async def reset(self) -> Turn:
        question = f"{self.a}+{self.b}?"
        if self.chat is not None:
            return Turn(self.chat.render([{"role": "user", "content": question}], None), max_tokens=1)
        return Turn([TOKENIZER.bos_id, *text(question)], max_tokens=1)

    async def step(self, response: list[int]) -> Turn:
        self.turns += 1
        c = self.tokenizer.decode(response[:1]).strip()[:1] if response else ""
        if _is_call(c) and not self.called and self.turns < MAX_TURNS:
            self.called = True
            return Turn(self._tool_result(response), max_tokens=1)
        return Turn(
            [],
            done=True,
            reward=self.score(c),
            info={"correct": float(c == str(self.result)), "tool_used": float(self.called)},
        )

    def snapshot(self) -> dict[str, Any]:
        """All that changes in an episode (the task, a+b, comes from the task and seed)."""
        return {"called": self.called, "turns": self.turns}

    def restore(self, state: dict[str, Any]) -> None:
        self.called, self.turns = bool(state["called"]), int(state["turns"])

    def _tool_result(self, response: list[int]) -> list[int]:
        result = f"={self.result}"
        if self.chat is None:
            return text(result)
        delta = self.chat.delta([{"role": "tool", "content": result}], None)
        return [*self.chat.closing(response), *(delta if delta is not None else self.chat.encode(result))]

    def score(self, c: str) -> float:
        """The reward of answer `c` (the first character of the final turn)."""
        r = W_TOOL if self.called else 0.0
        if len(c) == 1 and c in DIGITS:
            r += W_CLOSE * (1.0 - abs(int(c) - self.result) / 9.0)
            if int(c) == self.result:
                r += W_CORRECT
        return r


register("calculator", Calculator)
