"""A multi-turn tool-use task with a checkable answer, small enough for the tiny torch model to learn.

The question is "a+b?" (one-digit result). The policy may call the calculator — any lowercase
letter as its turn — and gets "=c" back; its next turn is the answer. Reward: 0.1 for using the
tool, up to 0.4 for a digit close to c (1 − |answer − c|/9), and 0.5 for c itself. A random policy
scores about 0.02; using the tool and answering digits is found within tens of GRPO steps, copying
the tool's result takes longer (BENCHMARKS.md has the measured curve).
"""

from __future__ import annotations

import random

from agents.envs.base import Environment, Turn, register, text
from agents.tokenizer import TOKENIZER

W_TOOL, W_CLOSE, W_CORRECT = 0.1, 0.4, 0.5
MAX_TURNS = 3


def _is_call(tok: int) -> bool:
    return 97 <= tok <= 122  # a lowercase letter


class Calculator(Environment):
    temperature = 1.0

    def __init__(self, *, task: int, seed: int = 0, **_: object) -> None:
        rng = random.Random(seed * 1_000_003 + task)
        self.a = rng.randint(0, 9)
        self.b = rng.randint(0, 9 - self.a)
        self.result = self.a + self.b
        self.called = False
        self.turns = 0

    async def reset(self) -> Turn:
        return Turn([TOKENIZER.bos_id, *text(f"{self.a}+{self.b}?")], max_tokens=1)

    async def step(self, response: list[int]) -> Turn:
        self.turns += 1
        tok = response[0] if response else -1
        if _is_call(tok) and not self.called and self.turns < MAX_TURNS:
            self.called = True
            return Turn(text(f"={self.result}"), max_tokens=1)
        return Turn(
            [],
            done=True,
            reward=self.score(tok),
            info={"correct": float(tok == 48 + self.result), "tool_used": float(self.called)},
        )

    def score(self, tok: int) -> float:
        r = W_TOOL if self.called else 0.0
        if 48 <= tok <= 57:
            r += W_CLOSE * (1.0 - abs(tok - 48 - self.result) / 9.0)
            if tok - 48 == self.result:
                r += W_CORRECT
        return r


register("calculator", Calculator)
