"""Files ringzero reads or makes for the user are the user's: a token file another user planted
(or one others may read) is refused, not served; a blank or short token is refused; a store
file ringzero creates at a path the user names is owner-only under any umask."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ringzero import Kernel
from ringzero.checkpointers import SqliteCheckpointer
from tests.test_cli import ROOT


def mcp(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``ringzero mcp --transport http`` with these arguments: it refuses before it listens."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "RINGZERO_MCP"))}
    return subprocess.run([sys.executable, "-m", "ringzero.cli", "mcp", "--transport", "http", "--port", "1", *args],
                          cwd=cwd, env={**clean, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("planted", ["another user's", "readable by others"])
def test_a_token_file_that_is_not_the_user_s_alone_is_refused_not_served(tmp_path: Path, planted: str) -> None:
    state = tmp_path / "mcp"
    state.mkdir(mode=0o700)
    token = state / "mcp-token"
    token.write_text("a-token-someone-else-knows")
    if planted == "another user's":
        if os.geteuid() != 0:
            pytest.skip("giving a file to another user (chown) needs root")
        os.chown(token, 65534, 65534)
        token.chmod(0o600)
    else:
        token.chmod(0o644)
    out = mcp("--state-dir", str(state), cwd=tmp_path)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "another user may have planted it" in said and str(token) in said, said


@pytest.mark.parametrize("given", [" ", "short-token", "a token with spaces in it"])
def test_a_blank_short_or_spaced_token_is_refused(tmp_path: Path, given: str) -> None:
    out = mcp("--token", given, "--state-dir", str(tmp_path / "mcp"), cwd=tmp_path)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "at least 16 characters" in said, said


async def test_a_store_ringzero_creates_at_a_named_path_is_the_owner_s_alone(tmp_path: Path) -> None:
    """``SqliteCheckpointer("x.db")`` under umask 022 made a 0644 database (and WAL): every
    prompt and tool result readable by other users. A store the user made keeps its modes."""
    previous = os.umask(0o022)
    try:
        async with Kernel(checkpointer=SqliteCheckpointer(tmp_path / "x.db")) as kernel:
            async def hello(ctx: object) -> str:
                return "hi"
            assert await (await kernel.spawn(hello)).wait() == "hi"
            modes = await asyncio.to_thread(lambda: {p.name: stat.S_IMODE(p.stat().st_mode)
                                                     for p in tmp_path.iterdir()})
        mine = tmp_path / "mine.db"
        await asyncio.to_thread(mine.touch, mode=0o640)
        async with Kernel(checkpointer=SqliteCheckpointer(mine)):
            await asyncio.sleep(0)
    finally:
        os.umask(previous)
    assert modes.get("x.db") == 0o600 and all(mode == 0o600 for mode in modes.values()), modes
    assert stat.S_IMODE((await asyncio.to_thread(mine.stat)).st_mode) == 0o640


NEEDS_ROOT = "giving a folder or file to another user (chown) needs root"


def given_to_nobody(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip(NEEDS_ROOT)
    os.chown(path, 65534, 65534)


def test_an_mcp_state_folder_another_user_made_is_refused_with_its_planted_token(tmp_path: Path) -> None:
    """Another user made ``.ringzero`` (and in it ``mcp/mcp-token``, 0600, theirs): the server
    used the folder as found and served their token. Now the folder is refused, named."""
    own = tmp_path / ".ringzero"
    (own / "mcp").mkdir(parents=True)
    (own / "mcp" / "mcp-token").write_text("a-token-someone-else-knows-well")
    (own / "mcp" / "mcp-token").chmod(0o600)
    for path in (own, own / "mcp", own / "mcp" / "mcp-token"):
        given_to_nobody(path)
    out = mcp(cwd=tmp_path)
    said = " ".join((out.stdout + out.stderr).split())
    assert out.returncode != 0 and "belongs to another user" in said and str(own) in said, said
    assert "a-token-someone-else" not in said


STATE = {
    "a .ringzero folder another user made": ".ringzero",
    "a state folder others may write in": "open",
    "a store file another user owns": "theirs.db",
    "a link planted where a store file goes": ".ringzero/state.db",
}


@pytest.mark.parametrize("row", list(STATE))
async def test_a_state_folder_or_file_that_is_not_the_user_s_is_refused_naming_it(tmp_path: Path, row: str) -> None:
    """git's ``safe.directory`` rule for state: what ringzero finds must be the user's, and
    written by no one else; the store is never opened, and the message names what to remove."""
    from ringzero.core.contract.errors import InvalidArgument

    target = tmp_path / STATE[row]
    if row == "a .ringzero folder another user made":
        target.mkdir()
        given_to_nobody(target)
        store = SqliteCheckpointer(target / "state.db", create_folder=True)
        why = "belongs to another user"
    elif row == "a state folder others may write in":
        target.mkdir()
        target.chmod(0o777)
        store = SqliteCheckpointer(target / "state.db", create_folder=True)
        why = "may be written by other users"
    elif row == "a store file another user owns":
        target.write_bytes(b"")
        given_to_nobody(target)
        store = SqliteCheckpointer(target)
        why = "belongs to another user"
    else:
        target.parent.mkdir(mode=0o700)
        elsewhere = tmp_path / "elsewhere.db"
        target.symlink_to(elsewhere)
        store = SqliteCheckpointer(target, create_folder=True)
        why = "is a link"
    with pytest.raises(InvalidArgument, match=why) as refused:
        async with Kernel(checkpointer=store):
            pass
    assert str(target) in str(refused.value)
    if row == "a link planted where a store file goes":
        assert not (tmp_path / "elsewhere.db").exists(), "the link was followed"


def test_what_the_mcp_server_keeps_in_a_state_folder_the_user_names_is_the_owner_s_alone(tmp_path: Path) -> None:
    """``ringzero mcp --state-dir DIR`` under umask 022: the folder, the token and the agent's
    store (database, WAL, shared memory) are the owner's alone, as under ``.ringzero``."""
    from ringzero.agents import CodeAgent
    from ringzero.cli import _mcp_token
    from ringzero.testing import ScriptedProvider

    state = tmp_path / "named" / "mcp-state"
    previous = os.umask(0o022)
    try:
        _mcp_token(None, state)
        with CodeAgent(llm=ScriptedProvider(lambda request: "```python\nfinal_answer(42)\n```"), executor="monty",
                       state_dir=state) as agent:
            assert agent.execute_task("the answer?")[0] == 42
    finally:
        os.umask(previous)
    found = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*")}
    assert any(name.endswith("agent.db") for name in found), found
    wrong = {name: oct(mode) for name, mode in found.items()
             if mode != (0o700 if (tmp_path / name).is_dir() else 0o600)}
    assert wrong == {}, wrong
