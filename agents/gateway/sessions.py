"""Sessions: one per trajectory, bound to the agent by a random key (path `/sessions/<key>/v1` or Bearer).

Why keys and not trajectory ids: the agent is outside PEARL; whatever reaches the gateway with a key
acts for that one trajectory only, and nothing else. A key expires with its trajectory (closed) or
after `ttl_s` without a request; an unknown or expired key is a 401.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from agents.gateway.tokens import TrajectoryTokens


class Full(RuntimeError):
    """No session can start now (admission bound): 429 with Retry-After, before the session starts only."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__("too many sessions; retry later")
        self.retry_after_s = retry_after_s


@dataclass
class TurnRecord:
    """One request of the agent, as shown in the trajectory browser."""

    messages: int  # messages in the request
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    weight_version: int
    workers: list[int]
    latency_s: float
    fork: bool


@dataclass
class Session:
    key: str
    trajectory: str
    task: Any = None
    expires_at: float = 0.0
    ttl_s: float = 3600.0
    tokens: TrajectoryTokens = field(default_factory=TrajectoryTokens)
    turns: list[TurnRecord] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the latest request's, plus its answer
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False
    reward: float | None = None
    reward_event: asyncio.Event = field(default_factory=asyncio.Event)
    backend_state: Any = None  # what the backend keeps per session (the worker it sticks to, the env bridge)

    def touch(self) -> None:
        self.expires_at = time.monotonic() + self.ttl_s

    def set_reward(self, reward: float) -> None:
        self.reward = self.tokens.reward = float(reward)
        self.reward_event.set()

    def record(self) -> dict[str, Any]:
        """The trajectory's record: its token samples, forks, reward, turns."""
        return self.tokens.to_json() | {
            "trajectory": self.trajectory,
            "turn_log": [t.__dict__ for t in self.turns],
            "messages": self.messages,
        }


class SessionStore:
    """The open sessions of one gateway; `max_sessions` bounds how many may be open at once."""

    def __init__(self, *, max_sessions: int = 4096, ttl_s: float = 3600.0, retry_after_s: float = 1.0) -> None:
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self.retry_after_s = retry_after_s
        self._by_key: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def open(self, trajectory: str, task: Any = None, *, ttl_s: float | None = None) -> Session:
        self.expire()
        if len(self._by_key) >= self.max_sessions:
            raise Full(self.retry_after_s)
        s = Session(
            key="sk-pearl-" + secrets.token_urlsafe(24),
            trajectory=trajectory,
            task=task,
            ttl_s=self.ttl_s if ttl_s is None else ttl_s,
        )
        s.touch()
        self._by_key[s.key] = s
        return s

    def get(self, key: str) -> Session | None:
        s = self._by_key.get(key)
        if s is None:
            return None
        if s.closed or s.expires_at < time.monotonic():
            self.close(key)
            return None
        return s

    def close(self, key: str) -> Session | None:
        s = self._by_key.pop(key, None)
        if s is not None:
            s.closed = True
        return s

    def expire(self) -> None:
        now = time.monotonic()
        for k in [k for k, s in self._by_key.items() if s.expires_at < now]:
            self.close(k)
