"""A Ctrl-C that lands inside a native extension as it loads (Halide, LiteRT) is still a Ctrl-C.

Two of CPython's ways of reporting it would otherwise turn an interrupt into something else:
- pybind11 wraps an exception raised while a module initialises in `ImportError("initialization
  failed")`, the KeyboardInterrupt its cause, so a caller that falls back on ImportError reports a
  missing dependency;
- a KeyboardInterrupt that passes through code the extension evaluates with `PyRun_String` marks
  the interpreter as interrupted and unhandled even once it is caught, and `python -m` then ends
  the process by SIGINT after the command has returned its status.
"""

from __future__ import annotations


def caused_by_interrupt(exc: BaseException) -> bool:
    """Whether exc is a KeyboardInterrupt or was raised because of one (its cause or context)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def forget_handled_interrupts() -> None:
    """Clears CPython's mark of an unhandled KeyboardInterrupt once the command has handled it.

    The mark is reset at the start of every top-level evaluation, so evaluating `pass` that way
    clears it; its exit status then stands. Elsewhere than CPython there is no such mark.
    """
    try:
        import ctypes

        ctypes.pythonapi.PyRun_SimpleString(b"pass")
    except (ImportError, AttributeError):
        pass
