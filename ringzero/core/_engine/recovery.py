"""Resuming the unfinished processes of a store (``Kernel.recover``).

Each program is imported again by ``module:qualname`` (or looked up in ``programs``) and re-run;
its recorded syscalls are served from the journal, so no LLM call or tool run is repeated.
Recovery never turns recoverable work into a failure: a process whose program cannot be
imported stops without ending, its handle's ``wait()`` raising ``NotResumed`` with what was
missing, for a later ``recover()`` to finish.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Collection, Mapping

from ringzero.core._engine.handles import ProcessHandle
from ringzero.core._engine.journal import OWNER_RECHECK, Journal
from ringzero.core._engine.lifecycle import launch
from ringzero.core._engine.mailbox import Mail
from ringzero.core._engine.new_run import RunStart
from ringzero.core._engine.process import Process
from ringzero.core._engine.runtime import Runtime, missing_program
from ringzero.core.contract.errors import InvalidArgument, NotResumed, ProgramNotFound
from ringzero.core.contract.records import Ending, received_seq
from ringzero.core.contract.store import ProcessRecord
from ringzero.core.contract.types import JSON, ProcessStatus, Program
from ringzero.core.support.holders import Holders
from ringzero.core.support.references import import_reference

__all__ = ["fork", "load", "recover", "retry"]


async def recover(runtime: Runtime, programs: Mapping[str, Program] | None, *,
                  pids: Collection[int] | None = None, from_node: str | None = None) -> list[ProcessHandle]:
    """Resume the store's unfinished processes that ``runtime`` does not run (see
    ``Kernel.recover``): the handles of those started, then of those left unfinished at once."""
    await runtime.start()
    store, cluster = runtime.store, runtime.cluster
    wanted = None if pids is None else set(pids)
    taken: dict[int, tuple[int, str] | None] = {}
    everything = await store.load_processes()
    runtime.remember_spawns(everything)
    holders = await Holders.read(store) if runtime.claims_wakes else Holders()
    lease = cluster.node is not None
    for record in everything:
        if runtime.runs(record.pid) or record.status.terminal:
            continue  # an ended one is read from the store if a resumed parent asks for it
        if wanted is not None and record.pid not in wanted:
            continue
        epoch, holder = holders.of(record.pid, runtime.host_id)
        if holder is not None and from_node is None:
            runtime.held_elsewhere[record.pid] = holder  # a live kernel runs it: left alone
            continue
        if cluster.node is not None:
            owner = await cluster.take_over(record.pid, from_node)
        elif runtime.claims_wakes:  # one host per wake: of kernels resuming it at once, one takes it
            owner = await runtime.claim_wake(record.pid, epoch)
            lease = lease or epoch > 0
        else:
            taken[record.pid] = None
            continue
        if owner is not None:
            taken[record.pid] = owner
            runtime.held_elsewhere.pop(record.pid, None)  # left alone by an earlier look, taken now
        else:
            runtime.held_elsewhere[record.pid] = "a kernel that took it at the same moment"
    if not taken:
        return []
    if lease:
        # A process taken from another kernel starts once that kernel's ownership lease has run
        # out: if it is alive after all, its next check stops it before this one runs, and what
        # it recorded until then is read below.
        await asyncio.sleep(OWNER_RECHECK)
    # Each starts from the state it was spawned with: its replay rebuilds the rest.
    records = [r for r in await store.load_processes(as_spawned=True) if r.pid in taken and not r.status.terminal]
    to_start: list[Process] = []
    unfinished: list[Process] = []
    for record in records:
        process = await load(runtime, record, programs or {}, taken[record.pid])
        (unfinished if process.left_unfinished is not None else to_start).append(process)
    for process in to_start:  # only now: a parent's replayed spawn finds every child loaded
        launch(process)
    return [ProcessHandle(runtime, process) for process in [*to_start, *unfinished]]


async def retry(runtime: Runtime, pid: int, programs: Mapping[str, Program] | None) -> ProcessHandle:
    """Resume failed process ``pid`` from its journal (``Kernel.retry``): its end is taken back
    (a transition ``failed -> ready`` says so) and it is recovered like an unfinished one, its
    recorded syscalls served, so that a program fixed since (or rolled back) goes on from there."""
    await runtime.start()
    store = runtime.store
    record = await store.load_process(pid)
    if record is None:
        raise InvalidArgument(f"no process {pid} in the store")
    if record.status is not ProcessStatus.FAILED:
        raise InvalidArgument(f"pid {pid} is {record.status.value}: only a failed process can be retried (an "
                              "unfinished one is resumed by ringzero resume; an exited or killed one is over)")
    why = record.stop_reason.value if record.stop_reason is not None else "failed"
    record.undo_end(Ending(None, None, None, record.state))
    record.move_to(ProcessStatus.READY)
    step: dict[str, JSON] = {"from": ProcessStatus.FAILED.value, "to": ProcessStatus.READY.value,
                             "at": time.time(), "detail": f"retried after {why}"}
    await store.put_rows([store.transitions_row(pid, [(await store.last_seq(pid, "transitions") + 1, step)]),
                          store.state_row(record), store.status_row(record)])
    handles = await recover(runtime, programs, pids=[pid])
    if not handles:
        raise InvalidArgument(f"pid {pid} could not be taken: another node runs it")
    return handles[0]


async def fork(runtime: Runtime, pid: int, at: int, programs: Mapping[str, Program] | None) -> ProcessHandle:
    """A new process that is process ``pid`` up to slot ``at`` (``Kernel.fork``): its program,
    arguments and limits, and a copy of the journal before ``at``, which it replays (nothing
    before ``at`` runs again); from ``at`` on it runs live. The old process is not touched."""
    if isinstance(at, bool) or not isinstance(at, int) or at < 1:
        raise InvalidArgument(f"fork at a slot: a syscall's number (1 or more), not {at!r}")
    await runtime.start()
    store = runtime.store
    record = await store.load_process(pid, as_spawned=True)
    if record is None:
        raise InvalidArgument(f"no process {pid} in the store")
    if record.run_start is not None:
        raise InvalidArgument(f"pid {pid} started a new run (ctx.continue_as_new): fork it from that run's "
                              "record is not supported; fork a process that never continued as new")
    journal = {entry.seq: entry for entry in await store.journal(pid)}
    kept = [journal[seq] for seq in range(1, at) if seq in journal]
    if len(kept) != at - 1:
        missing = next(seq for seq in range(1, at) if seq not in journal)
        raise InvalidArgument(f"pid {pid} has no record of slot {missing}, so it cannot be forked at {at}: every "
                              f"slot before the fork point must be recorded (ringzero show {pid} lists them)")
    copy = ProcessRecord(pid=await runtime.pids.take() if runtime.pids.taken_first else 0, name=record.name,
                         program=record.program, args=record.args, priority=record.priority, limits=record.limits,
                         state=dict(record.state))
    await runtime.pids.write_new(copy)
    calls = (await store.effects(pid)).calls
    for entry in kept:
        await store.append_journal(copy.pid, entry)
    for key, call in calls.items():
        if int(key.partition(".")[0]) < at:
            await store.record_call(copy.pid, key, call.kind, call.fingerprint, call.summary, call.outcome)
    step: dict[str, JSON] = {"from": ProcessStatus.CREATED.value, "to": ProcessStatus.READY.value,
                             "at": time.time(), "detail": f"forked from pid {pid} at slot {at}"}
    copy.move_to(ProcessStatus.READY)
    await store.put_rows([store.transitions_row(copy.pid, [(1, step)]), store.status_row(copy)])
    handles = await recover(runtime, programs, pids=[copy.pid])
    if not handles:
        raise InvalidArgument(f"the fork of pid {pid} (pid {copy.pid}) could not be taken: another node runs it")
    return handles[0]


async def load(runtime: Runtime, record: ProcessRecord, programs: Mapping[str, Program],
                  owner: tuple[int, str] | None) -> Process:
    """The process of ``record`` with its journal and mailbox read back: in the live table, or
    ended unfinished where its program cannot be found."""
    store = runtime.store
    program, why = _resolve(record, programs)
    start = RunStart.of(record.run_start)  # where its current run began (continue-as-new)
    journal = Journal(store, record.pid, start.of_this_run(await store.journal(record.pid)),
                      owner=owner, base=start.journal_base, resumed=True)
    process = Process(
        runtime, record, program or missing_program, journal,
        transition_seq=await store.last_seq(record.pid, "transitions"),
        mail_seq=await store.last_seq(record.pid, "mailbox"), recovered=True,
        counts=(start.sends, start.spawns) if start.journal_base else (0, 0),
    )
    if start.journal_base:
        process.meter.charge(**(start.spent or {}))
    if program is None:  # left as the crash left it, for a resume that can import it
        process.unfinished_because(NotResumed(record.pid, record.name, ProgramNotFound(
            f"cannot import its program {record.program!r} (pass recover(programs={{...}}), or make it "
            f"importable from where you resume): {why}")))
        process.end_unfinished()
        return process
    runtime.procs[record.pid] = process
    consumed = {received_seq(e) for e in journal.entries}
    for seq, body in await store.mail(record.pid):
        if seq not in consumed and not start.received_before(seq):
            process.mailbox.put(Mail(int(body["priority"]), seq, body["message"], body.get("sender")))
    return process


def _resolve(record: ProcessRecord, programs: Mapping[str, Program]) -> tuple[Program | None, str]:
    """The program of ``record`` (from ``programs``, else imported), or None and why not."""
    if record.program in programs:
        return programs[record.program], ""
    if record.name in programs:
        return programs[record.name], ""
    try:
        target = import_reference(record.program, "the program")
    except InvalidArgument as exc:
        return None, str(exc)
    if not inspect.iscoroutinefunction(target):
        return None, f"{record.program!r} is not an async function"
    return target, ""
