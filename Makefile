# Everything a fresh machine needs is installed by these targets themselves: python3 and make
# are the only prerequisites. uv (pinned, installed into .tools/) syncs .venv from uv.lock.
PYTHON ?= python3
UV_VERSION := 0.13.9
UV := .tools/bin/uv
VENV := .venv
export UV_PROJECT_ENVIRONMENT := $(VENV)

.PHONY: demo test lint typecheck bench sync clean

$(UV):
	$(PYTHON) -m venv .tools
	.tools/bin/python -m pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"

$(VENV)/.synced: $(UV) pyproject.toml uv.lock Makefile
	$(UV) sync --locked --extra dev --extra microsandbox --extra langgraph --extra crewai --extra mcp --extra postgres --extra ray --extra otel --python $(PYTHON)
	touch $@

sync: $(VENV)/.synced

demo: sync
	$(VENV)/bin/ringzero demo

test: sync
	$(VENV)/bin/ruff check ringzero tests benchmarks examples
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest --durations=20

lint: sync
	$(VENV)/bin/ruff check ringzero tests benchmarks examples

typecheck: sync
	$(VENV)/bin/mypy

bench: sync
	$(UV) sync --locked --extra dev --extra bench --python $(PYTHON) --inexact
	$(VENV)/bin/python benchmarks/run.py executors fork_servers checkpointers llm_syscall_overhead tool_node \
		rate_limited_agents idle_processes finished_processes_memory ptc_tokens context_folding faults monitor_tick

clean:
	rm -rf $(VENV) .tools .mypy_cache .pytest_cache .ruff_cache
