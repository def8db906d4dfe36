"""Keep library noise (vLLM logs, C++ warnings, progress bars) out of learners' sight, in a log file."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

from kvlab.runtime import config


def log_path() -> Path:
    """File that receives vLLM's log lines and console noise for this process."""
    path = config.build_dir() / "logs" / f"vllm-{os.getpid()}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def quiet() -> Iterator[Path]:
    """Send everything printed meanwhile (Python and C level, progress bars, warnings) to the log file."""
    path = log_path()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    old_tqdm = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"  # notebook progress bars are widgets, not text: switch them off
    # transformers' bars (saving a model: "Writing model shards") are widgets in a notebook, displayed rather than
    # printed, so no redirect catches them; they are switched off here, and on again after
    hf_logging = sys.modules.get("transformers.utils.logging")
    hf_bars = bool(hf_logging and hf_logging.is_progress_bar_enabled())
    if hf_bars:
        hf_logging.disable_progress_bar()
    saved: dict[int, int] = {}
    with open(path, "a") as log, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for fd in (1, 2):
                with contextlib.suppress(OSError):
                    saved[fd] = os.dup(fd)
                    os.dup2(log.fileno(), fd)
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                yield path
        finally:
            log.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            if hf_bars:
                hf_logging.enable_progress_bar()
            if old_tqdm is None:
                os.environ.pop("TQDM_DISABLE", None)
            else:
                os.environ["TQDM_DISABLE"] = old_tqdm

