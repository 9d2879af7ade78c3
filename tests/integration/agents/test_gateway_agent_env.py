"""External agents as PEARL environments (`environment: agent`): the example agents (official openai SDK)
run as subprocesses or Python functions against the gateway, and a driver-shaped loop samples every turn
on a real torch engine worker, as the rollout driver does (reset → generate → observe → step)."""

from __future__ import annotations

import asyncio
import os
import sys

import orjson
import pytest
from aiohttp import ClientSession

from agents.envs.agent import AgentEnvironment, AgentFailed, AgentRunner, SpecError, configure, validate_spec
from agents.process import REPO_ROOT
from tests.support.gateway import SECRET, start_worker

EXAMPLES = REPO_ROOT / "examples" / "agents"
TASKS = [{"a": 1, "b": 2}, {"a": 3, "b": 4}]


@pytest.fixture
async def worker():
    runner, url, _ = await start_worker("torch")
    async with ClientSession() as http:
        yield url, http
    await runner.cleanup()


async def drive(env: AgentEnvironment, worker: str, http: ClientSession, seed: int = 0) -> tuple[list, float]:
    """The rollout driver's part: sample each turn after the context, hand it to the environment."""
    turn = await env.reset()
    context = list(turn.observation)
    sampled = []
    for n in range(16):
        body = {
            "request_id": f"drv-{seed}-{n}",
            "prompt_tokens": context,
            "sampling": {
                "max_tokens": turn.max_tokens,
                "temperature": 1.0,
                "seed": seed * 100 + n,
                "stop_at_eos": env.stop_at_eos,
            },
        }
        async with http.post(
            f"{worker}/generate", data=orjson.dumps(body), headers={"Authorization": f"Bearer {SECRET}"}
        ) as r:
            res = await r.json()
        sampled.append((list(context), res["tokens"], res["logprobs"]))
        env.observe(res["logprobs"], res["weight_version"], [res["worker_id"]])
        turn = await env.step(res["tokens"])
        replaced = env.take_context()
        context = replaced if replaced is not None else context + res["tokens"] + list(turn.observation)
        if turn.done:
            return sampled, turn.reward
    raise AssertionError("the agent did not finish")


def runner_for(**spec) -> AgentRunner:
    return configure(validate_spec({"tasks": TASKS, "agent_timeout_s": 60, **spec}))


async def test_calculator_agent_subprocess_trains_on_exactly_what_the_engine_sampled(worker):
    url, http = worker
    r = runner_for(agent_command=[sys.executable, str(EXAMPLES / "calculator_agent.py")])
    try:
        env = r.env(task=0, member=0)
        sampled, reward = await drive(env, url, http, seed=1)
        rec = r.records[env.trajectory]
        assert rec["status"] == "done" and rec["reward"] == reward and r.done == 1
        assert 0.0 <= reward <= 1.0
        sample = rec["samples"][-1]
        # every sampled turn is in the record token for token, with its log-probs, under mask 1
        toks, mask, lps = sample["tokens"], sample["mask"], sample["logprobs"]
        assert rec["forks"] == 0 and len(sample["weight_versions"]) == len(sampled)
        for ctx, gen, glp in sampled:
            gen = gen[: gen.index(257) + 1] if 257 in gen else gen
            assert toks[len(ctx) : len(ctx) + len(gen)] == gen
            assert mask[len(ctx) : len(ctx) + len(gen)] == [1] * len(gen)
            assert lps[len(ctx) : len(ctx) + len(gen)] == pytest.approx(glp[: len(gen)])
        assert sum(mask) == sum(min(len(g), (g.index(257) + 1) if 257 in g else len(g)) for _, g, _ in sampled)
        assert env.session is not None and r.gateway.sessions.get(env.session.key) is None  # the key expired
    finally:
        await r.stop()


async def test_reward_posted_to_the_reward_url(worker, tmp_path):
    url, http = worker
    agent = tmp_path / "poster.py"
    agent.write_text(
        "import json, os, urllib.request\nfrom openai import OpenAI\n"
        "c = OpenAI(max_retries=0)\n"
        "c.chat.completions.create(model='tiny', messages=[{'role': 'user', 'content': os.environ['PEARL_TASK']}],"
        " max_tokens=3)\n"
        "req = urllib.request.Request(os.environ['PEARL_REWARD_URL'], data=b'{\"reward\": 0.75}',"
        " headers={'Content-Type': 'application/json'})\n"
        "urllib.request.urlopen(req).read()\nprint('not a reward line')\n"
    )
    r = runner_for(agent_command=[sys.executable, str(agent)], agent_workdir=str(tmp_path))
    try:
        _, reward = await drive(r.env(task=1), url, http)
        assert reward == 0.75
    finally:
        await r.stop()


