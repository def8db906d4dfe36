"""KV Lab: measure how LLM inference spends its time and memory on a real vLLM engine."""

from __future__ import annotations

__version__ = "0.2.0"

import atexit  # noqa: E402
import gc  # noqa: E402

# A process that loaded torch and vLLM spends ~3 s at exit in the interpreter's last garbage collection over millions of
# objects (gdb on such an exit: Py_FinalizeEx -> finalize_modules -> gc_collect_main). Handlers run last-registered
# first, so this one runs after every later one (kvlab.services' stop_all, vLLM's shutdowns) and freezes the heap just
# before that final walk, which then skips it: 3.0 -> 0.4 s per exit, measured (an engine's kernel, a lab, a course run).
atexit.register(gc.freeze)

from kvlab import (  # noqa: E402
    caching,
    config,
    exercises,
    experiments,
    grid,
    labs,
    metrics,
    model,
    outliers,
    plots,
    prompts,
    results,
    roofline,
    serving,
    sizing,
    tasks,
    timing,
    traffic,
    widgets,
    workload,
)
from kvlab.config import DEFAULT_MODEL, pick, quick  # noqa: E402
from kvlab.engine import KVCapacity, chat, close_engine, kv_capacity, make_engine  # noqa: E402
from kvlab.envinfo import env_report, print_env  # noqa: E402
from kvlab.errors import KVLabError, show_short_errors  # noqa: E402
from kvlab.model import model_facts, prepare_default_model, resolve_model  # noqa: E402


def setup_notebook() -> None:
    """First call of every notebook: one-sentence errors and plots that render offline and in HTML."""
    from kvlab.plots import use_offline_renderer

    show_short_errors()
    use_offline_renderer()


__all__ = [
    "caching", "config", "exercises", "experiments", "grid", "labs", "metrics", "model", "outliers", "plots", "prompts", "results", "roofline", "serving", "sizing", "tasks", "timing", "traffic",
    "widgets", "workload",
    "DEFAULT_MODEL", "KVCapacity", "KVLabError", "chat", "close_engine", "env_report", "kv_capacity",
    "make_engine", "model_facts", "pick", "prepare_default_model", "print_env", "quick", "resolve_model", "setup_notebook", "show_short_errors",
]
