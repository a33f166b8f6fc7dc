"""Which event loop an object lives on, and the one way to reach it from anywhere else.

asyncio state (locks, events, futures, a connection pool, an httpx client) belongs to the loop
it was made on; touched from two loops it hangs or breaks. So every loop-bound ringzero object
(an LLM gate, a ``KernelSaver``, a ``KernelMemoryStore``, an agent's kernel) has one home
loop, a ``LoopHome``:

- An async caller on the home loop runs directly. One on another loop has its coroutine run
  on the home loop and awaits the result there, so the object's state is only ever touched
  from its home.
- A sync caller (LangChain's ``invoke``, CrewAI's worker threads, a sync LangGraph graph)
  sends its coroutine to the home loop and blocks until it is done. An object that no loop is
  using yet lives on the runtime loop: one loop in one thread (``RuntimeLoop``) that every such
  object shares (twenty savers used from sync code are one thread, not twenty), started by the
  first and stopped when the last one closes: no thread outlives the objects that use it.
- What cannot reach its home raises ``WrongEventLoop`` at once instead of hanging: a blocking
  call on the home loop's own thread (it would wait on itself), or a home loop that stopped
  running while the object was busy on it. An idle object whose loop has ended moves to the
  next loop that uses it (a gate used in one ``asyncio.run`` and then another).

``run_on(loop, coro)`` is the single crossing; it also reaches loops ringzero does not own (a
kernel process's loop, from a CrewAI worker thread). That is why this is a module of its own
rather than anyio's ``BlockingPortal``, which reaches only loops it started itself: one call
path serves both cases.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from ringzero.core.contract.errors import Closed, WrongEventLoop
from ringzero.core.support.loop_pool import wait_for_loop
from ringzero.core.support.timeouts import cancel_and_wait

__all__ = ["RUNTIME_LOOP", "Closing", "LoopHome", "LoopThread", "RuntimeLoop", "before_stop", "forward", "on_this_loop",
           "run_on", "running_loop"]

log = logging.getLogger("ringzero.loops")

T = TypeVar("T")
Finish = Callable[[], Awaitable[None]]
Self_ = TypeVar("Self_", bound="Closing")


class Closing:
    """``with`` and ``async with`` for an object that has ``close()`` and ``aclose()``."""

    def close(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    def __enter__(self: Self_) -> Self_:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self: Self_) -> Self_:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def run_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], what: str) -> T:
    """Run ``coro`` on ``loop`` (running in another thread) and block until it is done.

    Called on ``loop``'s own thread it would block the loop it waits for, forever: it refuses
    with ``WrongEventLoop`` instead, naming ``what`` and what to call there.
    """
    if running_loop() is loop:
        coro.close()
        raise WrongEventLoop(f"{what} was called synchronously on the event loop it runs on, which it would "
                             "block forever: await the async variant there, or call it from a worker thread "
                             "(await asyncio.to_thread(...))")
    return wait_for_loop(asyncio.run_coroutine_threadsafe(coro, loop))


async def forward(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on ``loop`` (running in another thread) and await its result from this
    loop; cancelling the awaiting task cancels it there too."""
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


def on_this_loop(callback: Callable[[T], None]) -> Callable[[T], None]:
    """``callback``, made to run on the loop running here whichever thread calls it: what a
    call forwarded to another loop (``forward``) hands over as it goes arrives where the caller
    is, in order, and before the call's result (the result is handed back the same way)."""
    loop = asyncio.get_running_loop()

    def there(value: T) -> None:
        if running_loop() is loop:
            callback(value)
        else:
            loop.call_soon_threadsafe(callback, value)

    return there


