"""Course-wide settings read from the environment: quick mode, model choice, folders."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from kvlab.runtime.errors import KVLabError

#: The one version string (pyproject.toml reads it; ``kvlab.__version__`` is this).
VERSION = "0.2.0"
T = TypeVar("T")

#: Name of the default model: SmolLM2-135M-Instruct, prepared offline from PyPI.
DEFAULT_MODEL = "SmolLM2-135M-Instruct"

#: Repository root (the folder holding ``kvlab/``, ``notebooks/`` and ``labs/``).
REPO_ROOT = Path(__file__).resolve().parents[2]

_TRUE = {"1", "true", "yes", "on"}


def quick() -> bool:
    """True when ``KVLAB_QUICK`` is set (CI): sweeps shrink, code paths stay the same."""
    return os.environ.get("KVLAB_QUICK", "").strip().lower() in _TRUE


def pick(full: T, quick_value: T) -> T:
    """Return ``full`` for learners, ``quick_value`` in quick mode: the one switch for sweep sizes."""
    return quick_value if quick() else full


def fit_to_time(options: Sequence[T], seconds_of: Callable[[T], float], target_s: float) -> T:
    """The first of ``options`` (largest first) whose forecast ``seconds_of(option)`` fits ``target_s``, else the
    last (the least a lesson's medians and p95s need): a slower machine runs fewer repeats or shorter decodes."""
    return next((o for o in options if seconds_of(o) <= target_s), options[-1])


def model_name() -> str:
    """The model the course runs on: ``KVLAB_MODEL`` (HF id or local folder) or the default."""
    return os.environ.get("KVLAB_MODEL", "").strip() or DEFAULT_MODEL


def cache_dir() -> Path:
    """Where prepared models live: ``KVLAB_CACHE_DIR`` or ``~/.cache/kvlab``."""
    return Path(os.environ.get("KVLAB_CACHE_DIR") or Path.home() / ".cache" / "kvlab").expanduser()


def build_dir() -> Path:
    """Where executed notebooks, HTML, logs and lab outputs go: ``KVLAB_BUILD_DIR`` or ``build/``."""
    return Path(os.environ.get("KVLAB_BUILD_DIR") or REPO_ROOT / "build").expanduser()


def kv_cache_gib() -> float:
    """KV cache budget in GiB for CPU engines: ``KVLAB_KV_CACHE_GIB`` or 1 GiB (reproducible)."""
    raw = os.environ.get("KVLAB_KV_CACHE_GIB", "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:

        raise KVLabError(f"KVLAB_KV_CACHE_GIB={raw!r} is not a positive number of GiB; set it to e.g. 1 or unset it.")
    return value


#: Model dtypes ``KVLAB_DTYPE`` accepts ("auto": chosen by the machine, see ``hardware.model_dtype``).
DTYPES = ("auto", "float32", "bfloat16", "float16")


def dtype_choice() -> str:
    """The model dtype asked for with ``KVLAB_DTYPE`` (default "auto")."""
    raw = os.environ.get("KVLAB_DTYPE", "").strip().lower() or "auto"
    if raw not in DTYPES:

        raise KVLabError(f"KVLAB_DTYPE={raw!r} is not one of {', '.join(DTYPES)}; set one of them or unset it.")
    return raw


def note_startup(what: str, seconds: float) -> None:
    """Record one engine or service start-up (``what``, seconds) in ``KVLAB_STARTUP_LOG`` when set: the course build
    sets it per lesson, to split each lesson's time into start-ups and measurement."""
    path = os.environ.get("KVLAB_STARTUP_LOG", "").strip()
    if path:
        import json

        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"what": what, "seconds": round(seconds, 3)}) + "\n")
