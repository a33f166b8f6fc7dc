"""``ringzero show``, ``ringzero settle`` and ``ringzero replay --check``: an operator's look
inside a process, decision for it, and check that stored journals replay against new code.

``retry`` and ``fork`` run processes, so they live with ``resume`` (``ringzero.resuming``).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ringzero.core.contract.protocols import Checkpointer
from ringzero.core.contract.store import KernelStore
from ringzero.core.operations import journal_lines, settle

__all__ = ["replay_check", "settle_slot", "show"]


async def show(checkpointer: Checkpointer, pid: int, console: Console, *, as_json: bool) -> int:
    """Print process ``pid``'s journal: one line per slot (``--json``: one JSON document)."""
    journal = await journal_lines(KernelStore(checkpointer), pid)
    record, lines = journal.record, journal.lines
    if as_json:
        console.print_json(json.dumps({"pid": pid, "name": record.name, "program": record.program,
                                       "status": record.status.value,
                                       "slots": [line.to_json() for line in lines]}))
        return 0
    view = Table(title=f"pid {pid} {escape(record.name)} ({record.status.value}): {escape(record.program)}",
                 title_justify="left")
    for column in ("slot", "kind", "call", "outcome", "at", "in doubt"):
        view.add_column(column, justify="right" if column == "slot" else "left", overflow="fold")
    for line in lines:
        view.add_row(line.slot, line.kind, escape(line.summary), escape(line.said), _clock(line.at),
                     "[bold red]yes[/]" if line.in_doubt else "")
    console.print(view)
    doubts = [line.slot for line in lines if line.in_doubt]
    if doubts:
        console.print(f"in doubt: slot {', '.join(doubts)}; decide with ringzero settle {pid} SLOT "
                      "(--result JSON | --error MESSAGE | --run-again)")
    return 0


async def settle_slot(checkpointer: Checkpointer, pid: int, slot: str, console: Console, *, result: str | None,
                      error: str | None, run_again: bool) -> int:
    """Decide in-doubt call ``slot`` of ``pid``; say what the next resume will do with it."""
    from ringzero.resuming import parse_message

    value: Any = None if result is None else parse_message(result, "the result")
    record, line = await settle(KernelStore(checkpointer), pid, slot, result=value, error=error, run_again=run_again,
                                has_result=result is not None)
    failed = record.status.value == "failed"
    nxt = f"ringzero retry {pid}" if failed else "ringzero resume"
    done = "will run again" if run_again else f"is settled: {line.said}"
    console.print(f"pid {pid} slot {slot} ({escape(line.summary)}) {escape(done)}; {nxt} goes on from it")
    return 0


async def replay_check(checkpointer: Checkpointer, pids: Sequence[int], console: Console) -> int:
    """Replay the stored journals against the code importable now; 1 if any diverges."""
    from ringzero.core.kernel import Kernel

    reports = await Kernel.check_replays(checkpointer, pids=pids or None)
    for report in reports:
        mark = "[green]ok[/]" if report.clean else "[bold red]DIVERGES[/]"
        console.print(f"{mark} pid {report.pid} {escape(report.name)}: {escape(report.detail)}")
    bad = [r for r in reports if not r.clean]
    console.print(f"{len(reports) - len(bad)} of {len(reports)} process(es) replay clean against the current code"
                  + (f"; {len(bad)} do not" if bad else ""))
    return 1 if bad else 0


def _clock(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.datetime.fromtimestamp(at).astimezone().isoformat(timespec="seconds")
