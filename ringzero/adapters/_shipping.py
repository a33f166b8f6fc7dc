"""Shipping a tool's code into a sandbox, shared by the LangChain and CrewAI adapters.

A sandboxed tool's body runs in an executor, not in the host: its source is taken from the
function (or from a tool class's ``_run`` method, ``self`` removed), its decorators and type
annotations stripped, and it is refused *when wrapping* if it could not run on its own there
(closures, module-level names other than imported modules, code without source, methods that
use ``self``). An ``async def`` body ships as well: the sandbox runs it with ``asyncio.run``; a
module the body uses through a module-level import is imported again in the sandbox.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import textwrap
import types
import typing
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

from ringzero.core.context import Context
from ringzero.core.contract.errors import InvalidArgument, ToolFailed
from ringzero.core.contract.outcomes import Failure, exception_of
from ringzero.core.contract.protocols import Executor
from ringzero.core.routing import route, route_sync
from ringzero.core.support.loops import LoopHome

__all__ = ["ExecutorChoice", "call_code", "check_parameters", "raise_as_raised", "run_shipped", "shippable_call",
           "shippable_source"]

T = TypeVar("T")

ARGUMENTS = "ringzero_tool_arguments"
"""The input that carries a sandboxed call's keyword arguments into the sandbox."""
POSITIONAL = "ringzero_tool_positional"
"""The input that carries its positional arguments (a single-input tool's one string)."""

HOST_PARAMETERS = ("callbacks", "run_manager")
"""Parameter names LangChain fills with its own host objects at call time."""


