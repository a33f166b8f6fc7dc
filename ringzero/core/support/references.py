"""Functions named by reference, ``module:qualname``: how a journaled program, a registered
tool or a ``--kernel`` factory is found again by a later Python process."""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ringzero.core.contract.errors import InvalidArgument, NotAProgram
from ringzero.core.contract.types import ensure_json

__all__ = ["check_program", "import_reference", "importable_reference", "importing", "main_module_name",
           "program_reference", "reference_of", "unguarded_script"]

_IMPORTING: list[str] = []
"""The modules ``import_reference`` is importing now, innermost last."""

GUARD_HINT = ("put the lines that run it (asyncio.run(main()) and the like) under `if __name__ == \"__main__\":`, so "
              "that importing the module only defines its programs and its kernel factory")


def check_program(program: Any, args: Sequence[Any]) -> None:
    """Refuse what is not a program (an ``async def``), or arguments that are not JSON."""
    if not inspect.iscoroutinefunction(program):
        raise NotAProgram(f"a program must be an 'async def' function taking a Context first, not {program!r}")
    ensure_json(list(args), f"the arguments of {getattr(program, '__qualname__', program)}")


def importing() -> str | None:
    """The module ringzero is importing to find a program, a tool or a ``--kernel`` factory
    (None when none): code that runs while it is imported is a script without a main guard."""
    return _IMPORTING[-1] if _IMPORTING else None


def unguarded_script(module: str) -> InvalidArgument:
    """The error of a kernel started while ``module`` is imported to resume its processes."""
    return InvalidArgument(
        f"a Kernel was started while ringzero imported module {module!r} to resume its processes: the module runs "
        f"its agents when it is imported, so resuming would start them again as new processes. In {module!r}, "
        + GUARD_HINT)


def reference_of(obj: Any) -> str:
    """``module:qualname`` of a function or class, importable or not."""
    return f"{obj.__module__}:{obj.__qualname__}"


def importable_reference(obj: Any) -> str | None:
    """``module:qualname`` when another process could import it again: None for functions in
    ``__main__``, local functions and lambdas."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not module or module == "__main__" or "<locals>" in qualname or "<lambda>" in qualname:
        return None
    return f"{module}:{qualname}"


def main_module_name() -> str | None:
    """The name another Python process imports the running script by: ``app`` for ``python
    app.py`` (the script's folder is ``sys.path[0]``) or ``python -m app``; None where there is
    none (a REPL, a notebook, ``python -c``, or a package's ``__main__``, which runs when
    imported)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:
        name = getattr(spec, "name", None)
        return name if name and name != "__main__" and not name.endswith(".__main__") else None
    file = getattr(main, "__file__", None)
    if not file or not sys.path or not sys.path[0]:
        return None
    return _script_module(file, sys.path[0])


@functools.lru_cache(maxsize=8)
def _script_module(file: str, first_path: str) -> str | None:
    """``main_module_name`` for a script file: resolving both paths costs about 100 µs, once
    per (file, ``sys.path[0]``) instead of once per spawn of a program the script defines."""
    script = Path(file).resolve()
    if script.suffix != ".py" or not script.stem.isidentifier() or script.parent != Path(first_path).resolve():
        return None
    return script.stem


def program_reference(program: Any) -> tuple[str, bool]:
    """(``module:qualname`` to record for ``program``, whether a later process can import it).

    A program defined in the running script is recorded under the name the script is imported
    by (``app:agent``, not ``__main__:agent``), so that ``ringzero resume --kernel
    app:make_kernel`` finds it after a crash."""
    reference = importable_reference(program)
    if reference is not None:
        return reference, True
    qualname = getattr(program, "__qualname__", "")
    if getattr(program, "__module__", None) == "__main__" and "<" not in qualname:
        module = main_module_name()
        if module is not None:
            return f"{module}:{qualname}", True
    return reference_of(program), False


def import_reference(reference: str, what: str) -> Any:
    """The object named by ``module:qualname``; InvalidArgument, naming ``what`` and why, if
    it cannot be imported."""
    module_name, colon, qualname = reference.partition(":")
    if not colon or not module_name or not qualname or "<locals>" in qualname:
        raise InvalidArgument(f"{what} {reference!r} is not an importable 'module:qualname' reference")
    _IMPORTING.append(module_name)
    try:
        # The running script under the name it is recorded by (``program_reference``): itself,
        # not a second copy of it imported anew.
        target: Any = sys.modules["__main__"] if module_name == main_module_name() else \
            importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidArgument(f"cannot import {what} {reference!r}: {exc}") from exc
    except Exception as exc:  # the module's own code failed as it was imported
        hint = f"; {GUARD_HINT}" if "running event loop" in str(exc) else ""
        raise InvalidArgument(f"cannot import {what} {reference!r}: importing {module_name!r} raised "
                              f"{type(exc).__name__}: {exc}{hint}") from exc
    finally:
        _IMPORTING.pop()
    return target
