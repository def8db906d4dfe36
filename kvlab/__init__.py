"""KV Lab: measure how LLM inference spends its time and memory on a real vLLM engine.

Three layers (README, "Layout"): ``kvlab.runtime`` starts and reads the engine and the services around it;
the topic modules here teach one idea each, with their experiments and figures (lesson → module: DEVELOPERS.md);
``kvlab.course`` builds the course and runs the labs. The names the notebooks call are importable from here
(``from kvlab.runtime import gateway`` for the services, whose web framework is not loaded until asked for).
"""

from __future__ import annotations

import atexit
import gc

# A process that loaded torch and vLLM spends ~3 s at exit in the interpreter's last garbage collection over millions of
# objects (gdb on such an exit: Py_FinalizeEx -> finalize_modules -> gc_collect_main). Handlers run last-registered
# first, so this one runs after every later one (kvlab.runtime.services' stop_all, vLLM's shutdowns) and freezes the
# heap just before that final walk, which then skips it: 3.0 -> 0.4 s per exit, measured (an engine's kernel, a lab,
# a course run).
atexit.register(gc.freeze)

from kvlab import (  # noqa: E402 - after the exit handler, so it runs last
    batching,
    caching,
    chunked_prefill,
    metrics,
    outliers,
    prefill_decode,
    prompts,
    roofline,
    sizing,
    tasks,
    timing,
    traffic,
    variants,
    widgets,
    workload,
)
from kvlab.course import exercises, grid, labs, results  # noqa: E402
from kvlab.runtime import config, engine, hardware, model, serving  # noqa: E402
from kvlab.runtime.claims import claim  # noqa: E402
from kvlab.runtime.config import DEFAULT_MODEL, VERSION, fit_to_time, pick, quick  # noqa: E402
from kvlab.runtime.engine import KVCapacity, chat, close_engine, kv_capacity, kv_groups, make_engine  # noqa: E402
from kvlab.runtime.envinfo import env_report, print_env  # noqa: E402
from kvlab.runtime.errors import KVLabError, show_short_errors  # noqa: E402
from kvlab.runtime.gguf import prepare_default_model  # noqa: E402
from kvlab.runtime.model import resolve_model  # noqa: E402
from kvlab.runtime.notebook import setup_notebook  # noqa: E402
from kvlab.sizing import model_facts  # noqa: E402

__version__ = VERSION

__all__ = [
    "batching", "caching", "chunked_prefill", "config", "engine", "exercises", "grid", "hardware", "labs", "metrics",
    "model", "outliers", "prefill_decode", "prompts", "results", "roofline", "serving", "sizing", "tasks", "timing",
    "traffic", "variants", "widgets", "workload",
    "DEFAULT_MODEL", "KVCapacity", "KVLabError", "chat", "claim", "close_engine", "env_report", "kv_capacity", "kv_groups", "make_engine",
    "fit_to_time", "model_facts", "pick", "prepare_default_model", "print_env", "quick", "resolve_model", "setup_notebook",
    "show_short_errors",
]
