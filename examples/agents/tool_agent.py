"""A tool-calling agent with OpenAI `tools` (official `openai` SDK; runnable against any OpenAI-compatible
server that parses tool calls). It offers an `add` tool, runs the calls the model makes, sends their
results back as `tool` messages, and scores the final answer: 1.0 for the right sum, 0.2 for having
used the tool correctly, else 0. The reward is the last stdout line, {"reward": r}.

As a PEARL job (`environment: agent`, see examples/agents/job.yaml) it also runs as a Python agent:
`agent_function: "examples.agents.tool_agent:run"`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from typing import Any

from openai import AsyncOpenAI

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
MAX_TURNS = 4


def add(a: Any = 0, b: Any = 0, **_: Any) -> str:
    try:
        return str(int(a) + int(b))
    except (TypeError, ValueError):
        return "error: a and b must be integers"


async def run(client: AsyncOpenAI, task: dict[str, Any]) -> float:
    """One episode: returns the reward (PEARL's `agent_function` signature)."""
    a, b = int(task.get("a", 2)), int(task.get("b", 3))
    model = os.environ.get("OPENAI_MODEL") or (await client.models.list()).data[0].id
    messages: list[Any] = [{"role": "user", "content": f"What is {a}+{b}? Use the add tool."}]
    used_tool = False
    for _ in range(MAX_TURNS):
        out = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=48)
        msg = out.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return 1.0 if str(a + b) in (msg.content or "") else (0.2 if used_tool else 0.0)
        for call in msg.tool_calls:
            if call.type != "function":
                continue
            try:
                args = json.loads(call.function.arguments or "{}")
            except ValueError:
                args = {}
            result = add(**args) if call.function.name == "add" and isinstance(args, dict) else "error: unknown tool"
            used_tool = used_tool or result == str(a + b)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.2 if used_tool else 0.0


def main() -> None:
    task = json.loads(os.environ.get("PEARL_TASK") or "{}") or {"a": random.randint(0, 50), "b": random.randint(0, 50)}

    async def episode() -> float:
        async with AsyncOpenAI(max_retries=0) as client:
            return await run(client, task)

    print(json.dumps({"reward": asyncio.run(episode())}))


if __name__ == "__main__":
    main()
