"""Checkpointers: where processes, journals and LangGraph checkpoints are kept.

``PostgresCheckpointer`` (pip install 'ringzero[postgres]') is imported lazily. A store of
another package is named by a URL scheme it registers under the entry point group
``ringzero.checkpointers`` (``redis = "mypackage.store:open_store"``, a function from the whole
URL to a Checkpointer): ``Kernel(checkpointer="redis://...")`` and every command's ``--db`` open it.
"""

from __future__ import annotations

import re
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ringzero.checkpointers.memory import MemoryCheckpointer
from ringzero.checkpointers.sqlite import SqliteCheckpointer
from ringzero.core.contract.errors import InvalidArgument, RingzeroError

if TYPE_CHECKING:
    from ringzero.checkpointers.postgres import PostgresCheckpointer
    from ringzero.core.contract.protocols import Checkpointer

__all__ = ["ENTRY_POINTS", "NAMES", "MemoryCheckpointer", "PostgresCheckpointer", "SqliteCheckpointer",
           "open_checkpointer", "registered_schemes", "scheme_of", "sqlite_file"]


NAMES = ("memory (or :memory:)", "sqlite:///relative/path.db", "sqlite:////absolute/path.db", "a file path",
         "postgresql://...")
"""What a checkpointer may be named by (``open_checkpointer``, ``Kernel(checkpointer=...)``),
besides the schemes other packages register (``registered_schemes``)."""
BUILT_IN_SCHEMES = ("sqlite", "postgresql", "postgres")
ENTRY_POINTS = "ringzero.checkpointers"
"""The entry point group a package registers its store's URL scheme under."""


def registered_schemes() -> dict[str, EntryPoint]:
    """The URL schemes installed packages register stores under (never one of ringzero's own)."""
    return {point.name: point for point in entry_points(group=ENTRY_POINTS) if point.name not in BUILT_IN_SCHEMES}


def scheme_of(target: str) -> str | None:
    """The URL scheme ``target`` starts with (``redis`` of ``redis://host``), else None."""
    found = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", target)
    return None if found is None else found.group(1).lower()


def _require_scheme(scheme: str) -> EntryPoint | None:
    """The entry point a package registered ``scheme`` under (None for one of ringzero's own);
    InvalidArgument, one line naming every installed scheme, where there is none."""
    if scheme in BUILT_IN_SCHEMES:
        return None
    registered = registered_schemes()
    point = registered.get(scheme)
    if point is None:
        installed = ", ".join(f"{name}://" for name in (*BUILT_IN_SCHEMES, *sorted(registered)))
        raise InvalidArgument(f"no checkpointer is installed for {scheme}://; the schemes installed are {installed} "
                              f"(a package adds one under the entry point group {ENTRY_POINTS!r})")
    return point


def _registered(scheme: str, target: str) -> Checkpointer:
    """The store a package registered for ``scheme``, opened on ``target`` (see ``_require_scheme``)."""
    from ringzero.core.contract.protocols import Checkpointer, check_backend

    point = _require_scheme(scheme)
    if point is None:  # a built-in scheme written so that open_checkpointer did not take it
        raise InvalidArgument(f"{target!r} is not a checkpointer's name; a checkpointer is named by "
                              + ", ".join(NAMES))
    try:
        factory = point.load()
        store = factory(target)
    except RingzeroError:
        raise
    except Exception as exc:  # the package's own failure, said in one line with whose it is
        raise InvalidArgument(f"the {scheme}:// store registered by {point.value} failed to open: "
                              f"{type(exc).__name__}: {exc}") from None
    check_backend(store, Checkpointer, f"the {scheme}:// store")
    checked: Checkpointer = store
    return checked


def sqlite_file(url: str) -> Path | None:
    """The file a ``sqlite:`` URL names, read as SQLAlchemy reads it (the one grammar of every
    entry point: ``--db``, ``Kernel(checkpointer=...)``, ``KernelSaver.from_conn_string``,
    ``open_checkpointer``): ``sqlite:///state.db`` is ``./state.db``, relative to the working
    folder; ``sqlite:////var/lib/app/state.db`` is ``/var/lib/app/state.db``; ``sqlite://`` and
    ``sqlite:///:memory:`` keep nothing after the process (None: a ``MemoryCheckpointer``).

    Raises InvalidArgument, naming the fix, for a URL with a host (``sqlite://state.db``) and for
    one an earlier release read otherwise: ``sqlite:///var/lib/app/state.db`` where the folder
    ``var/lib/app`` is not here but ``/var/lib/app`` is (that release opened ``/var/lib/app/state.db``)."""
    rest = url[len("sqlite:"):]
    if not rest.startswith("//"):
        raise InvalidArgument(f"{url!r} is not a SQLite URL: write sqlite:///relative.db or sqlite:////absolute.db")
    rest = rest[2:]
    if rest in ("", "/:memory:"):
        return None
    if not rest.startswith("/"):
        raise InvalidArgument(f"{url!r} names a host ({rest.split('/')[0]!r}), which a SQLite URL has none of: "
                              f"write sqlite:///{rest} for ./{rest}, or sqlite:////{rest} for /{rest}")
    path, _, query = rest[1:].partition("?")
    if query:
        raise InvalidArgument(f"{url!r}: a SQLite URL here takes no options ({query!r}); give the path alone")
    if not path or path.endswith("/"):
        raise InvalidArgument(f"{url!r} names a folder, not a file: write sqlite:///state.db (./state.db) or "
                              "sqlite:////absolute/state.db")
    file = Path(path)
    if not file.is_absolute():
        here, rooted = Path(path).absolute().parent, Path("/" + path).parent
        if not here.exists() and rooted.exists() and rooted != Path("/"):
            raise InvalidArgument(
                f"{url!r} is ./{path} (a SQLite URL is read as SQLAlchemy reads it: three slashes, then a path "
                f"relative to the working folder), and {here} does not exist, while /{path.rsplit('/', 1)[0]} does "
                f"(an earlier ringzero read the URL as /{path}): write sqlite:////{path} for /{path}, or make the "
                "folder for the relative one")
    return file


def open_checkpointer(target: str | Path) -> Checkpointer:
    """The checkpointer a connection string names: ``memory`` (or ``:memory:``) for one that
    keeps nothing after the process; ``postgresql://...`` (or ``postgres://``); a SQLite file,
    as a ``sqlite:`` URL (``sqlite_file``: ``sqlite:///relative.db``, ``sqlite:////abs/path.db``)
    or a plain path. Another scheme (``redis://``...) opens the store a package registered for
    it, and is refused naming the installed schemes where none did, rather than taken for a path."""
    if isinstance(target, Path):
        return SqliteCheckpointer(target)
    if not isinstance(target, str) or not target:
        raise InvalidArgument(f"a checkpointer is named by a non-empty string or path, not {target!r}")
    if target.startswith(("postgresql://", "postgres://")):
        from ringzero.checkpointers.postgres import PostgresCheckpointer

        return PostgresCheckpointer(target)
    if target in (":memory:", "memory"):
        return MemoryCheckpointer()
    if target.lower().startswith("sqlite:"):
        file = sqlite_file(target)
        return MemoryCheckpointer() if file is None else SqliteCheckpointer(file)
    scheme = scheme_of(target)
    if scheme is not None:
        return _registered(scheme, target)
    return SqliteCheckpointer(target)


def __getattr__(name: str) -> Any:
    if name == "PostgresCheckpointer":
        from ringzero.checkpointers.postgres import PostgresCheckpointer

        return PostgresCheckpointer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
