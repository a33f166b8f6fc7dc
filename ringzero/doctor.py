"""``ringzero doctor``: which executors and isolation controls work on this host, by trying them."""

from __future__ import annotations

import glob
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ringzero.core.contract.errors import RingzeroError
from ringzero.core.contract.protocols import Executor
from ringzero.core.support.owner_only import OWN_FOLDER, readable_by_others

__all__ = ["DEFAULT_STORE", "diagnose", "store_warnings"]

DEFAULT_STORE = Path(OWN_FOLDER) / "state.db"


async def _try_run(executor: Executor) -> str:
    started = time.perf_counter()
    result = await executor.run("21 * 2")
    elapsed = (time.perf_counter() - started) * 1000
    if result.error is not None or result.value != 42:
        return f"[red]runs, but wrongly: {result.error or result.value}[/]"
    return f"[green]works[/] (first run {elapsed:.0f} ms)"


async def _monty() -> tuple[str, str]:
    from ringzero.providers.executors import MontyExecutor

    executor = MontyExecutor(max_workers=1)
    try:
        status = await _try_run(executor)
        walls = [c for c in executor.wall_controls if c not in executor.missing_controls]
        detail = ("interpreter: no file system, network or subprocess; time/memory limits\n"
                  f"workers' second wall: {', '.join(walls) or 'none'}, empty environment")
        if executor.missing_controls:
            missing = "; ".join(f"{c} ({why})" for c, why in executor.missing_controls.items())
            detail += f"\n[yellow]second wall missing: {missing}[/]"
        return status, detail
    except RingzeroError as exc:
        return f"[red]does not work: {exc}[/]", ""
    finally:
        await executor.aclose()


async def _process() -> tuple[str, str]:
    from ringzero.providers.executors import ProcessExecutor, workspaces

    try:
        executor = ProcessExecutor(allow_weaker_isolation=True, warm=1)
        await executor.start()
    except RingzeroError as exc:
        return f"[red]does not work: {exc}[/]", ""
    try:
        status = await _try_run(executor)
        enforced = [c for c in executor.controls if c not in executor.missing_controls]
        detail = "enforced: " + ", ".join(enforced)
        quota = workspaces.unavailable()
        detail += ("\nworkspaces: a file system of their own each, with a quota, and a uid of their own"
                   if quota is None else f"\n[yellow]workspaces: no quota ({quota})[/]")
        if executor.missing_controls:
            missing = "; ".join(f"{c} ({why})" for c, why in executor.missing_controls.items())
            detail += f"\n[yellow]missing: {missing} — refuses to start unless allow_weaker_isolation=True[/]"
        return status, detail
    finally:
        await executor.aclose()


def _microvm() -> tuple[str, str]:
    try:
        from ringzero.providers.executors.microsandbox import microvm_unavailable_reason
    except ImportError as exc:
        return "[yellow]not installed[/]", str(exc)
    reason = microvm_unavailable_reason()
    if reason is not None:
        return "[red]cannot boot microVMs here[/]", reason
    return "[green]host ready[/]", "a boot still needs a root file system image (see the executor's docs)"


def store_warnings(stores: list[Path]) -> list[str]:
    """For each SQLite store that exists (its journals hold every prompt and tool argument), why
    other users on this machine can read it, if they can."""
    found = []
    for store in stores:
        for path in (store, *store.parent.glob(f"{glob.escape(store.name)}-*")):
            why = readable_by_others(path)
            if why is not None:
                found.append(why)
    return found


async def diagnose(console: Console, stores: list[Path] | None = None) -> int:
    table = Table(title="ringzero doctor: executors on this host", show_lines=True)
    table.add_column("executor")
    table.add_column("status")
    table.add_column("isolation, as probed")
    for name, probe in (("MontyExecutor (default)", _monty), ("ProcessExecutor", _process)):
        status, detail = await probe()
        table.add_row(name, status, detail)
    table.add_row("MicrosandboxExecutor", *_microvm())
    console.print(table)
    for warning in store_warnings(stores if stores is not None else [DEFAULT_STORE]):
        console.print(f"[yellow]warning: {warning}[/]")
    return 0
