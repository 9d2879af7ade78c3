"""The database connection settings a deployment gets (pearl_site/settings.py), read in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
READ = (
    "import django, json; from django.conf import settings; django.setup(); "
    "d = settings.DATABASES['default']; print(json.dumps([d['CONN_MAX_AGE'], d['CONN_HEALTH_CHECKS']]))"
)


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"DATABASE_URL": "postgres://u@127.0.0.1:5432/pearl"}, [60, True]),  # persistent: no connect per hop
        ({"DATABASE_URL": "postgres://u@127.0.0.1:5432/pearl", "PEARL_DB_CONN_MAX_AGE": "0"}, [0, True]),
        ({"DATABASE_URL": "postgres://u@127.0.0.1:5432/pearl", "PEARL_TESTING": "1"}, [0, True]),
        ({}, [0, True]),  # SQLite: a connection per request
    ],
)
def test_postgres_connections_persist_outside_tests(tmp_path, env, expected):
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PEARL_TESTING", "PEARL_DB_CONN_MAX_AGE")}
    r = subprocess.run(
        [sys.executable, "-c", READ],
        cwd=ROOT,
        env=base | env | {"PEARL_VAR_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "pearl_site.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == expected
