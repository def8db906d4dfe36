"""One exception type whose message is a single sentence saying what was wrong and how to fix it."""

from __future__ import annotations


class KVLabError(Exception):
    """A user-facing error: bad input or a setup problem, explained in one sentence."""


def show_short_errors() -> None:
    """In IPython/Jupyter, show a KVLabError as its one sentence instead of a long traceback."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return

    def _handler(shell, etype, value, tb, tb_offset=None):  # noqa: ANN001 - IPython's signature
        lines = [f"{etype.__name__}: {value}"]
        if hasattr(shell, "_showtraceback"):
            shell._showtraceback(etype, value, lines)
        else:  # plain terminal IPython
            print(lines[0])
        return lines

    shell.set_custom_exc((KVLabError,), _handler)
