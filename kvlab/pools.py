"""Separate pools on one machine: each pool is its own engine in its own process, pinned to its own CPU cores, and all
pools run their workloads at the same moment — the "send batch work to another pool" mitigation, measured for real.

Each child process is pinned to its cores (``os.sched_setaffinity`` between fork and exec) and started with its
OpenMP/torch thread count equal to its core count, so no thread is ever scheduled on another pool's core (two
OpenMP threads on one core slow everything several-fold). It builds its engine (in-process, as everywhere in KV Lab), warms it up, says it is ready,
and starts its arrivals at a start time the parent gives once every pool is ready. Results come back as pickled
tables through a temporary folder; children never outlive the call (they are killed on timeout or error).

On a CPU the resource split is cores. On one GPU the pools split its memory (``gpu_memory_utilization`` shared out)
and time-slice its compute; a real deployment would give each pool its own GPUs or MIG slices.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from kvlab.runtime.engine import make_engine
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.hardware import on_gpu
from kvlab.timing import generate_timed
from kvlab.workload import Arrival, run_workload


def _child(job_file: str) -> None:
    """The pool's process: pin, build the engine, warm up, wait for the common start, run, write the results."""
    job = pickle.loads(Path(job_file).read_bytes())
    cores = job["cores"]

    llm = make_engine(job["model"], **job["engine_args"])
    for a in job["arrivals"][:2]:  # warm-up: one of the first requests' shapes, not timed
        generate_timed(llm, a.prompt_ids, 2)
    llm.reset_prefix_cache()
    Path(job["ready"]).touch()
    go = Path(job["go"])
    while not go.exists():
        time.sleep(0.02)
    time.sleep(max(0.0, float(go.read_text()) - time.time()))
    _, requests = run_workload(llm, job["arrivals"])
    requests.assign(threads=len(cores)).to_pickle(job["out"])


def _pin(cores: list[int]) -> Any:
    def pin() -> None:  # runs in the child between fork and exec: every thread it ever starts stays on these cores
        os.sched_setaffinity(0, set(cores))
    return pin


def cores_available() -> list[int]:
    """The CPU cores this process may run on."""
    return sorted(os.sched_getaffinity(0))


def run_pools(pools: dict[str, tuple[list[int], list[Arrival]]], model: str, engine_args: dict[str, Any],
              start_timeout_s: float = 300.0, run_timeout_s: float = 600.0) -> dict[str, pd.DataFrame]:
    """Run each pool's arrivals on its own engine pinned to its cores ({name: (cores, arrivals)}), all starting
    together; returns {name: one row per request}. Cores must not overlap and must exist here."""
    available = set(cores_available())
    used: list[int] = [c for cores, _ in pools.values() for c in cores]
    if len(used) != len(set(used)) or not set(used) <= available or any(not cores for cores, _ in pools.values()):
        raise KVLabError(f"Each pool needs its own cores from this machine's {sorted(available)}; got "
                         f"{ {n: c for n, (c, _) in pools.items()} }.")

    if on_gpu() and "gpu_memory_utilization" not in engine_args:
        engine_args = engine_args | {"gpu_memory_utilization": round(0.85 / len(pools), 3)}
    with tempfile.TemporaryDirectory(prefix="kvlab-pools-") as tmp:
        folder = Path(tmp)
        go = folder / "go"
        procs: dict[str, subprocess.Popen] = {}
        logs = {}
        try:
            for name, (cores, arrivals) in pools.items():
                job = {"cores": cores, "arrivals": arrivals, "model": model, "engine_args": engine_args,
                       "ready": str(folder / f"{name}.ready"), "go": str(go), "out": str(folder / f"{name}.pkl")}
                job_file = folder / f"{name}.job"
                job_file.write_bytes(pickle.dumps(job))
                logs[name] = folder / f"{name}.log"
                # vLLM binds its OpenMP threads to these cores whatever the parent process was told
                env = os.environ | {"OMP_NUM_THREADS": str(len(cores)),
                                    "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cores)}
                with open(logs[name], "wb") as log:
                    procs[name] = subprocess.Popen([sys.executable, "-m", "kvlab.pools", str(job_file)], stdout=log,
                                                   stderr=subprocess.STDOUT, env=env, preexec_fn=_pin(cores))
            _wait(procs, logs, lambda: all((folder / f"{n}.ready").exists() for n in pools), start_timeout_s, "start")
            staged = folder / "go.tmp"  # written whole, then renamed: a pool never reads a half-written start time
            staged.write_text(str(time.time() + 0.5))
            staged.replace(go)
            _wait(procs, logs, lambda: all(p.poll() is not None for p in procs.values()), run_timeout_s, "finish")
            return {name: pd.read_pickle(folder / f"{name}.pkl") for name in pools}
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=10)


def _wait(procs: dict[str, subprocess.Popen], logs: dict[str, Path], done: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        for name, p in procs.items():
            if p.poll() not in (None, 0):
                tail = logs[name].read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                raise KVLabError(f"Pool {name!r} failed to {what}: {tail[0][:300]}")
        if time.monotonic() > deadline:
            raise KVLabError(f"The pools did not {what} within {timeout_s:.0f} s; see the lesson's engine log.")
        time.sleep(0.05)
    for name, p in procs.items():
        if p.poll() not in (None, 0):
            tail = logs[name].read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise KVLabError(f"Pool {name!r} failed to {what}: {tail[0][:300]}")


if __name__ == "__main__":
    _child(sys.argv[1])
