"""The public surface: sorted __all__ lists that match real names, and the documented error tree."""

from __future__ import annotations

import importlib
import inspect
import os
import re
from pathlib import Path

import pytest

import ringzero
from ringzero.core.contract import errors

MODULES = [
    "ringzero",
    "ringzero.protocols",
    "ringzero.core.contract.errors",
    "ringzero.core.contract.types",
    "ringzero.core.contract.protocols",
    "ringzero.core.support.gate",
    "ringzero.core.kernel",
    "ringzero.checkpointers",
    "ringzero.providers.schedulers",
    "ringzero.testing",
    "ringzero.compat.checkpointer",
    "ringzero.compat.executor",
    "ringzero.providers.executors",
    "ringzero.providers.llm",
    "ringzero.agents",
    "ringzero.adapters.crewai",
    "ringzero.core.support.effects",
    "ringzero.core._engine.new_run",
    "ringzero.resuming",
    "ringzero.defaults",
    "ringzero.core.support.backends",
    "ringzero.core.support.tool_pool",
    "ringzero.providers.executors.boundary",
]


def isort_style(name: str) -> tuple[int, str]:
    """Constants, then classes, then functions and variables: the order ruff's RUF022 keeps."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_names_real_objects(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported, key=isort_style) and len(set(exported)) == len(exported)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ names {attr}, which does not exist"


def test_every_error_descends_from_one_of_the_two_roots_and_appears_in_the_tree() -> None:
    """Errors under RingzeroError; the signals a program must not swallow (ToolInDoubt,
    NonDeterminismError) under KernelInterrupt, a BaseException."""
    classes = [obj for _, obj in inspect.getmembers(errors, inspect.isclass) if obj.__module__ == errors.__name__]
    assert classes
    for cls in classes:
        assert issubclass(cls, (ringzero.RingzeroError, ringzero.KernelInterrupt)), cls
        assert cls.__name__ in (errors.__doc__ or ""), f"{cls.__name__} is missing from the tree in the docstring"
    signals = [cls for cls in classes if issubclass(cls, ringzero.KernelInterrupt)]
    assert {cls.__name__ for cls in signals} == {"KernelInterrupt", "ToolInDoubt", "NonDeterminismError"}
    assert not any(issubclass(cls, Exception) for cls in signals)


def test_every_error_is_importable_from_ringzero() -> None:
    import ringzero
    from ringzero.core.contract import errors

    for name in errors.__all__:
        assert getattr(ringzero, name) is getattr(errors, name), name
        assert name in ringzero.__all__


def test_importing_ringzero_pulls_in_no_framework() -> None:
    import subprocess
    import sys

    frameworks = "('langgraph', 'langchain_core', 'crewai', 'ray', 'psycopg', 'mcp')"
    code = f"import sys, ringzero; print(sorted(m for m in {frameworks} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_core_imports_no_backend() -> None:
    """Core names protocols only: ``ringzero.defaults``, installed by the package, says which
    backend stands behind each. Read from the source, function-level imports included."""
    import ast
    from pathlib import Path

    core = Path(ringzero.__file__).parent / "core"
    reached = {}
    for module in sorted(core.glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                if name.startswith(("ringzero.checkpointers", "ringzero.providers", "ringzero.adapters",
                                    "ringzero.agents", "ringzero.defaults", "ringzero.testing")):
                    reached[f"{module.name}:{node.lineno}"] = name
    assert reached == {}, reached


async def test_a_program_may_install_its_own_default_backends(tmp_path: Path) -> None:
    from ringzero.checkpointers import MemoryCheckpointer
    from ringzero.core.support import backends
    from ringzero.defaults import BuiltInBackends

    class InMemory(BuiltInBackends):
        def checkpointer(self, spec: object, state_dir: Path) -> MemoryCheckpointer:
            return MemoryCheckpointer()

    backends.install(InMemory())
    try:
        async with ringzero.Kernel(state_dir=tmp_path) as kernel:
            assert isinstance(kernel.checkpointer, MemoryCheckpointer)
    finally:
        backends.install(BuiltInBackends())
    assert not (tmp_path / "state.db").exists()


async def test_a_checkpointer_declaring_append_without_its_methods_is_refused_when_the_kernel_is_built(
        tmp_path: Path) -> None:
    """A capability is a promise of methods: one that is missing is named when the kernel is
    built, not found at the first write that needs it."""
    import dataclasses

    from ringzero.checkpointers import MemoryCheckpointer
    from ringzero.core.contract.errors import InvalidArgument

    class Promises(MemoryCheckpointer):
        capabilities = dataclasses.replace(MemoryCheckpointer.capabilities, append=True)

    with pytest.raises(InvalidArgument, match=r"declares capabilities.append but has no append, append_many, "
                                              r"append_writes \(implement it, or leave the capability off\)"):
        ringzero.Kernel(checkpointer=Promises(), state_dir=tmp_path)


async def test_a_checkpointer_named_by_a_string_is_the_one_the_name_says(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``memory`` keeps nothing after the process (no file called ``memory``); ``sqlite:///path``
    is that file; another scheme is refused with the list, rather than taken for a file path."""
    from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer, open_checkpointer
    from ringzero.core.contract.errors import InvalidArgument

    monkeypatch.chdir(tmp_path)

    async def hello(ctx: ringzero.Context) -> str:
        return "hi"

    async with ringzero.Kernel(checkpointer="memory", state_dir=tmp_path / "state") as kernel:
        assert isinstance(kernel.checkpointer, MemoryCheckpointer)
        assert await (await kernel.spawn(hello)).wait() == "hi"
    assert sorted(os.listdir(tmp_path)) == [], "a file was made for an in-memory store"

    db = tmp_path / "urls" / "x.db"
    os.mkdir(db.parent)
    store = open_checkpointer(f"sqlite:///{db}")
    assert isinstance(store, SqliteCheckpointer) and store.path == db
    async with ringzero.Kernel(checkpointer=store) as kernel:
        assert await (await kernel.spawn(hello)).wait() == "hi"
    assert "x.db" in os.listdir(db.parent)

    for name in ("redis://localhost/0", "mysql://db/x"):
        with pytest.raises(InvalidArgument, match=r"no checkpointer is installed for \w+://; the schemes installed "
                                                  r"are sqlite://, postgresql://"):
            ringzero.Kernel(checkpointer=name)
    with pytest.raises(InvalidArgument, match="names a host"):
        open_checkpointer("sqlite://relative.db")
    assert sorted(os.listdir(tmp_path)) == ["urls"], "a refused name made a file"


