"""A small REST client over urllib: server URL and token from the environment or a config file, and
errors a person can act on (ApiError carries the API's {"error", "field", "detail"})."""

from __future__ import annotations

import json
import os
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"


def config_path() -> Path:
    if os.environ.get("PEARL_CONFIG"):
        return Path(os.environ["PEARL_CONFIG"])
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "pearl" / "config.toml"


class CliError(Exception):
    """Something the user can fix; `code` is the process exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message, self.code = message, code


class ApiError(CliError):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.body = status, body
        self.field = body.get("field")
        detail = str(body.get("detail") or body)
        super().__init__(
            f"{self.field}: {detail}" if self.field and not detail.startswith(f"{self.field}:") else detail, 1
        )


@dataclass
class Settings:
    url: str
    token: str
    source: str


def load_settings(url: str | None = None, token: str | None = None) -> Settings:
    """Flags win, then PEARL_URL / PEARL_TOKEN, then the config file (`pearl configure` writes it)."""
    file: dict[str, Any] = {}
    path = config_path()
    if path.exists():
        try:
            file = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, OSError) as exc:
            raise CliError(f"cannot read {path}: {exc}", 2) from None
    u = url or os.environ.get("PEARL_URL") or file.get("url") or DEFAULT_URL
    t = token or os.environ.get("PEARL_TOKEN") or file.get("token") or ""
    return Settings(url=str(u).rstrip("/"), token=str(t), source=str(path) if file else "environment")


def save_settings(url: str, token: str) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"url = {json.dumps(url)}\ntoken = {json.dumps(token)}\n")
    return path


class Client:
    def __init__(self, settings: Settings, timeout: float = 30.0) -> None:
        self.s, self.timeout = settings, timeout

    def request(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> Any:
        url = self.s.url + path
        if params:
            url += "?" + urllib.parse.urlencode({k: v for k, v in params.items() if v is not None and v != ""})
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.s.token:
            headers["Authorization"] = f"Token {self.s.token}"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as res:
                raw = res.read()
                return json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                payload = json.loads(raw) if raw else {}
            except ValueError:
                payload = {"detail": raw.decode(errors="replace")[:300] or e.reason}
            if not isinstance(payload, dict):
                payload = {"detail": str(payload)}
            if e.code == 401:
                raise CliError(
                    f"the server at {self.s.url} refused the token ({payload.get('detail', 'unauthorized')}). "
                    "Set PEARL_TOKEN or run `pearl configure --token ...`; "
                    "`manage.py create_api_user NAME` prints a token.",
                    1,
                ) from None
            if e.code == 403:
                raise CliError(
                    f"forbidden: {payload.get('detail', '')} (changes need an operator: "
                    "`manage.py create_api_user NAME` makes one)",
                    1,
                ) from None
            raise ApiError(e.code, payload) from None
        except urllib.error.URLError as e:
            raise CliError(
                f"cannot reach the control plane at {self.s.url} ({e.reason}); "
                "set PEARL_URL or run `pearl configure --url ...`",
                3,
            ) from None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body)

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body)

    def job_id(self, ref: str) -> int:
        """A job by id or name."""
        if ref.isdigit():
            return int(ref)
        found = self.get("/api/jobs/", name=ref)["results"]
        if not found:
            raise CliError(f"no job named {ref!r} (`pearl list` shows the jobs)")
        return int(found[0]["id"])

    def node_id(self, ref: str) -> int:
        if ref.isdigit():
            return int(ref)
        found = self.get("/api/nodes/", name=ref)["results"]
        if not found:
            raise CliError(f"no node named {ref!r} (`pearl nodes` shows the nodes)")
        return int(found[0]["id"])
