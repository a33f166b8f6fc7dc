"""LangGraph on the kernel: ``KernelSaver`` (a LangGraph checkpointer over any ringzero
Checkpointer), and ``sandboxed``/``code_tool`` (LangChain tools that run in an executor).

    graph.compile(checkpointer=KernelSaver(SqliteCheckpointer("state.db")))

Each LangGraph checkpoint becomes one ringzero checkpoint (thread, namespace, id, parent),
its payload the checkpoint and its metadata, and a JSON copy of the metadata kept beside it
for ``list(filter=...)``. A large list or string channel (a chat's messages) is kept in records
of its own, each item once, so that a conversation of n turns is stored in O(n) bytes, not
O(n^2) (``ringzero.adapters.langgraph_deltas``). Writes keep LangGraph's rules: special
channels (errors, interrupts, resumes) are replaced, ordinary writes never are.

The checkpointer lives on one event loop (``ringzero.core.support.loops``): the loop that first uses
the saver, or, when a sync graph (``graph.invoke``) comes first, a private thread the saver
owns. Calls from any other loop or thread run there; a blocking call on that loop's own
thread is refused with ``WrongEventLoop`` instead of waiting on itself. A sync graph's
checkpoints and writes are the exception where the store takes records from any thread
(``capabilities.append_anywhere``: SQLite): they are encoded and appended in the graph's own
thread, each step written before the next as before, with no hop to the loop and back.
``close()``/``aclose()`` (or ``with``/``async with``) stop the private thread, and close the
checkpointer when the saver opened it (``KernelSaver.from_conn_string(...)``); later calls
raise ``Closed``.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from ringzero.adapters._graph_guard import lives_in_memory, refuse_in_process
from ringzero.checkpointers import open_checkpointer
from ringzero.core.contract.errors import Closed, InvalidArgument, MissingExtra, RingzeroError
from ringzero.core.contract.protocols import Appending, Checkpointer, check_backend
from ringzero.core.contract.store import KERNEL_THREADS
from ringzero.core.contract.types import Checkpoint as Record
from ringzero.core.contract.types import PendingWrite
from ringzero.core.support.loops import Closing, LoopHome, forward, running_loop

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_checkpoint_metadata,
    )
    from langgraph.checkpoint.base import Checkpoint as LGCheckpoint
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("ringzero.adapters.langgraph", "langgraph") from exc

from ringzero.adapters import _unseen  # noqa: F401 - the warning for models and tools the kernel cannot see
from ringzero.adapters.langchain_tools import code_tool, sandboxed
from ringzero.adapters.langgraph_deltas import (
    HIDDEN,
    Body,
    Codec,
    KnownValues,
    Loaded,
    Recent,
    Streams,
    hidden_namespace,
    is_hidden,
)
from ringzero.adapters.langgraph_store import KernelMemoryStore
from ringzero.adapters.langgraph_tools import KernelToolNode

__all__ = ["KernelMemoryStore", "KernelSaver", "KernelToolNode", "code_tool", "sandboxed"]

T = TypeVar("T")


class KernelSaver(Closing, BaseCheckpointSaver[str]):
    """A LangGraph ``BaseCheckpointSaver`` (sync and async) over a ringzero Checkpointer."""

    def __init__(self, checkpointer: Checkpointer, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        check_backend(checkpointer, Checkpointer, "KernelSaver's checkpointer")
        self.checkpointer = checkpointer
        """The ringzero Checkpointer the graph's checkpoints are kept in."""
        capabilities = getattr(checkpointer, "capabilities", None)
        appending = checkpointer if capabilities is not None and capabilities.append \
            and isinstance(checkpointer, Appending) else None
        self._put_checkpoint: Callable[[Record], Awaitable[None]] = \
            checkpointer.put if appending is None else appending.append
        self._put_pending: Callable[[str, str, str, Sequence[PendingWrite]], Awaitable[None]] = \
            checkpointer.put_writes if appending is None else appending.append_writes
        """A graph's checkpoints and writes, written as it steps and read back by a later
        ``aget_tuple`` or a resume: ``append`` where the store declares it (SQLite: one
        ``write()`` each into its append log, folded in one commit once the appends pause, or
        before this saver's next read of the thread; another process sees them once folded)."""
        self._put_together: Callable[[Sequence[Record]], Awaitable[None]] | None = \
            appending.append_many if appending is not None else \
            checkpointer.put_many if capabilities is not None and capabilities.put_many else None  # type: ignore[attr-defined]
        """A checkpoint and the stream records it reads, in one atomic step where the store has one."""
        self._appends = appending is not None
        here = appending is not None and bool(getattr(capabilities, "append_anywhere", False))
        self._append_here: Callable[[Record], bool] | None = getattr(checkpointer, "append_here", None) \
            if here else None
        self._append_writes_here: Callable[[str, str, str, Sequence[PendingWrite]], bool] | None = \
            getattr(checkpointer, "append_writes_here", None) if here else None
        self._append_many_here: Callable[[Sequence[Record]], bool] | None = \
            getattr(checkpointer, "append_many_here", None) if here else None
        """A sync graph's steps appended from its own thread (``capabilities.append_anywhere``)."""
        self._encoding = threading.Lock()
        """Held while a checkpoint is encoded against what this saver remembers (``_recent``,
        ``_streams``): on the loop, and in the threads of sync graphs that append from there."""
        self._appended = False
        """Whether a checkpoint or a write went to ``append``: closing then reads the store once."""
        self.home = LoopHome("KernelSaver")
        self._codec = Codec(self.serde)
        self._recent = Recent()
        """What the checkpoints this saver last wrote or read store: a child is encoded against
        its parent's values from here, without reading them back."""
        self._streams = Streams()
        self._owns_checkpointer = False
        self._outlives_processes = not lives_in_memory(self)
        """Whether a graph run here from inside a kernel process is refused, at its first read
        of its thread (``ringzero.adapters._graph_guard``): the store is not a ``MemoryCheckpointer``."""

    @classmethod
    def from_conn_string(cls, conn_string: str, *, serde: SerializerProtocol | None = None) -> KernelSaver:
        """A saver over a checkpointer it opens and closes itself, as LangGraph's savers'
        ``from_conn_string``: a ``postgresql://`` DSN, ``memory`` (or ``:memory:``), a SQLite
        file (``sqlite:///relative.db``, ``sqlite:////abs/path.db``, or the path), or the URL of
        a store a package registered (``ringzero.checkpointers``).
        Use it as ``with`` or ``async with`` (or call ``close()``/``aclose()``)."""
        saver = cls(open_checkpointer(conn_string), serde=serde)
        saver._owns_checkpointer = True
        return saver

    def close(self) -> None:
        """Close what the saver opened: its private loop thread, and its checkpointer if it
        opened that too (one it was given stays open, with what the saver wrote in it, read by
        any reader from then on). Later calls raise ``Closed``."""
        if self.home.closed:
            return
        self.home.run_sync(self._let_go_of_store(), "KernelSaver.close")
        self.home.close()

    async def aclose(self) -> None:
        if self.home.closed:
            return
        await self.home.run(self._let_go_of_store())
        await self.home.aclose()

    async def _let_go_of_store(self) -> None:
        if self._owns_checkpointer:
            await self.checkpointer.aclose()
        elif self._appended:
            # A store folds what was appended to it before it answers a read (SQLite's append
            # log), so a read makes what this saver wrote visible to every other reader now,
            # not at the store's next fold, a timer on a loop that may stop with this saver. A
            # store closed first has done so as it closed.
            with contextlib.suppress(Closed):
                async for _ in self.checkpointer.list(limit=1):
                    pass

    # ------------------------------------------------------------------ encoding
    async def _tuple(self, record: Record, loaded: Loaded) -> CheckpointTuple:
        """``record`` as LangGraph's tuple, its values rebuilt (from its streams,
        read into ``loaded`` where they are not there yet)."""
        body = self._codec.body(record.payload)
        values, known = await self._values(record, body, loaded)
        if _worth_keeping(known):
            with self._encoding:
                self._recent.put(record.thread_id, record.namespace, record.id, known)
        config: RunnableConfig = {"configurable": {"thread_id": record.thread_id, "checkpoint_ns": record.namespace,
                                                   "checkpoint_id": record.id}}
        parent: RunnableConfig | None = None if record.parent_id is None else {"configurable": {
            "thread_id": record.thread_id, "checkpoint_ns": record.namespace, "checkpoint_id": record.parent_id}}
        writes = sorted(record.writes, key=lambda w: (w.task_id, w.idx))
        return CheckpointTuple(
            config=config,
            checkpoint={**body.checkpoint, "channel_values": values},  # type: ignore[typeddict-item]
            metadata=body.metadata,
            parent_config=parent,
            pending_writes=[(w.task_id, w.channel, self._codec.untyped(w.value, body.raw)) for w in writes],
        )

    async def _values(self, record: Record, body: Body, loaded: Loaded) -> tuple[dict[str, Any], KnownValues]:
        versions = body.checkpoint.get("channel_versions", {})
        values: dict[str, Any] = {}
        known: KnownValues = {}
        if body.specs is None:  # a payload of the earlier kind: the values whole, in the checkpoint
            for channel, value in body.checkpoint.get("channel_values", {}).items():
                values[channel], known[channel] = value, self._codec.known_inline(value, versions.get(channel))
            return values, known
        for channel, spec in body.specs.items():
            if spec[0] in ("L", "T") and not loaded.has(channel):
                place = hidden_namespace(record.namespace, channel)
                loaded.add_segments(channel, [(r.id, r.payload)
                                              async for r in self.checkpointer.list(record.thread_id, place)])
            values[channel], known[channel] = loaded.value(channel, spec, versions.get(channel))
        return values, known

    # ------------------------------------------------------------------ the work, on the saver's loop
    async def _get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = config["configurable"]
        record = await self.checkpointer.get(conf["thread_id"], conf.get("checkpoint_ns", ""),
                                             get_checkpoint_id(config))
        return None if record is None else await self._tuple(record, Loaded(self._codec))

    async def _records(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        conf = (config or {}).get("configurable", {})
        wanted_id = conf.get("checkpoint_id")
        before_id = None if before is None else get_checkpoint_id(before)
        every_thread = conf.get("thread_id") is None
        left = limit if every_thread and not wanted_id else None
        loaded: dict[tuple[str, str], Loaded] = {}  # the streams read so far, per thread and namespace
        async for record in self.checkpointer.list(conf.get("thread_id"), conf.get("checkpoint_ns"),
                                            filter=_jsonable(filter) if filter else None, before=before_id,
                                            limit=None if wanted_id or left is not None else limit):
            if every_thread and record.thread_id.startswith(KERNEL_THREADS):
                continue  # a kernel's own records (processes, journals, activity) in a store it shares
            if is_hidden(record.namespace):
                continue  # a stream's records: read through the checkpoints that hold them
            if wanted_id is None or record.id == wanted_id:
                yield await self._tuple(record, loaded.setdefault((record.thread_id, record.namespace),
                                                                  Loaded(self._codec)))
                if left is not None:
                    left -= 1
                    if left <= 0:
                        return

    def _encoded(self, config: RunnableConfig, checkpoint: LGCheckpoint,
                 metadata: CheckpointMetadata) -> tuple[RunnableConfig, Record, list[Record], list[tuple[str, str]]]:
        """A checkpoint encoded against its parent (any thread): its config, its record, the
        stream records to write first, and the stream records to delete after (``_write``)."""
        conf = config["configurable"]
        thread_id, namespace = conf["thread_id"], conf.get("checkpoint_ns", "")
        parent_id = conf.get("checkpoint_id")
        full_metadata = get_checkpoint_metadata(config, metadata)
        with self._encoding:
            payload, raw, segments, sealed, known = self._codec.encode(
                (thread_id, namespace), checkpoint["id"], checkpoint, full_metadata,
                self._recent.get(thread_id, namespace, parent_id), self._streams)
            # Kept before the store is awaited: LangGraph writes a checkpoint and its first pending
            # writes at once, and the writes are deflated against it where it is here already.
            self._recent.keep_body(thread_id, namespace, checkpoint["id"], raw)
            if _worth_keeping(known):
                self._recent.put(thread_id, namespace, checkpoint["id"], known)
        record = Record(thread_id=thread_id, namespace=namespace, id=checkpoint["id"], parent_id=parent_id,
                        payload=payload, metadata=_jsonable(dict(full_metadata)))
        rows = [Record(thread_id, segment.namespace, segment.id, segment.payload) for segment in segments]
        done: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": namespace,
                                                 "checkpoint_id": checkpoint["id"]}}
        return done, record, rows, sealed

    async def _put(
        self,
        config: RunnableConfig,
        checkpoint: LGCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        done, record, rows, sealed = self._encoded(config, checkpoint, metadata)
        await self._write(record, rows, sealed)
        return done

    async def _write(self, record: Record, rows: list[Record], sealed: list[tuple[str, str]]) -> None:
        """A checkpoint's record, after the stream records it reads (in one atomic step where the
        store has one), then the deletes of the pieces a segment sealed."""
        self._appended = self._appended or self._appends
        if not rows:
            await self._put_checkpoint(record)
        else:  # the stream records first: a checkpoint is never read without the items it names
            if self._put_together is not None:
                await self._put_together([*rows, record])
            else:
                for row in [*rows, record]:
                    await self.checkpointer.put(row)
        if sealed and self.checkpointer.capabilities.delete_checkpoints:  # else kept: read past, never wrong
            for place in dict.fromkeys(where for where, _ in sealed):
                await self.checkpointer.delete_checkpoints(record.thread_id, place,
                                                           [record_id for where, record_id in sealed if where == place])

    def _pending(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                 task_path: str) -> tuple[str, str, str, list[PendingWrite]]:
        """A task's writes as rows (any thread), each deflated against its checkpoint where the
        saver has that at hand."""
        conf = config["configurable"]
        thread_id, namespace, checkpoint_id = conf["thread_id"], conf.get("checkpoint_ns", ""), conf["checkpoint_id"]
        with self._encoding:
            against = self._recent.body(thread_id, namespace, checkpoint_id)
        rows = [PendingWrite(task_id, channel, self._codec.typed(value, against), task_path,
                             WRITES_IDX_MAP.get(channel, idx)) for idx, (channel, value) in enumerate(writes)]
        return thread_id, namespace, checkpoint_id, rows

    async def _put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        thread_id, namespace, checkpoint_id, rows = self._pending(config, writes, task_id, task_path)
        if rows:
            self._appended = self._appended or self._appends
            await self._put_pending(thread_id, namespace, checkpoint_id, rows)

    async def _put_pending_rows(self, thread_id: str, namespace: str, checkpoint_id: str,
                                rows: list[PendingWrite]) -> None:
        self._appended = self._appended or self._appends
        await self._put_pending(thread_id, namespace, checkpoint_id, rows)

    async def _delete_thread(self, thread_id: str) -> None:
        with self._encoding:
            self._recent.forget(thread_id)
            self._streams.forget(thread_id)
        await self.checkpointer.delete_thread(thread_id)

    async def _delete_for_runs(self, run_ids: Sequence[str]) -> None:
        doomed: dict[tuple[str, str], list[str]] = {}
        for run_id in dict.fromkeys(run_ids):  # each run found through the store's run_id index
            async for record in self.checkpointer.list(filter={"run_id": run_id}):
                doomed.setdefault((record.thread_id, record.namespace), []).append(record.id)
        for (thread_id, namespace), ids in doomed.items():
            await self._delete(thread_id, namespace, ids)

    async def _copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        records = [r async for r in self.checkpointer.list(source_thread_id)]
        for record in reversed(records):  # oldest first, so that parents exist before children
            await self.checkpointer.put(Record(target_thread_id, record.namespace, record.id, record.payload,
                                        record.parent_id, dict(record.metadata)))
            if record.writes:
                await self.checkpointer.put_writes(target_thread_id, record.namespace, record.id, list(record.writes))

    async def _prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise InvalidArgument(f"prune strategy must be 'keep_latest' or 'delete', not {strategy!r}")
        for thread_id in thread_ids:
            if strategy == "delete":
                await self.checkpointer.delete_thread(thread_id)
                continue
            newest: dict[str, str] = {}
            others: dict[str, list[str]] = {}
            async for record in self.checkpointer.list(thread_id):  # newest first
                if is_hidden(record.namespace):
                    continue  # a stream's records: kept while a checkpoint that stays reads them
                if record.namespace not in newest:
                    newest[record.namespace] = record.id
                else:
                    others.setdefault(record.namespace, []).append(record.id)
            for namespace, ids in others.items():
                await self._delete(thread_id, namespace, ids)

    async def _delete(self, thread_id: str, namespace: str, ids: list[str]) -> None:
        if not self.checkpointer.capabilities.delete_checkpoints:
            raise RingzeroError(f"{type(self.checkpointer).__name__} cannot delete single checkpoints "
                                "(capabilities.delete_checkpoints is False)")
        with self._encoding:
            self._recent.forget(thread_id)
            self._streams.forget(thread_id)
        await self.checkpointer.delete_checkpoints(thread_id, namespace, ids)
        await self._drop_unread_streams(thread_id, namespace)

    async def _drop_unread_streams(self, thread_id: str, namespace: str) -> None:
        """Delete the stream records of ``namespace`` that no checkpoint left in it reads."""
        records = [r async for r in self.checkpointer.list(thread_id)]
        channels = {r.namespace.rpartition(HIDDEN)[2] for r in records
                    if is_hidden(r.namespace) and r.namespace.rpartition(HIDDEN)[0] == namespace}
        if not channels:
            return  # no stream here: the checkpoints' payloads need not be read (nor be this saver's)
        read: dict[str, set[str]] = {}
        for record in records:
            if record.namespace == namespace:
                for channel, spec in (self._codec.body(record.payload).specs or {}).items():
                    if spec[0] in ("L", "T"):
                        read.setdefault(channel, set()).add(spec[1])
        for channel in channels:
            place = hidden_namespace(namespace, channel)
            loaded = Loaded(self._codec)
            loaded.add_segments(channel, [(r.id, r.payload) for r in records if r.namespace == place])
            kept = loaded.reached(channel, read.get(channel, set()))
            doomed = [record_id for stream in loaded.ids.get(channel, {}) if stream not in kept
                      for record_id in loaded.record_ids(channel, stream)]
            if doomed:
                await self.checkpointer.delete_checkpoints(thread_id, place, doomed)

    # ------------------------------------------------------------------ async API (any loop)
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        if self._outlives_processes:
            refuse_in_process(self, config)  # a graph's first call: before any of its nodes runs
        return await self.home.run(self._get_tuple(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        home = self.home.target()
        if home is None:
            async for found in self._records(config, filter=filter, before=before, limit=limit):
                yield found
            return
        for found in await forward(home, self._collect(config, filter=filter, before=before, limit=limit)):
            yield found

    async def _collect(self, config: RunnableConfig | None, **options: Any) -> list[CheckpointTuple]:
        return [t async for t in self._records(config, **options)]

    async def aput(self, config: RunnableConfig, checkpoint: LGCheckpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        if self._outlives_processes:
            refuse_in_process(self)
        return await self.home.run(self._put(config, checkpoint, metadata, new_versions))

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        if self._outlives_processes:
            refuse_in_process(self)
        await self.home.run(self._put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        await self.home.run(self._delete_thread(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self.home.run(self._delete_for_runs(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self.home.run(self._copy_thread(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self.home.run(self._prune(thread_ids, strategy=strategy))

    # ------------------------------------------------------------------ sync API
    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the saver's loop and wait for it."""
        return self.home.run_sync(coro, "a KernelSaver sync method")

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        if self._outlives_processes:
            refuse_in_process(self, config)
        return self._run(self._get_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        async def collect() -> list[CheckpointTuple]:
            return [t async for t in self._records(config, filter=filter, before=before, limit=limit)]

        return iter(self._run(collect()))

    def put(self, config: RunnableConfig, checkpoint: LGCheckpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        if self._outlives_processes:
            refuse_in_process(self)
        append = self._append_here
        if append is None or running_loop() is not None or self.home.closed:  # through the loop
            return self._run(self._put(config, checkpoint, metadata, new_versions))
        done, record, rows, sealed = self._encoded(config, checkpoint, metadata)
        many = self._append_many_here
        if sealed or not (append(record) if not rows else many is not None and many([*rows, record])):
            self._run(self._write(record, rows, sealed))  # pieces to delete, or the store wants the loop
        else:
            self._appended = True
        return done

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        if self._outlives_processes:
            refuse_in_process(self)
        append = self._append_writes_here
        if append is None or running_loop() is not None or self.home.closed:  # through the loop
            self._run(self._put_writes(config, writes, task_id, task_path))
            return
        thread_id, namespace, checkpoint_id, rows = self._pending(config, writes, task_id, task_path)
        if not rows:
            return
        if append(thread_id, namespace, checkpoint_id, rows):
            self._appended = True
        else:
            self._run(self._put_pending_rows(thread_id, namespace, checkpoint_id, rows))

    def delete_thread(self, thread_id: str) -> None:
        self._run(self._delete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._run(self._delete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run(self._copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._run(self._prune(thread_ids, strategy=strategy))

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Monotonic, sortable versions, as LangGraph's own savers make them."""
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:032}.{0:016}"


def _worth_keeping(known: KnownValues) -> bool:
    """Whether a child of this checkpoint gains from comparing against it: one of its values is
    in a stream, or large enough to go into one. (Values stored inline are stored inline in the
    child too, from the child's own.)"""
    return any(k.items is not None for k in known.values())


def _jsonable(value: Any) -> Any:
    """A JSON copy (values that are not JSON become their repr) for filtering in the store."""
    copy = _plain_copy(value)
    return json.loads(json.dumps(value, default=repr)) if copy is _NOT_PLAIN else copy


_NOT_PLAIN = object()


def _plain_copy(value: Any) -> Any:
    """A copy of ``value`` where it is made of JSON's own types only (dicts with string keys,
    lists, strings, numbers, booleans, None): what a JSON round trip gives, at a fifth of its
    cost at every checkpoint; ``_NOT_PLAIN`` otherwise (the round trip decides)."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if kind is dict:
        copy = {}
        for key, item in value.items():
            if type(key) is not str:
                return _NOT_PLAIN
            item = _plain_copy(item)
            if item is _NOT_PLAIN:
                return _NOT_PLAIN
            copy[key] = item
        return copy
    if kind is list:
        items = []
        for item in value:
            item = _plain_copy(item)
            if item is _NOT_PLAIN:
                return _NOT_PLAIN
            items.append(item)
        return items
    return _NOT_PLAIN
