"""``ringzero demo --ray``, run as a user runs it: a local Ray cluster, a node killed, agents moved."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.postgres import fresh_database
from tests.test_cli import ringzero_cli

pytest.importorskip("ray", reason="the cluster demo needs the 'ray' extra (pip install 'ringzero[ray]')")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # a Ray cluster on 2 busy cores starts in minutes


async def test_the_cluster_demo_moves_a_killed_node_s_agents_and_all_finish(postgres_dsn: str, tmp_path: Path) -> None:
    dsn = fresh_database(postgres_dsn)
    out = await asyncio.to_thread(ringzero_cli, "demo", "--ray", "--db", dsn, cwd=tmp_path, timeout=580)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "killing node" in out.stdout and "moved off" in out.stdout
    assert "8/8 agents finished with all 6 notes" in out.stdout
    placed = out.stdout.split("killing node")[0]
    assert len({line.split("│")[3].strip() for line in placed.splitlines() if "researcher-" in line}) == 2


def test_the_cluster_demo_without_a_postgresql_store_says_what_it_needs(tmp_path: Path) -> None:
    out = ringzero_cli("demo", "--ray", cwd=tmp_path)
    assert out.returncode == 1 and "needs --db postgresql://" in out.stderr and out.stdout == "", out
