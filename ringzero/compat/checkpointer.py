"""The Checkpointer conformance kit: what every Checkpointer must do, run against yours.

Subclass ``CheckpointerConformance`` and provide a ``checkpointer`` fixture that yields a
fresh, empty instance of your backend (and closes it afterwards)::

    class TestMyCheckpointer(CheckpointerConformance):
        @pytest_asyncio.fixture
        async def checkpointer(self):
            store = MyCheckpointer()
            yield store
            await store.aclose()

Needs pytest-asyncio. Optional behaviour is tested only where ``capabilities`` declares it.
A store that declares ``multi_process`` and ``claims`` (several kernels share it, each opening
its own instance) also gives the kit an ``open_again`` fixture: a callable that returns a new
instance over the same storage as ``checkpointer``, as another kernel would open it; the kit
races claims across such instances, where one client could hide a claim that is not atomic by
serializing the calls itself::

        @pytest.fixture
        def open_again(self, checkpointer):
            return lambda: MyCheckpointer(checkpointer.url)
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ringzero.core.contract.protocols import Appending, Batching, Checkpointer, backend_problems
from ringzero.core.contract.types import JSON, Checkpoint, PendingWrite

__all__ = ["CheckpointerConformance", "claims_race_across_instances"]


def cp(thread: str, cid: str, ns: str = "", **meta: JSON) -> Checkpoint:
    return Checkpoint(thread_id=thread, namespace=ns, id=cid, payload=cid.encode(), metadata=meta)


async def _stores_each_in_order(checkpointer: Checkpointer, write_many: Any) -> None:
    """``put_many`` or ``append_many``: nothing for none; each checkpoint, the later of two with
    one address winning; a second call after the first."""
    await write_many([])
    assert await checkpointer.get("t") is None
    await write_many([cp("t", "1", step=1), cp("t", "2", ns="sub"), cp("u", "1"),
                      Checkpoint("t", "", "1", b"again", metadata={"step": 2})])  # the later one wins
    await write_many([cp("t", "3")])
    first = await checkpointer.get("t", "", "1")
    assert first is not None and first.payload == b"again" and first.metadata == {"step": 2}
    assert [c.id async for c in checkpointer.list("t", "")] == ["3", "1"]
    assert [c.id async for c in checkpointer.list("t", "sub")] == ["2"]
    assert (await checkpointer.get("u")) is not None


@pytest.mark.asyncio
class CheckpointerConformance:
    """Addressing, latest-by-id, replacement, newest-first listing with filter/before/limit,
    writes returned with their checkpoint, deletion, and (where declared) atomic claims,
    ``put_many`` and ``append``/``append_many``/``append_writes``."""

    async def test_it_is_a_checkpointer(self, checkpointer: Checkpointer) -> None:
        """What ``Kernel(checkpointer=...)`` checks: every member of the protocol is there, each
        method a declared capability needs too, and claims wherever several kernels may share it."""
        assert backend_problems(checkpointer, Checkpointer) == []

    async def test_parent_links_make_the_history(self, checkpointer: Checkpointer) -> None:
        """Each checkpoint keeps the id of the one it followed (``parent_id``): walking back from
        the latest is the thread's history, as LangGraph's ``get_state_history`` walks it."""
        parent = None
        for cid in ("1", "2", "3"):
            await checkpointer.put(Checkpoint("t", "", cid, cid.encode(), parent_id=parent))
            parent = cid
        history, at = [], await checkpointer.get("t")
        while at is not None:
            history.append(at.id)
            at = None if at.parent_id is None else await checkpointer.get("t", "", at.parent_id)
        assert history == ["3", "2", "1"], "parent links were lost"
        assert [(c.id, c.parent_id) async for c in checkpointer.list("t")] == [("3", "2"), ("2", "1"), ("1", None)]

    async def test_list_of_every_thread_is_newest_id_first(self, checkpointer: Checkpointer) -> None:
        """Across threads and namespaces, ``list()`` orders by id, greatest first (ties: thread,
        then namespace, greatest first)."""
        await checkpointer.put(cp("t", "002"))
        await checkpointer.put(cp("u", "003"))
        await checkpointer.put(cp("t", "001", ns="sub"))
        await checkpointer.put(cp("a", "002"))
        assert [(c.thread_id, c.id) async for c in checkpointer.list()] == [
            ("u", "003"), ("t", "002"), ("a", "002"), ("t", "001")]

    async def test_put_over_an_existing_address_keeps_its_writes(self, checkpointer: Checkpointer) -> None:
        """Writes belong to the address, not to one version of the checkpoint stored there."""
        await checkpointer.put(cp("t", "1"))
        await checkpointer.put_writes("t", "", "1", [PendingWrite("task", "c", b"v")])
        await checkpointer.put(Checkpoint("t", "", "1", b"again"))
        got = await checkpointer.get("t")
        assert got is not None and got.payload == b"again" and [w.value for w in got.writes] == [b"v"]

    async def test_delete_thread_removes_its_writes_too(self, checkpointer: Checkpointer) -> None:
        """A thread deleted and begun again under the same ids starts with no writes."""
        await checkpointer.put(cp("t", "1"))
        await checkpointer.put_writes("t", "", "1", [PendingWrite("task", "c", b"old")])
        await checkpointer.delete_thread("t")
        await checkpointer.put(cp("t", "1"))
        got = await checkpointer.get("t")
        assert got is not None and got.writes == (), "delete_thread left the thread's writes behind"

    async def test_get_returns_the_latest_or_the_named_checkpoint(self, checkpointer: Checkpointer) -> None:
        assert await checkpointer.get("t") is None
        for cid in ("001", "003", "002"):
            await checkpointer.put(cp("t", cid))
        latest = await checkpointer.get("t")
        assert latest is not None and latest.id == "003" and latest.payload == b"003"
        named = await checkpointer.get("t", "", "002")
        assert named is not None and named.payload == b"002"
        assert await checkpointer.get("t", "other-namespace") is None

    async def test_put_replaces_a_checkpoint_with_the_same_address(self, checkpointer: Checkpointer) -> None:
        await checkpointer.put(cp("t", "1", step=1))
        await checkpointer.put(Checkpoint("t", "", "1", b"new", metadata={"step": 2}))
        got = await checkpointer.get("t", "", "1")
        assert got is not None and got.payload == b"new" and got.metadata == {"step": 2}

    async def test_list_is_newest_first_with_filter_before_and_limit(self, checkpointer: Checkpointer) -> None:
        for i in range(1, 6):
            await checkpointer.put(cp("t", f"{i:03d}", source="loop" if i % 2 else "input"))
        await checkpointer.put(cp("u", "009"))
        ids = [c.id async for c in checkpointer.list("t")]
        assert ids == ["005", "004", "003", "002", "001"]
        assert [c.id async for c in checkpointer.list("t", filter={"source": "loop"})] == ["005", "003", "001"]
        assert [c.id async for c in checkpointer.list("t", before="004", limit=2)] == ["003", "002"]
        assert [c.id async for c in checkpointer.list(filter={"source": "loop"}, limit=1)] == ["005"]
        assert [c.id async for c in checkpointer.list(filter={"source": "loop", "absent": None})] == []
        assert len([c async for c in checkpointer.list()]) == 6

    async def test_writes_come_back_with_their_checkpoint(self, checkpointer: Checkpointer) -> None:
        await checkpointer.put(cp("t", "1"))
        writes = [PendingWrite("task-a", "messages", b"hello", "", 0), PendingWrite("task-a", "count", b"1", "", 1),
                  PendingWrite("task-a", "__error__", b"first", "", -1)]
        await checkpointer.put_writes("t", "", "1", writes)
        await checkpointer.put_writes("t", "", "1", [PendingWrite("task-a", "count", b"2", "", 1),
                                                     PendingWrite("task-a", "__error__", b"second", "", -1)])
        got = await checkpointer.get("t")
        assert got is not None
        # An ordinary write is kept as first recorded; a special one (negative idx) is replaced.
        assert sorted((w.channel, w.value) for w in got.writes) == [
            ("__error__", b"second"), ("count", b"1"), ("messages", b"hello")]
        listed = [c async for c in checkpointer.list("t")]
        assert [sorted(w.value for w in c.writes) for c in listed] == [[b"1", b"hello", b"second"]]

    async def test_delete_thread_removes_only_that_thread(self, checkpointer: Checkpointer) -> None:
        await checkpointer.put(cp("t", "1"))
        await checkpointer.put(cp("t", "1", ns="sub"))
        await checkpointer.put_writes("t", "", "1", [PendingWrite("x", "c", b"v")])
        await checkpointer.put(cp("keep", "1"))
        await checkpointer.delete_thread("t")
        assert await checkpointer.get("t") is None and await checkpointer.get("t", "sub") is None
        assert await checkpointer.get("keep") is not None

    async def test_delete_thread_matches_the_whole_id_never_a_prefix_or_pattern(self, checkpointer: Checkpointer,
                                                                                ) -> None:
        """``user-1`` is not ``user-10`` (a prefix match deleted both: in a kernel, process 1 took
        process 12 with it), nor is ``a_c`` ``abc`` (SQL ``LIKE``'s wildcards)."""
        ids = ["user-1", "user-10", "user-1/sub", "a_c", "abc", "x%", "xyz"]
        for thread in ids:
            await checkpointer.put(cp(thread, "1"))
        for thread in ("user-1", "a_c", "x%"):
            await checkpointer.delete_thread(thread)
        left = [thread for thread in ids if await checkpointer.get(thread) is not None]
        assert left == ["user-10", "user-1/sub", "abc", "xyz"], (
            f"delete_thread took more than the thread it names: what is left is {left}")

    async def test_delete_checkpoints_removes_exactly_those_with_their_writes(self, checkpointer: Checkpointer) -> None:
        if not checkpointer.capabilities.delete_checkpoints:
            pytest.skip("this checkpointer declares no single-checkpoint deletion")
        for cid in ("1", "2", "3"):
            await checkpointer.put(cp("t", cid))
            await checkpointer.put_writes("t", "", cid, [PendingWrite("task", "c", cid.encode())])
        await checkpointer.delete_checkpoints("t", "", ["1", "3"])
        assert [c.id async for c in checkpointer.list("t")] == ["2"]
        kept = await checkpointer.get("t", "", "2")
        assert kept is not None and [w.value for w in kept.writes] == [b"2"]
        await checkpointer.put(cp("t", "1"))  # a re-used id starts with no stale writes
        again = await checkpointer.get("t", "", "1")
        assert again is not None and again.writes == ()

    async def test_put_many_stores_each_in_order(self, checkpointer: Checkpointer) -> None:
        if not checkpointer.capabilities.put_many:
            pytest.skip("this checkpointer declares no put_many")
        assert isinstance(checkpointer, Batching), "it declares put_many and has no put_many()"
        await _stores_each_in_order(checkpointer, checkpointer.put_many)

    async def test_append_stores_as_put_does_and_later_reads_and_writes_come_after_it(
            self, checkpointer: Checkpointer) -> None:
        if not checkpointer.capabilities.append:
            pytest.skip("this checkpointer declares no append")
        assert isinstance(checkpointer, Appending), "it declares append and lacks an append method"
        append = checkpointer.append
        await append(cp("t", "1", step=1))
        await append(Checkpoint("t", "", "2", b"two", parent_id="1"))
        got = await checkpointer.get("t")
        assert got is not None and (got.id, got.payload, got.parent_id) == ("2", b"two", "1")
        assert [c.id async for c in checkpointer.list("t", filter={"step": 1})] == ["1"]
        await append(cp("u", "1"))
        await checkpointer.put(Checkpoint("u", "", "1", b"put after"))  # the later write wins
        await append(cp("v", "1"))
        await checkpointer.delete_thread("v")  # and a delete after an append deletes it
        replaced = await checkpointer.get("u", "", "1")
        assert replaced is not None and replaced.payload == b"put after"
        assert await checkpointer.get("v") is None

    async def test_append_many_stores_each_in_order_as_put_many_does(self, checkpointer: Checkpointer) -> None:
        if not checkpointer.capabilities.append:
            pytest.skip("this checkpointer declares no append")
        assert isinstance(checkpointer, Appending), "it declares append and lacks an append method"
        await _stores_each_in_order(checkpointer, checkpointer.append_many)
        await checkpointer.put(Checkpoint("u", "", "1", b"put after"))  # a later put wins over an append
        replaced = await checkpointer.get("u", "", "1")
        assert replaced is not None and replaced.payload == b"put after"

    async def test_append_writes_stores_as_put_writes_does(self, checkpointer: Checkpointer) -> None:
        if not checkpointer.capabilities.append:
            pytest.skip("this checkpointer declares no append")
        assert isinstance(checkpointer, Appending), "it declares append and lacks an append method"
        append, append_writes = checkpointer.append, checkpointer.append_writes
        await append(cp("t", "1"))
        await append_writes("t", "", "1", [PendingWrite("a", "out", b"first"),
                                           PendingWrite("a", "__error__", b"e1", idx=-1)])
        await append_writes("t", "", "1", [PendingWrite("a", "out", b"second"),  # an ordinary write is kept first
                                           PendingWrite("a", "__error__", b"e2", idx=-1)])  # a special one replaces
        await append_writes("t", "", "1", [])
        got = await checkpointer.get("t", "", "1")
        assert got is not None
        assert sorted((w.task_id, w.channel, w.value, w.idx) for w in got.writes) == [
            ("a", "__error__", b"e2", -1), ("a", "out", b"first", 0)]
        await append_writes("t", "", "1", [PendingWrite("b", "out", b"later")])
        await checkpointer.delete_thread("t")  # a delete after the appends deletes their writes too
        await checkpointer.put(cp("t", "1"))
        again = await checkpointer.get("t", "", "1")
        assert again is not None and again.writes == ()

    async def test_claim_stores_only_where_the_address_is_free(self, checkpointer: Checkpointer) -> None:
        if not checkpointer.capabilities.claims:
            pytest.skip("this checkpointer declares no atomic claim")
        assert await checkpointer.claim(cp("t", "1", owner="first")) is True
        assert await checkpointer.claim(Checkpoint("t", "", "1", b"second", metadata={"owner": "second"})) is False
        kept = await checkpointer.get("t", "", "1")
        assert kept is not None and kept.payload == b"1" and kept.metadata == {"owner": "first"}
        assert await checkpointer.claim(cp("t", "1", ns="other")) is True  # another address

    async def test_of_racing_claims_exactly_one_wins(self, checkpointer: Checkpointer) -> None:
        if not checkpointer.capabilities.claims:
            pytest.skip("this checkpointer declares no atomic claim")
        won = await asyncio.gather(*(checkpointer.claim(Checkpoint("race", "", "7", str(i).encode()))
                                     for i in range(8)))
        assert sorted(won) == [False] * 7 + [True]
        stored = await checkpointer.get("race", "", "7")
        assert stored is not None and stored.payload == str(won.index(True)).encode()

    async def test_of_claims_racing_from_separate_instances_exactly_one_wins(self, checkpointer: Checkpointer,
                                                                            request: pytest.FixtureRequest) -> None:
        """Eight kernels, each with its own instance of the store, claim one pid: one wins. On one
        instance a client that serializes its calls would hide a claim that is not atomic."""
        capabilities = checkpointer.capabilities
        if not capabilities.claims or not capabilities.multi_process:
            pytest.skip("this checkpointer declares no atomic claim shared by several kernels "
                        "(claims and multi_process)")
        try:
            open_again = request.getfixturevalue("open_again")
        except pytest.FixtureLookupError:
            raise AssertionError("the store declares multi_process and claims: give the kit an open_again fixture, "
                                 "a callable that returns a new instance over the same storage as checkpointer "
                                 "(see ringzero.compat.checkpointer)") from None
        await claims_race_across_instances(checkpointer, open_again)


async def claims_race_across_instances(checkpointer: Checkpointer, open_again: Any) -> None:
    """Seven more instances of the store, opened by ``open_again``, and ``checkpointer``: each
    claims one address at once; exactly one wins."""
    others: list[Checkpointer] = []
    try:
        for _ in range(7):
            opened = open_again()
            others.append(await opened if asyncio.iscoroutine(opened) else opened)
        stores = [checkpointer, *others]
        won = await asyncio.gather(*(store.claim(Checkpoint("race-across", "", "12", str(i).encode()))
                                     for i, store in enumerate(stores)))
        assert won.count(True) == 1, (f"{won.count(True)} of 8 instances of the store won one claim: a claim must be "
                                      "atomic in the storage itself, not in one client")
    finally:
        await asyncio.gather(*(other.aclose() for other in others))