async def test_ctx_send_takes_the_handle_ctx_spawn_returned(tmp_path: Path) -> None:
    """As ``ctx.wait`` does: a program keeps the handle, not the pid."""
    from ringzero.testing import MemoryCheckpointer

    async def child(ctx: ringzero.Context) -> object:
        return await ctx.recv()

    async def parent(ctx: ringzero.Context) -> object:
        handle = await ctx.spawn(child)
        await ctx.send(handle, {"hello": "child"})
        return await ctx.wait(handle)

    async with ringzero.Kernel(checkpointer=MemoryCheckpointer()) as kernel:
        assert await (await kernel.spawn(parent)).wait() == {"hello": "child"}
        waiting = await kernel.spawn(child)
        await kernel.send(waiting, "from outside")  # the kernel's send takes a handle too
        assert await waiting.wait() == "from outside"


class OnlyWhatEveryStoreNeeds:
    """A Checkpointer with no optional method (no ``claim``, ``delete_checkpoints``, ``put_many``,
    ``append``), over a MemoryCheckpointer."""

    capabilities = ringzero.CheckpointerCapabilities(durable=False)

    def __init__(self) -> None:
        from ringzero.checkpointers import MemoryCheckpointer

        self.rows = MemoryCheckpointer()
        self.put, self.put_writes, self.get = self.rows.put, self.rows.put_writes, self.rows.get
        self.list, self.delete_thread, self.aclose = self.rows.list, self.rows.delete_thread, self.rows.aclose


