#!/usr/bin/env bash
# Run the whole test suite with its own Redis on a private port; PostgreSQL when one answers on
# 127.0.0.1:5432 (the row-lock tests need it), else SQLite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PEARL_TEST_REDIS_PORT:-6391}
dir=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
  --pidfile "$dir/redis.pid" --dir "$dir" --logfile "$dir/redis.log"
cleanup() { redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
export REDIS_URL="redis://127.0.0.1:$PORT" PEARL_TESTING=1 DEBUG=0
if [[ -z "${DATABASE_URL:-}" ]] && .venv/bin/python - <<'PY' 2>/dev/null
import psycopg
psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", connect_timeout=2).close()
PY
then
  export DATABASE_URL="postgres://postgres@127.0.0.1:5432/test"
fi
echo "tests: database ${DATABASE_URL:-sqlite (default)}, redis $REDIS_URL"
set +e
.venv/bin/python -m pytest -p no:cacheprovider --durations=20 "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then echo "no tests ran" >&2; exit 1; fi
exit $rc
