"""The `environment: agent` fields of a job spec (bring your own agent, issue 19), validated the same way
at submission (the control plane: a 400 naming the field) and in the rollout driver that runs the agents.

Pure: file access is the caller's (`read_file`, `is_dir`), so the control plane checks the task file it
can see and the driver loads it where the agents run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_TASKS = 1 << 20
AGENT_FIELDS = (
    "agent_command",
    "agent_function",
    "agent_workdir",
    "tasks",
    "agent_timeout_s",
    "agent_concurrency",
    "agent_max_attempts",
    "agent_isolation",
    "agent_processes",
)
ISOLATIONS = ("process", "inline")  # agent_function: in a pool of worker processes (default) or on the driver's loop
MAX_PROCESSES = 256


class SpecError(ValueError):
    """A bad agent spec (→ 400 naming `field`)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True, slots=True)
class AgentSpec:
    tasks: tuple[dict[str, Any], ...]
    command: tuple[str, ...] = ()
    function: str = ""
    workdir: str = ""
    timeout_s: float = 600.0
    concurrency: int = 64
    max_attempts: int = 3  # failed runs per group member before its failure is final (not resampled again)
    isolation: str = "process"  # agent_function: "process" (a worker pool, off the driver's core) or "inline"
    processes: int = 0  # the pool's processes at most (0: the driver picks, bounded by `concurrency`)
    model: str = "tiny"
    host: str = "127.0.0.1"
    port: int = 0


def parse_tasks(
    tasks: Any, *, read_file: Callable[[str], str] | None = None, workdir: str = ""
) -> tuple[dict[str, Any], ...]:
    """An inline list of JSON objects, or a JSONL file path (relative to `workdir`) read with `read_file`
    (which raises OSError or ValueError when it cannot); without `read_file` a path is kept unread."""
    if isinstance(tasks, str):
        if read_file is None:
            return ()
        path = tasks if tasks.startswith("/") or not workdir else f"{workdir.rstrip('/')}/{tasks}"
        try:
            lines = read_file(path).splitlines()
        except (OSError, ValueError) as exc:
            raise SpecError("tasks", f"cannot read {tasks!r}: {exc}") from None
        out = []
        for i, line in enumerate(lines, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError as exc:
                    raise SpecError("tasks", f"{tasks!r} line {i} is not JSON: {exc}") from None
        tasks = out
    if not isinstance(tasks, list) or not tasks:
        raise SpecError("tasks", "must be a JSONL file path or a non-empty list of JSON objects")
    if len(tasks) > MAX_TASKS or not all(isinstance(t, dict) for t in tasks):
        raise SpecError("tasks", f"every task must be a JSON object (at most {MAX_TASKS})")
    return tuple(tasks)


def validate_agent_spec(
    spec: dict[str, Any],
    *,
    read_file: Callable[[str], str] | None = None,
    is_dir: Callable[[str], bool] | None = None,
) -> AgentSpec:
    """The agent fields of `spec`, checked (SpecError names the field); the tasks loaded if `read_file`."""
    command, function = spec.get("agent_command"), spec.get("agent_function")
    if command is None and function is None:
        raise SpecError("agent_command", "environment 'agent' needs agent_command (an argv list) or agent_function")
    if command is not None and function is not None:
        raise SpecError("agent_command", "give agent_command or agent_function, not both")
    workdir = spec.get("agent_workdir") or ""
    if not isinstance(workdir, str) or (workdir and is_dir is not None and not is_dir(workdir)):
        raise SpecError("agent_workdir", f"{workdir!r} is not a directory")
    if command is not None and (
        not isinstance(command, list) or not command or not all(isinstance(a, str) and a for a in command)
    ):
        raise SpecError("agent_command", "must be a non-empty list of strings (argv; no shell)")
    if function is not None and (
        not isinstance(function, str) or function.count(":") != 1 or not all(function.split(":"))
    ):
        raise SpecError("agent_function", "must be 'module:function'")
    timeout = spec.get("agent_timeout_s", 600.0)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or not 0 < timeout <= 86400
    ):
        raise SpecError("agent_timeout_s", "must be a number of seconds in (0, 86400]")
    conc = spec.get("agent_concurrency", 64)
    if isinstance(conc, bool) or not isinstance(conc, int) or not 1 <= conc <= 65536:
        raise SpecError("agent_concurrency", "must be an integer in [1, 65536]")
    attempts = spec.get("agent_max_attempts", 3)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 100:
        raise SpecError("agent_max_attempts", "must be an integer in [1, 100]")
    isolation = spec.get("agent_isolation", "process")
    if isolation not in ISOLATIONS:
        raise SpecError("agent_isolation", f"must be one of {', '.join(ISOLATIONS)}")
    if "agent_isolation" in spec and function is None:
        raise SpecError("agent_isolation", "applies to agent_function only (an agent_command is its own process)")
    processes = spec.get("agent_processes", 0)
    if isinstance(processes, bool) or not isinstance(processes, int) or not 0 <= processes <= MAX_PROCESSES:
        raise SpecError("agent_processes", f"must be an integer in [0, {MAX_PROCESSES}] (0: the driver picks)")
    if "tasks" not in spec:
        raise SpecError("tasks", "environment 'agent' needs tasks (a JSONL path or a list of JSON objects)")
    return AgentSpec(
        tasks=parse_tasks(spec["tasks"], read_file=read_file, workdir=workdir),
        command=tuple(command or ()),
        function=function or "",
        workdir=workdir,
        timeout_s=float(timeout),
        concurrency=conc,
        max_attempts=attempts,
        isolation=str(isolation),
        processes=processes,
        model=str(spec.get("model", "tiny")),
    )
