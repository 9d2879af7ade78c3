"""A calculator agent written against the official `openai` SDK, runnable unmodified against any
OpenAI-compatible server (PEARL's gateway, vLLM, a hosted API): it reads only OPENAI_BASE_URL,
OPENAI_API_KEY (and optionally OPENAI_MODEL), plus its task.

The task is "a+b?" (PEARL_TASK = {"a": 2, "b": 3}; random when unset). A one-character answer that is a
lowercase letter calls the calculator, which answers "=c"; the next answer is the result. Reward as
PEARL's built-in calculator: 0.1 for using the tool, up to 0.4 for a digit close to c, 0.5 for c itself.
The reward goes to PEARL_REWARD_URL when set, and is always printed as the last stdout line.

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=... python examples/agents/calculator_agent.py

The same agent as a Python function for `agent_function: "examples.agents.calculator_agent:run"` (no process
per trajectory): `run(client, task)` with an `openai.AsyncOpenAI` client, returning the reward.
"""

from __future__ import annotations

import json
import os
import random
import urllib.request
from typing import Any

from openai import AsyncOpenAI, OpenAI


def score(answer: str, result: int, called: bool) -> float:
    r = 0.1 if called else 0.0
    if len(answer) == 1 and answer.isdigit():
        r += 0.4 * (1.0 - abs(int(answer) - result) / 9.0)
        if int(answer) == result:
            r += 0.5
    return r


async def run(client: AsyncOpenAI, task: dict[str, Any]) -> float:
    """The agent's loop with an async client (as `main`, which runs it with a sync one)."""
    a, b = int(task["a"]), int(task["b"])
    messages: list[Any] = [{"role": "user", "content": f"{a}+{b}?"}]
    called, answer = False, ""
    for _ in range(3):
        out = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=1)
        answer = (out.choices[0].message.content or "").strip()
        messages.append({"role": "assistant", "content": out.choices[0].message.content or ""})
        if len(answer) == 1 and answer.islower() and not called:
            called = True
            messages.append({"role": "user", "content": f"={a + b}"})
            continue
        break
    return score(answer, a + b, called)


def main() -> None:
    task = json.loads(os.environ.get("PEARL_TASK") or "{}")
    a = int(task.get("a", random.randint(0, 9)))
    b = int(task.get("b", random.randint(0, 9 - a)))
    client = OpenAI(max_retries=0)  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
    model = os.environ.get("OPENAI_MODEL") or client.models.list().data[0].id
    messages: list[Any] = [{"role": "user", "content": f"{a}+{b}?"}]
    called, answer = False, ""
    for _ in range(3):
        out = client.chat.completions.create(model=model, messages=messages, max_tokens=1)
        answer = (out.choices[0].message.content or "").strip()
        messages.append({"role": "assistant", "content": out.choices[0].message.content or ""})
        if len(answer) == 1 and answer.islower() and not called:
            called = True
            messages.append({"role": "user", "content": f"={a + b}"})
            continue
        break
    reward = score(answer, a + b, called)
    if os.environ.get("PEARL_REWARD_URL"):
        req = urllib.request.Request(
            os.environ["PEARL_REWARD_URL"],
            data=json.dumps({"reward": reward}).encode(),
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', '')}",
            },
        )
        urllib.request.urlopen(req, timeout=30).read()
    print(json.dumps({"reward": reward}))


if __name__ == "__main__":
    main()