async def test_a_store_without_the_optional_methods_runs_a_kernel(tmp_path: Path) -> None:
    """``claim`` and ``delete_checkpoints`` are optional, as documented: a store without them
    (and without the capabilities that need them) is refused nowhere."""
    async def hello(ctx: ringzero.Context) -> str:
        return await ctx.tool(str.upper, "hi")  # type: ignore[arg-type]

    async with ringzero.Kernel(checkpointer=OnlyWhatEveryStoreNeeds(), monitor_interval=None) as kernel:  # type: ignore[arg-type]
        assert await (await kernel.spawn(hello)).wait() == "HI"


def test_a_backend_missing_members_is_refused_naming_them_and_their_capability() -> None:
    """Each missing member is named, with the capability that needs it where it is optional,
    and the whole message is there (not cut mid-word)."""
    from ringzero.checkpointers import MemoryCheckpointer
    from ringzero.core.contract.errors import InvalidArgument
    from ringzero.providers.executors.monty import MontyExecutor
    from ringzero.providers.schedulers.local import LocalScheduler
    from ringzero.testing import ScriptedProvider

    class NoClose(OnlyWhatEveryStoreNeeds):
        def __init__(self) -> None:
            super().__init__()
            del self.aclose

    class ClaimsWithoutClaim(OnlyWhatEveryStoreNeeds):
        capabilities = ringzero.CheckpointerCapabilities(durable=False, claims=True)

    class Executor:
        capabilities = MontyExecutor.capabilities

        async def run(self, code: str, **given: object) -> ringzero.ExecResult:
            return ringzero.ExecResult()

    class Scheduler:
        capabilities = LocalScheduler.capabilities
        acquire, release = LocalScheduler.acquire, LocalScheduler.release

    class Provider:
        async def complete(self, request: ringzero.LLMRequest) -> ringzero.LLMResponse:
            raise NotImplementedError

    name = f"{__name__}.test_a_backend_missing_members_is_refused_naming_them_and_their_capability.<locals>"
    cases = [
        (dict(checkpointer=NoClose()), f"checkpointer {name}.NoClose is not a ringzero Checkpointer: it has no aclose "
         "(every Checkpointer needs capabilities, put, put_writes, get, list, delete_thread, aclose)"),
        (dict(checkpointer=ClaimsWithoutClaim()), "it declares capabilities.claims but has no claim (implement it, "
         "or leave the capability off)"),
        (dict(checkpointer=MemoryCheckpointer(), executor=Executor()), f"executor {name}.Executor is not a ringzero "
         "Executor: it has no aclose (every Executor needs capabilities, run, aclose)"),
        (dict(checkpointer=MemoryCheckpointer(), scheduler=Scheduler()), "it has no should_yield (every Scheduler "
         "needs capabilities, acquire, release, should_yield)"),
        (dict(checkpointer=MemoryCheckpointer(), llm=Provider()), f"llm {name}.Provider is not a ringzero LLMProvider: "
         "it has no capabilities (every LLMProvider needs capabilities, complete)"),
        (dict(checkpointer=MemoryCheckpointer(), llm={"fast": ScriptedProvider(["x"]), "slow": Provider()}),
         "it has no capabilities"),
    ]
    for given, words in cases:
        with pytest.raises(InvalidArgument) as refused:
            ringzero.Kernel(monitor_interval=None, **given)  # type: ignore[arg-type]
        assert words in str(refused.value), str(refused.value)
        assert str(refused.value).endswith(" and its conformance kit, ringzero.compat"), str(refused.value)


