"""SQLite, the embedded default store: one file, in parts that each have one job.

WAL mode, so readers never block the writer and a record whose ``put`` returned survives the
host process being killed (``synchronous=NORMAL`` is durable against a process crash; pass
``synchronous="FULL"`` to survive power loss as well). Several kernels in separate processes
may share one file: SQLite serialises their writes and ``busy_timeout`` makes them wait for
each other instead of failing.

- ``schema``: the tables, their migrations, a checkpoint as a row. A file of another schema,
  or not SQLite at all, is refused with its path in the error and left untouched.
- ``commit``: group commit. A commit in WAL mode is one ``write()`` into the WAL, far cheaper
  than handing it to another thread and back, so writes and point reads run on the caller's
  thread through a plain ``sqlite3`` connection. The first write of a turn of the loop commits
  at once; the writes after it in the same turn commit together, and each ``put`` returns only
  once its own record is committed. Should one write of a batch fail, the batch runs again with
  a savepoint per writer, so that the bad write fails alone.
- ``thread``: the waiting thread. The caller's thread never waits for a lock: if another
  process holds the write lock, the batch goes to the waiting thread, which waits up to
  ``busy_timeout``, and every write goes that way, in order, until it has caught up.
  ``synchronous="FULL"``, whose fsync per commit would stall the loop, always goes that way,
  as do reads that may return many rows (``list``, memory searches).
- ``wal``: WAL checkpoints (copying the WAL into the file, with an fsync) on a thread of their
  own every ``CHECKPOINT_EVERY`` rows, instead of inside a commit on the loop.
- ``log``: the append log. ``append`` and ``append_writes`` (the kernel's journal, a record at
  every syscall; ``KernelSaver``'s checkpoints and writes) are no commit at all when they come
  in a row: one ``write()`` into a log beside the file, as durable against the process dying
  as a commit with ``synchronous=NORMAL``, folded into the file in one transaction every
  ``FOLD_EVERY`` records, a moment after the last, ahead of this checkpointer's next write and
  ahead of a read of a thread it holds records of. ``benchmarks/llm_syscall_overhead.py`` and
  ``benchmarks/checkpointers.py`` measure what it saves.
- ``memory``: long-term memory in the same file, with an FTS5 index.
"""

from ringzero.checkpointers.sqlite.checkpointer import DEFAULT_PATH, SqliteCheckpointer

__all__ = ["DEFAULT_PATH", "SqliteCheckpointer"]
