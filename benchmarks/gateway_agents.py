"""Realistic-turn workloads for `bench_gateway_job.py` (issue 19): the same job as a built-in environment and
as an openai-SDK agent (a function, or this file run as a process), so their tokens/s compare like for like.

Three turns of up to `PEARL_BENCH_ANSWER_TOKENS` sampled tokens each (64–256: an answer's length, not the
calculator's one token), a short user message between them; each turn ends at the model's end of sequence
or its budget, under the same rule in both forms (the built-in environment stops at EOS, as an agent's turn
does). The reward is the share of digits in the last answer: cheap, deterministic, the same in both forms.
This file imports only the standard library and `openai` (an agent process pays what a user's would); the
built-in form is `bench_gateway_job.Answers`.

    OPENAI_BASE_URL=... OPENAI_API_KEY=... PEARL_BENCH_ANSWER_TOKENS=128 python benchmarks/gateway_agents.py
"""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any

TURNS = 3
PROMPT = "Explain step by step:"
NEXT = "go on"


def answer_tokens() -> int:
    return int(os.environ.get("PEARL_BENCH_ANSWER_TOKENS", "128"))


def reward_of(answer: str) -> float:
    return sum(c.isdigit() for c in answer) / max(1, len(answer))


async def run(client: Any, task: dict[str, Any]) -> float:
    """The agent function form (`agent_function: "gateway_agents:run"`, benchmarks/ on sys.path)."""
    messages: list[Any] = [{"role": "user", "content": PROMPT}]
    answer = ""
    for i in range(TURNS):
        out = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=answer_tokens())
        answer = out.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": answer})
        if i < TURNS - 1:
            messages.append({"role": "user", "content": NEXT})
    return reward_of(answer)


def main() -> None:
    """The agent process form: the official SDK's sync client, the reward POSTed and printed."""
    from openai import OpenAI

    client = OpenAI(max_retries=0)
    messages: list[Any] = [{"role": "user", "content": PROMPT}]
    answer = ""
    for i in range(TURNS):
        out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=answer_tokens())
        answer = out.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": answer})
        if i < TURNS - 1:
            messages.append({"role": "user", "content": NEXT})
    reward = reward_of(answer)
    if os.environ.get("PEARL_REWARD_URL"):
        req = urllib.request.Request(
            os.environ["PEARL_REWARD_URL"],
            data=json.dumps({"reward": reward}).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"},
        )
        urllib.request.urlopen(req, timeout=30).read()
    print(json.dumps({"reward": reward}))


if __name__ == "__main__":
    main()
