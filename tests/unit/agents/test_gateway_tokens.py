"""The gateway's token accounting (agents.gateway.tokens): pure, no I/O."""

from __future__ import annotations

from typing import Any

import pytest

from agents.gateway.tokens import PROMPT, SAMPLED, Sample, TrajectoryTokens, canonical

USER = {"role": "user", "content": "2+3?"}


def answer(text: str | None, calls: list | None = None) -> dict:
    m: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        m["tool_calls"] = calls
    return m


def test_first_request_starts_the_first_sample_without_counting_a_fork():
    t = TrajectoryTokens()
    plan = t.plan([USER])
    assert plan.fork and plan.new_messages == [USER]
    assert t.begin(plan, [1, 2, 3], [USER]) == [1, 2, 3]
    assert t.forks == 0 and len(t.samples) == 1


def test_extending_appends_only_the_new_template_tokens_after_the_sampled_ids():
    t = TrajectoryTokens()
    t.begin(t.plan([USER]), [1, 2, 3], [USER])
    t.sampled([7, 8], [-0.5, -0.25], answer("ab"), weight_version=4, workers=[2], latency_s=0.1, closing=[9])
    msgs = [USER, answer("ab"), {"role": "tool", "tool_call_id": "c1", "content": "5"}]
    plan = t.plan(msgs)
    assert not plan.fork and plan.new_messages == msgs[2:]
    prompt = t.begin(plan, [10, 11], msgs)
    assert prompt == [1, 2, 3, 7, 8, 9, 10, 11]  # the sampled ids as sampled, never re-tokenized
    t.sampled([12], [-1.0], answer("5"), weight_version=5, workers=[3, 1])  # resumed on worker 1
    s = t.current
    assert s.tokens == [1, 2, 3, 7, 8, 9, 10, 11, 12]
    assert s.mask == [PROMPT] * 3 + [SAMPLED] * 2 + [PROMPT] * 3 + [SAMPLED]
    assert s.logprobs == [0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0, 0.0, -1.0]
    assert s.prompt_len == 3 and s.turns == 2
    j = s.to_json()
    assert j["weight_versions"] == [4, 5] and j["workers"] == [[2], [3, 1]]  # per turn, every worker that served it
    assert t.forks == 0


def test_rewritten_history_forks_a_new_sample_and_counts_it():
    t = TrajectoryTokens()
    t.begin(t.plan([USER]), [1, 2], [USER])
    t.sampled([7], [-0.1], answer("x"), weight_version=1)
    edited = [USER, answer("something else"), {"role": "user", "content": "go on"}]
    plan = t.plan(edited)
    assert plan.fork and plan.new_messages == edited
    assert t.begin(plan, [1, 2, 5, 6], edited) == [1, 2, 5, 6]
    assert t.forks == 1 and len(t.samples) == 2
    assert t.samples[0].tokens == [1, 2, 7]  # the first sample is kept as it was


@pytest.mark.parametrize(
    "msgs",
    [
        [USER],  # the same request again (a retry): a new sample, not an extension by nothing
        [{"role": "user", "content": "other"}, answer("x"), USER],  # the first message changed
        [{"role": "system", "content": "compacted"}],  # compaction: shorter than what is held
    ],
)
def test_anything_but_a_strict_extension_forks(msgs):
    t = TrajectoryTokens()
    t.begin(t.plan([USER]), [1], [USER])
    t.sampled([7], [-0.1], answer("x"), weight_version=1)
    assert t.plan(msgs).fork


def test_changed_tools_fork():
    t = TrajectoryTokens()
    t.begin(t.plan([USER], "tools-a"), [1], [USER], "tools-a")
    t.sampled([7], [-0.1], answer("x"), weight_version=1)
    msgs = [USER, answer("x"), {"role": "user", "content": "more"}]
    assert not t.plan(msgs, "tools-a").fork
    assert t.plan(msgs, "tools-b").fork


def test_the_agent_echoing_our_tool_calls_with_its_own_formatting_still_extends():
    """Call ids, key order, arguments re-serialised, None vs "" content: the same message."""
    ours = answer(
        None, [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]
    )
    echoed = {
        "content": "",
        "role": "assistant",
        "tool_calls": [{"type": "function", "id": "call_1", "function": {"arguments": '{"b":2,"a":1}', "name": "add"}}],
    }
    assert canonical(ours) == canonical(echoed)
    other = {**echoed, "tool_calls": [{"type": "function", "function": {"arguments": '{"b":3,"a":1}', "name": "add"}}]}
    assert canonical(ours) != canonical(other)
    assert canonical({"role": "user", "content": [{"type": "text", "text": "hi"}]}) == canonical(
        {"role": "user", "content": "hi"}
    )


def test_template_tokens_carry_no_logprobs_and_counts_must_match():
    s = Sample()
    with pytest.raises(ValueError):
        s.append([1, 2], sampled=True, logprobs=[-1.0])
    with pytest.raises(ValueError):
        s.append([1], sampled=False, logprobs=[-1.0])
    with pytest.raises(ValueError):
        TrajectoryTokens().sampled([1], [-1.0], answer("x"), weight_version=0)


def test_record_has_reward_forks_and_turns():
    t = TrajectoryTokens()
    t.begin(t.plan([USER]), [1], [USER])
    t.sampled([7], [-0.1], answer("x"), weight_version=1, latency_s=0.25)
    t.reward = 0.5
    j = t.to_json()
    assert j["reward"] == 0.5 and j["forks"] == 0 and j["turns"] == 1
    assert j["samples"][0]["latency_s"] == [0.25]


def test_agent_spec_validation_in_core_is_pure_and_names_the_field():
    """What the control plane runs at submission: no file access unless it passes a reader."""
    from controlplane.core.agent_spec import SpecError, validate_agent_spec

    spec = validate_agent_spec({"agent_command": ["python", "a.py"], "tasks": "tasks.jsonl"})
    assert spec.tasks == () and spec.command == ("python", "a.py")  # a path, unread
    files = {"w/tasks.jsonl": '{"a": 1}\n\n{"a": 2}\n'}

    def read(path: str) -> str:
        if path not in files:
            raise FileNotFoundError(path)
        return files[path]

    spec = validate_agent_spec(
        {"agent_function": "m:f", "tasks": "tasks.jsonl", "agent_workdir": "w"},
        read_file=read,
        is_dir=lambda p: p == "w",
    )
    assert spec.tasks == ({"a": 1}, {"a": 2}) and spec.function == "m:f"
    with pytest.raises(SpecError) as err:
        validate_agent_spec({"agent_command": ["x"], "tasks": "missing.jsonl"}, read_file=read)
    assert err.value.field == "tasks"
    with pytest.raises(SpecError) as err:
        validate_agent_spec({"agent_command": ["x"], "tasks": [{}], "agent_workdir": "nope"}, is_dir=lambda p: False)
    assert err.value.field == "agent_workdir"
