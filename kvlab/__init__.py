"""KV Lab: measure how LLM inference spends its time and memory on a real vLLM engine."""

from __future__ import annotations

__version__ = "0.2.0"

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