class ExecutorChoice:
    """The executor a tool runs in: the one it was given; else, inside a kernel process, the
    kernel's (so ``Kernel(executor=...)`` decides for a whole graph or crew); else a Monty
    executor of its own, started when first needed.

    Outside a kernel process the executor lives on the choice's one loop (``home``): sync
    calls from any thread and async calls from any loop run there. ``close()`` stops that
    loop's thread and the Monty executor the choice made (a given one is the caller's)."""

    def __init__(self, given: Executor | str | None, owner: str) -> None:
        self._own: Executor | None = None
        self.given: Executor | None = None
        if isinstance(given, str):  # a name (``EXECUTOR_NAMES``): an executor of that kind, owned here
            from ringzero.providers.executors import executor_named

            self.given = self._own = executor_named(given)
        elif given is not None and not isinstance(given, Executor):
            raise InvalidArgument(f"executor= takes a ringzero Executor (e.g. ProcessExecutor()) or one of the names "
                                  f"'monty', 'process', 'microsandbox', not {type(given).__name__} {given!r:.60}")
        else:
            self.given = given
        self.home = LoopHome(owner)

    def get(self) -> Executor:
        if self.given is not None:
            return self.given
        ctx = Context.current()
        if ctx is not None:
            return ctx.executor
        if self._own is None:
            from ringzero.providers.executors.monty import MontyExecutor

            self._own = MontyExecutor()
        return self._own

    async def run(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Await ``make()``: inside a kernel process on its loop, else on the home loop."""
        return await route(lambda ctx: make(), make, self.home)

    def run_sync(self, make: Callable[[], Coroutine[Any, Any, T]], what: str) -> T:
        """``run`` for sync callers: on the kernel's loop inside a process, else the home loop."""
        return route_sync(lambda ctx: make(), make, self.home, what)

    def close(self) -> None:
        own, self._own = self._own, None
        if own is not None and not self.home.closed:
            self.home.run_sync(own.aclose(), f"closing {self.home.owner}")
        self.home.close()

    async def aclose(self) -> None:
        own, self._own = self._own, None
        if own is not None and not self.home.closed:
            await self.home.run(own.aclose())
        await self.home.aclose()


def call_code(source: str, function_name: str, *, positional: bool = False, is_async: bool = False) -> str:
    """The code a sandbox runs for one call: the function, then the call with the shipped
    arguments (keyword ones, and with ``positional`` the positional ones before them); an
    ``async def`` body is run to its end with ``asyncio.run``, as a sync call of it would be."""
    call = f"{function_name}(*{POSITIONAL}, **{ARGUMENTS})" if positional else f"{function_name}(**{ARGUMENTS})"
    if is_async:
        return f"import asyncio\n{source}\nasyncio.run({call})"
    return f"{source}\n{call}"


def shippable_call(fn: Callable[..., Any], *, method: bool = False, host_types: tuple[Any, ...] = (),
                   optional: tuple[str, ...] = ()) -> str:
    """The call code of ``fn`` (a function, or with ``method`` a tool class's ``_run``/``_arun``),
    positional arguments and ``async def`` included; refused now (``InvalidArgument``) if it
    cannot run on its own in a sandbox (``shippable_source``, ``check_parameters``)."""
    source = shippable_source(fn, method=method)
    check_parameters(fn, host_types, optional)
    return call_code(source, fn.__name__, positional=True, is_async=inspect.iscoroutinefunction(fn))


def raise_as_raised(failed: ToolFailed) -> NoReturn:
    """Raise what the body raised in the sandbox: a built-in exception (``ValueError``,
    ``FileNotFoundError``) as itself, as the host function would have raised it; any other as
    ``failed`` (a framework turns it into its own tool error)."""
    raised = exception_of(Failure(failed.error_type, failed.error_message))
    if type(raised).__module__ == "builtins":
        raise raised from failed
    raise failed


async def run_shipped(executor: Executor, code: str, arguments: Mapping[str, Any], tool: str,
                      positional: Sequence[Any] = ()) -> Any:
    """Run a shipped call; an exception inside the sandbox comes back as ToolFailed naming its type."""
    inputs: dict[str, Any] = {ARGUMENTS: dict(arguments)}
    if "*" + POSITIONAL in code:
        inputs[POSITIONAL] = list(positional)
    result = await executor.run(code, inputs=inputs)
    if result.error is not None:
        raise ToolFailed(tool, result.error.type, result.error.message)
    return result.value


def shippable_source(fn: Callable[..., Any], *, method: bool = False) -> str:
    """The function's own source, decorators removed, if it can run with nothing but itself.

    ``method=True`` takes a method (a tool class's ``_run``): its first parameter is removed,
    and a body that uses it is refused, since the tool object does not exist in the sandbox.
    """
    name = getattr(fn, "__name__", repr(fn))
    if name == "<lambda>":
        raise InvalidArgument("a lambda has no source to ship; define the tool with def")
    closure = getattr(getattr(fn, "__code__", None), "co_freevars", ())
    if closure:
        raise InvalidArgument(f"{name} uses {', '.join(closure)} from an enclosing function; a sandboxed "
                              "tool must be self-contained (pass them as arguments instead)")
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise InvalidArgument(f"the source of {name} is not available to ship into the sandbox") from exc
    tree = ast.parse(source)
    func = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name),
                None)
    if func is None:
        raise InvalidArgument(f"could not find the definition of {name} in its source")
    func.decorator_list = []
    if method:
        _drop_self(func, getattr(fn, "__qualname__", name))
    _strip_annotations(func)  # types are for the schema (already taken); the sandbox needs none of them
    module_globals = getattr(fn, "__globals__", {})
    outside = _module_level_names(func, module_globals)
    modules = {n: module_globals[n] for n in outside if isinstance(module_globals[n], types.ModuleType)}
    outside -= modules.keys()
    if outside:
        raise InvalidArgument(f"{name} uses module-level {', '.join(sorted(outside))}, which does not exist in "
                              "the sandbox; import or define it inside the function")
    # A module the body uses by a module-level import is imported again where it runs, as
    # the refusal above asks a user to do by hand (a module the sandbox lacks fails there).
    imports = "".join(f"import {m.__name__}\n" if n == m.__name__ else f"import {m.__name__} as {n}\n"
                      for n, m in sorted(modules.items()))
    return imports + ast.unparse(func)


def _drop_self(func: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str) -> None:
    if not func.args.args:
        raise InvalidArgument(f"{qualname} takes no self parameter; it cannot be shipped as a tool method")
    me = func.args.args.pop(0).arg
    if any(isinstance(node, ast.Name) and node.id == me for node in ast.walk(func)):
        raise InvalidArgument(f"{qualname} uses {me}; the tool object does not exist in the sandbox, so its "
                              "body may use only its arguments")