@pytest.mark.parametrize(
    "script,reason",
    [
        ("import sys\nsys.stderr.write('boom: the tool crashed\\n')\nsys.exit(3)", "before its first request"),
        (
            "from openai import OpenAI\nOpenAI(max_retries=0).chat.completions.create(model='t', "
            "messages=[{'role': 'user', 'content': 'x'}], max_tokens=2)\n"
            "import sys\nsys.stderr.write('boom: the tool crashed\\n')\nsys.exit(3)",
            "exited with status 3",
        ),
        (
            "from openai import OpenAI\nOpenAI(max_retries=0).chat.completions.create(model='t', "
            "messages=[{'role': 'user', 'content': 'x'}], max_tokens=2)\nprint('done, no reward')",
            "without a reward",
        ),
    ],
)
async def test_a_failed_agent_is_a_failed_trajectory_with_its_stderr_tail(worker, tmp_path, script, reason):
    url, http = worker
    (tmp_path / "agent.py").write_text(script)
    r = runner_for(agent_command=[sys.executable, "agent.py"], agent_workdir=str(tmp_path))
    try:
        env = r.env(task=0)
        with pytest.raises(AgentFailed, match=reason) as err:
            await drive(env, url, http)
        if "status" in reason or "first" in reason:
            assert "boom: the tool crashed" in err.value.stderr_tail
        assert r.failed == 1 and r.records[env.trajectory]["status"] == "failed"
        assert r.records[env.trajectory]["reason"] == err.value.reason
    finally:
        await r.stop()


async def test_a_slow_agent_is_ended_at_the_wall_clock_limit(worker, tmp_path):
    url, http = worker
    (tmp_path / "slow.py").write_text("import os, time\nopen('pid', 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    r = configure(
        validate_spec(
            {
                "tasks": TASKS,
                "agent_command": [sys.executable, "slow.py"],
                "agent_workdir": str(tmp_path),
                "agent_timeout_s": 1.0,
            }
        )
    )
    try:
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(AgentFailed, match="wall-clock limit"):
            await drive(r.env(task=0), url, http)
        assert asyncio.get_running_loop().time() - t0 < 10
        pid = int((tmp_path / "pid").read_text())
        await asyncio.sleep(0.2)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # its process group was ended
    finally:
        await r.stop()


async def test_an_aborted_trajectory_ends_its_agent(worker, tmp_path):
    """The driver cancels a trajectory (staleness, job stop): the agent's process group is ended."""
    _url, _http = worker
    r = runner_for(agent_command=[sys.executable, str(EXAMPLES / "calculator_agent.py")])
    try:
        env = r.env(task=0)
        await env.reset()
        assert env.proc is not None and env.proc.returncode is None
        await r.stop()  # the job stops
        assert env.proc.returncode is not None and env.status == "aborted"
        assert r.records[env.trajectory]["reason"] == "the job stopped"
    finally:
        await r.stop()


@pytest.mark.parametrize("isolation", ["process", "inline"])
async def test_tool_agent_as_a_python_function(worker, monkeypatch, isolation):
    url, http = worker
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    r = runner_for(agent_function="examples.agents.tool_agent:run", agent_isolation=isolation)
    try:
        env = r.env(task=1)
        sampled, reward = await drive(env, url, http)
        assert reward in (0.0, 0.2, 1.0) and len(sampled) >= 1
        rec = r.records[env.trajectory]
        assert rec["status"] == "done" and rec["messages"][0]["content"].startswith("What is 3+4?")
        prompt = rec["samples"][0]["tokens"][: rec["samples"][0]["prompt_len"]]
        assert "# Tools" in r.fmt.decode(prompt) and '"name":"add"' in r.fmt.decode(prompt)  # tools templated in
        assert (r.pool is not None and r.pool.started == 1) == (isolation == "process")
    finally:
        await r.stop()


async def test_bounded_concurrency_holds_agents_back_before_their_sessions_start(worker):
    url, http = worker
    r = runner_for(agent_command=[sys.executable, str(EXAMPLES / "calculator_agent.py")], agent_concurrency=2)
    try:
        results = await asyncio.gather(*(drive(r.env(task=i, member=i), url, http, seed=i) for i in range(5)))
        assert len(results) == 5 and r.done == 5
    finally:
        await r.stop()


@pytest.mark.parametrize(
    "spec,field",
    [
        ({"tasks": TASKS}, "agent_command"),
        ({"tasks": TASKS, "agent_command": "python a.py"}, "agent_command"),
        ({"tasks": TASKS, "agent_command": ["x"], "agent_function": "m:f"}, "agent_command"),
        ({"tasks": TASKS, "agent_function": "nocolon"}, "agent_function"),
        ({"agent_command": ["x"]}, "tasks"),
        ({"agent_command": ["x"], "tasks": "/nonexistent/tasks.jsonl"}, "tasks"),
        ({"agent_command": ["x"], "tasks": []}, "tasks"),
        ({"agent_command": ["x"], "tasks": [1, 2]}, "tasks"),
        ({"agent_command": ["x"], "tasks": TASKS, "agent_workdir": "/nonexistent"}, "agent_workdir"),
        ({"agent_command": ["x"], "tasks": TASKS, "agent_timeout_s": 0}, "agent_timeout_s"),
        ({"agent_command": ["x"], "tasks": TASKS, "agent_concurrency": 0}, "agent_concurrency"),
    ],
)
def test_spec_validation_names_the_field(spec, field):
    with pytest.raises(SpecError) as err:
        validate_spec(spec)
    assert err.value.field == field


def test_tasks_from_a_jsonl_file(tmp_path):
    spec = validate_spec({"agent_command": ["x"], "tasks": str(EXAMPLES / "tasks.jsonl")})
    assert spec.tasks[0] == {"a": 1, "b": 2} and len(spec.tasks) == 8
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\nnot json\n')
    with pytest.raises(SpecError, match="line 2"):
        validate_spec({"agent_command": ["x"], "tasks": "bad.jsonl", "agent_workdir": str(tmp_path)})
