# Everything a fresh machine needs is installed by these targets themselves: python3 and make
# are the only prerequisites. uv (pinned, installed into .tools/) syncs .venv from uv.lock.
# --compile-bytecode: the packages' .pyc files are written once, at install. A host that sets
# PYTHONDONTWRITEBYTECODE (this project's machines do) otherwise compiles every module again
# in every Python process: 10 s to import CrewAI instead of 6, 0.7 s for httpx instead of 0.2,
# in each of the tests' many subprocesses (kill -9 hosts, Ray workers, example runs).
PYTHON ?= python3
UV_VERSION := 0.13.9
UV := .tools/bin/uv
VENV := .venv
export UV_PROJECT_ENVIRONMENT := $(VENV)

.PHONY: demo test docs lint typecheck bench sync clean

$(UV):
	$(PYTHON) -m venv .tools
	.tools/bin/python -m pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"

$(VENV)/.synced: $(UV) pyproject.toml uv.lock Makefile
	$(UV) sync --locked --extra dev --extra microsandbox --extra langgraph --extra crewai --extra mcp --extra postgres --extra ray --extra otel --extra cron --extra egress --extra smolagents --extra ui --extra docs \
		--python $(PYTHON) \
		--compile-bytecode
	touch $@

sync: $(VENV)/.synced

demo: sync
	$(VENV)/bin/ringzero demo

test: sync
	$(VENV)/bin/python -m compileall -q ringzero tests  # this checkout's own modules, for the same reason
	$(VENV)/bin/ruff check ringzero tests benchmarks examples conftest.py
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest --durations=20

docs: sync  # the documentation site, served on 127.0.0.1:8000 as you edit docs/
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

lint: sync
	$(VENV)/bin/ruff check ringzero tests benchmarks examples conftest.py

typecheck: sync
	$(VENV)/bin/mypy

bench: sync
	$(UV) sync --locked --extra dev --extra bench --python $(PYTHON) --inexact --compile-bytecode
	$(VENV)/bin/python benchmarks/run.py executors fork_servers checkpointers llm_syscall_overhead tool_node \
		rate_limited_agents gate_order idle_processes waiting_processes wal_growth finished_processes_memory ptc_tokens context_folding \
		faults monitor_tick egress backend_capabilities resumed_syscalls chat_history sessions ui

clean:
	rm -rf $(VENV) .tools .mypy_cache .pytest_cache .ruff_cache