def _strip_annotations(func: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    func.returns = None
    every = [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs, func.args.vararg, func.args.kwarg]
    for arg in every:
        if arg is not None:
            arg.annotation = None
    for node in ast.walk(func):
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            node.annotation = ast.Constant(None)  # `x: T = v` keeps its value; the type is inert


def _module_level_names(func: ast.FunctionDef | ast.AsyncFunctionDef, module_globals: dict[str, Any]) -> set[str]:
    """Names the function reads that only its module defines."""
    bound = {a.arg for a in ast.walk(func.args) if isinstance(a, ast.arg)} | {func.name}
    loaded: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif node is not func and (name := _defined_name(node)):
            bound.add(name)  # inner definitions, `except ... as name`
    return {n for n in loaded - bound if n in module_globals and not hasattr(builtins, n)}


def _defined_name(node: ast.AST) -> str | None:
    """The name an inner definition binds (a function, a class, ``except ... as name``)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler)):
        return node.name or None
    return None


_JSON_LEAVES = (str, int, float, bool, type(None), list, dict, tuple)
_JSON_CONTAINERS = (list, dict, tuple, set, frozenset, typing.Union, types.UnionType, typing.Literal)


def check_parameters(fn: Callable[..., Any], host_types: tuple[Any, ...] = (), optional: tuple[str, ...] = ()) -> None:
    """Refuse, when wrapping, a function whose arguments could not cross into a sandbox: one that
    takes a framework's host object (callbacks or a run manager: ``HOST_PARAMETERS``; a config,
    an injected runtime or store: an annotation, or ``Annotated`` marker, among ``host_types``),
    or an argument whose type is not JSON (a pydantic model, an enum, a class of yours): the
    sandbox gets JSON, and the body would find a dict where it expects an object. A parameter in
    ``optional`` with a default is left out of that check: the sandboxed call never passes it
    (a tool class's ``run_manager=None``), so the body gets its default."""
    name = getattr(fn, "__name__", repr(fn))
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # annotations that do not resolve here: the names are still checked
        hints = {}
    for parameter in inspect.signature(fn).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) or (
                parameter.name in optional and parameter.default is not parameter.empty):
            continue
        hint = hints.get(parameter.name, Any)
        markers = typing.get_args(hint)[1:] if typing.get_origin(hint) is typing.Annotated else ()
        base = typing.get_args(hint)[0] if markers else hint
        if parameter.name in HOST_PARAMETERS or _among(base, host_types) or any(_among(m, host_types)
                                                                                for m in markers):
            raise InvalidArgument(f"{name} takes {parameter.name}, which its framework fills with a host object "
                                  "at call time; such an object cannot enter the sandbox")
        if not _json_type(base):
            raise InvalidArgument(f"{name} takes {parameter.name} of type {getattr(base, '__name__', base)}, which is "
                                  "not JSON: the sandbox gets JSON, so give the tool JSON arguments (str, numbers, "
                                  "lists, dicts)")


def _among(value: Any, kinds: tuple[Any, ...]) -> bool:
    """``value`` is one of ``kinds``, a subclass of one, or an instance of one."""
    for kind in kinds:
        if value is kind:
            return True
        try:
            if isinstance(kind, type) and (isinstance(value, kind) or (isinstance(value, type)
                                                                       and issubclass(value, kind))):
                return True
        except TypeError:  # a TypedDict (RunnableConfig) answers no class checks: only ``is`` above
            continue
    return False


def _json_type(hint: Any) -> bool:
    if hint is Any or hint is object or hint in _JSON_LEAVES:
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return all(isinstance(value, (str, int, float, bool, type(None))) for value in typing.get_args(hint))
    if origin is typing.Annotated:
        return _json_type(typing.get_args(hint)[0])
    if origin in _JSON_CONTAINERS or origin in (Sequence, Mapping, list, dict):
        return all(arg is Ellipsis or _json_type(arg) for arg in typing.get_args(hint))
    if typing.is_typeddict(hint):
        return all(_json_type(value) for value in typing.get_type_hints(hint).values())
    return False