@pytest.mark.parametrize("old", ["ringzero.core.protocols", "ringzero.core.types", "ringzero.core.errors"])
def test_a_module_that_moved_still_imports_with_a_warning_naming_the_new_path(old: str) -> None:
    """A backend written against ``ringzero.core.protocols`` (and ``types``, ``errors``) failed at
    import once they moved into ``ringzero.core.contract``: each old path answers again, with a
    ``DeprecationWarning`` that says where the name lives now."""
    import ringzero.protocols

    module = importlib.import_module(old)
    names = {"ringzero.core.protocols": "Checkpointer", "ringzero.core.types": "Checkpoint",
             "ringzero.core.errors": "RingzeroError"}
    with pytest.warns(DeprecationWarning, match=f"import {names[old]} from ringzero.protocols"):
        found = getattr(module, names[old])
    assert found is getattr(ringzero.protocols, names[old])
    with pytest.raises(AttributeError, match=r"moved to ringzero\.protocols"):
        module.NoSuchName  # noqa: B018 - the lookup is what is tested


def _opened_by_each_entry_point(url: str) -> dict[str, Path | None]:
    """The SQLite file each entry point opens for ``url`` (None: an in-memory store)."""
    from ringzero import cli
    from ringzero.adapters.langgraph import KernelSaver
    from ringzero.checkpointers import open_checkpointer

    def file(store: object) -> Path | None:
        path = getattr(store, "path", None)
        return None if path is None else Path(path).absolute()

    saver = KernelSaver.from_conn_string(url)
    try:
        opened = {"open_checkpointer": file(open_checkpointer(url)),
                  "Kernel(checkpointer=...)": file(ringzero.Kernel(checkpointer=url).checkpointer),
                  "KernelSaver.from_conn_string": file(saver.checkpointer)}
    finally:
        saver.close()
    try:
        opened["--db"] = file(cli._store(cli._database(url)))
    except ringzero.InvalidArgument:
        opened["--db"] = None  # a store that keeps nothing is refused by the commands
    return opened


SQLITE_URLS = [  # (url, the file it names relative to the working folder; None: in memory)
    ("sqlite:///state.db", "state.db"),
    ("sqlite:///sub/state.db", "sub/state.db"),
    ("sqlite:////{here}/absolute.db", "absolute.db"),
    ("plain.db", "plain.db"),
    ("sqlite://", None),
    ("sqlite:///:memory:", None),
]


@pytest.mark.parametrize(("url", "named"), SQLITE_URLS)
def test_every_entry_point_reads_a_sqlite_url_as_sqlalchemy_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 url: str, named: str | None) -> None:
    """``sqlite:///x.db`` named two files: the CLI's ``./x.db`` and the kernel's ``/x.db`` (as
    root, the state went to the filesystem's root). Now every entry point reads SQLAlchemy's
    grammar: three slashes and a relative path, four for an absolute one."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    opened = _opened_by_each_entry_point(url.format(here=str(tmp_path).lstrip("/")))
    expected = None if named is None else tmp_path / named
    assert set(opened.values()) == {expected}, opened


@pytest.mark.parametrize(("url", "says"), [
    ("sqlite://state.db", "names a host"),
    ("sqlite:///", "names a folder"),
    ("sqlite:///state.db?mode=ro", "takes no options"),
    ("sqlite:///{here}/elsewhere/state.db", "write sqlite:////"),
])
def test_a_sqlite_url_that_cannot_be_read_one_way_is_refused_naming_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, says: str) -> None:
    """The last: the three-slash form an earlier release read as absolute, where that folder
    exists and the relative one does not; it is refused, naming the four-slash form."""
    from ringzero.checkpointers import open_checkpointer

    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    url = url.format(here=str(tmp_path).lstrip("/"))
    with pytest.raises(ringzero.InvalidArgument, match=re.escape(says)):
        open_checkpointer(url)
    from ringzero import cli

    with pytest.raises(ringzero.InvalidArgument, match=re.escape(says)):
        cli._database(url)
    assert os.listdir(tmp_path / "elsewhere") == []