class LoopThread:
    """A private event loop running in a daemon thread, from ``start()`` until ``close()``."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    def running_here(self) -> bool:
        """Whether the calling thread is this loop's own."""
        return self._loop is not None and running_loop() is self._loop

    def start(self) -> asyncio.AbstractEventLoop:
        """The running private loop (started now if it is not)."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                running = threading.Event()
                loop.call_soon(running.set)
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                running.wait()  # so that is_running() is true for every caller from now on
                self._loop, self._thread = loop, thread
            return self._loop

    def close(self) -> None:
        """Cancel what still runs on the loop, stop it and join its thread (and the threads of
        its default executor). Idempotent; refused on the loop's own thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop, self._thread = None, None
        if loop is None or thread is None:
            return
        if running_loop() is loop:
            raise WrongEventLoop(f"{self._name} cannot be closed from its own event loop thread")
        asyncio.run_coroutine_threadsafe(_wind_down(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


_BEFORE_STOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, set[weakref.WeakMethod[Finish]]] = \
    weakref.WeakKeyDictionary()
_BEFORE_STOP_LOCK = threading.Lock()
"""Loops register and stop on threads of their own."""


def before_stop(finish: Finish) -> None:
    """Have ``finish()`` (a bound method) awaited on the running loop before a ``LoopThread``
    stops it: work an object deferred to a timer there (a SQLite store's fold of its append log)
    would otherwise go with the loop's timers when the loop's last user closes. Held weakly: an
    object that is gone finishes nothing. A loop that is not a ``LoopThread``'s ends as its owner
    ends it."""
    with _BEFORE_STOP_LOCK:
        entries = _BEFORE_STOP.setdefault(asyncio.get_running_loop(), set())
        entries.add(weakref.WeakMethod(finish, entries.discard))


async def _wind_down() -> None:
    loop = asyncio.get_running_loop()
    with _BEFORE_STOP_LOCK:
        finishing = list(_BEFORE_STOP.pop(loop, ()))
    for reference in finishing:
        finish = reference()
        if finish is None:
            continue
        try:
            await finish()
        except Exception:  # logged; the loop still stops (a store's records stay in its log, folded by its next opener)
            log.exception("finishing deferred work before %s stopped failed", threading.current_thread().name)
    await cancel_and_wait([t for t in asyncio.all_tasks() if t is not asyncio.current_task()])
    await loop.shutdown_asyncgens()
    await loop.shutdown_default_executor()


class RuntimeLoop:
    """The loop thread ringzero's objects share when no loop of their callers' is their home:
    started by the first object that needs it, stopped when the last one lets go of it."""

    def __init__(self, name: str) -> None:
        self._thread = LoopThread(name)
        self._users = 0
        self._lock = threading.Lock()

    def acquire(self) -> asyncio.AbstractEventLoop:
        """The running loop, for one more user."""
        with self._lock:
            self._users += 1
            return self._thread.start()

    def release(self) -> None:
        """One user fewer; the last one stops the loop and joins its thread (refused on the
        loop's own thread, as ``LoopThread.close`` is)."""
        with self._lock:
            if self._users == 1 and self._thread.running_here():
                raise WrongEventLoop("ringzero's runtime loop cannot be stopped from its own thread: close this "
                                     "object from another thread, or await its aclose()")
            self._users -= 1
            if self._users:
                return
            stopping, self._thread = self._thread, LoopThread(self._thread.name)
        stopping.close()  # outside the lock: what winds down there may start the next loop

    @property
    def users(self) -> int:
        return self._users


RUNTIME_LOOP = RuntimeLoop("ringzero-runtime")
"""The one runtime loop of this OS process."""


class LoopHome:
    """The one event loop an object lives on (see the module's docstring).

    ``owner`` names the object in errors. ``idle`` says whether the object holds no state on
    its loop right now (then it may move to another loop once its own is no longer running).
    ``private=True`` makes the runtime loop its home from the first call, whoever makes it: for
    objects that must outlive their callers' loops (an agent's kernel).
    """

    def __init__(self, owner: str, idle: Callable[[], bool] = lambda: True, *, private: bool = False) -> None:
        self.owner = owner
        self._idle = idle
        self._always_private = private
        self.loop: asyncio.AbstractEventLoop | None = None
        self._on_runtime_loop = False
        """This object holds the runtime loop (``RUNTIME_LOOP.acquire``), let go at ``close``."""
        self._closed = False
        self._binding = threading.Lock()

    def _usable_home(self) -> asyncio.AbstractEventLoop | None:
        if self._closed:
            raise Closed(f"{self.owner} is closed")
        home = self.loop
        if home is None or home.is_closed():
            return None
        return home

    def _moved_or_stuck(self, home: asyncio.AbstractEventLoop | None) -> None:
        if home is not None and not self._idle():
            raise WrongEventLoop(f"{self.owner} is busy on an event loop that is no longer running; it cannot "
                                 "be used from another loop until that loop runs again")

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the home loop (from the home loop, or from any other)."""
        try:
            target = self.target()
        except BaseException:
            coro.close()
            raise
        return await coro if target is None else await forward(target, coro)

    def target(self) -> asyncio.AbstractEventLoop | None:
        """For an async caller: ``None`` to run here (this loop is, or now becomes, the home),
        else the running home loop to forward to."""
        running = asyncio.get_running_loop()
        home = self._usable_home()
        if home is running:
            return None
        if home is not None and home.is_running():
            return home
        with self._binding:  # threads may race to give the object its first home
            home = self._usable_home()
            if home is not None and home.is_running():
                return home
            self._moved_or_stuck(home)
            if self._always_private:
                return self._start_private()
            self.loop = running
            return None

    def run_sync(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        """Run ``coro`` on the home loop and block until done (sync callers, any thread)."""
        try:
            home = self._usable_home()
        except Closed:
            coro.close()
            raise
        if home is None or not (home.is_running() or home is running_loop()):
            with self._binding:  # threads may race to give the object its first home
                home = self._usable_home()
                if home is None or not (home.is_running() or home is running_loop()):
                    try:
                        self._moved_or_stuck(home)
                    except WrongEventLoop:
                        coro.close()
                        raise
                    home = self._start_private()
        return run_on(home, coro, what)

    def _start_private(self) -> asyncio.AbstractEventLoop:
        if not self._on_runtime_loop:
            self.loop = RUNTIME_LOOP.acquire()
            self._on_runtime_loop = True
        assert self.loop is not None
        return self.loop

    def close(self) -> None:
        """Let go of the runtime loop, if this object lives on it; later use raises ``Closed``."""
        self._closed = True
        if self._on_runtime_loop:
            self._on_runtime_loop = False
            RUNTIME_LOOP.release()
        self.loop = None

    async def aclose(self) -> None:
        """``close()`` for async callers: the runtime loop's thread, if this was its last user,
        is joined off this loop."""
        self._closed = True
        if self._on_runtime_loop:
            self._on_runtime_loop = False
            await asyncio.to_thread(RUNTIME_LOOP.release)
        self.loop = None

    @property
    def owns_loop(self) -> bool:
        """Whether the home is the runtime loop (running), which this object holds."""
        return self._on_runtime_loop and self.loop is not None and self.loop.is_running()

    @property
    def closed(self) -> bool:
        return self._closed
