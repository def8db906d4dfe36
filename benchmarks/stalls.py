"""Where do the stalls come from? Time every engine step of plain decoding with what the OS says about it.

For each step: wall time, this process's CPU time (all threads), CPU time of everything else on the machine, steal
time (/proc/stat), involuntary context switches and page faults of this process (getrusage), and whether Python's
garbage collector ran. A step that took long while this process got little CPU was waiting for the machine (another
process, the hypervisor); one that burned CPU in this process was our own work (GC, page faults, a new shape). Phase 2
repeats the run next to a busy neighbour process, to show what an outside stall looks like. Writes
``data/reference/cpu/stalls/steps.csv`` and ``summary.json``; docs/stalls.md reads them.

Run: ``.venv/bin/python benchmarks/stalls.py [--requests 24 --tokens 128]``
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import resource
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import pandas as pd

import kvlab
from kvlab import prompts
from kvlab.runtime import envinfo

OUT = kvlab.runtime.config.REPO_ROOT / "data" / "reference" / "cpu" / "stalls"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_ticks() -> tuple[float, float, float]:
    """Machine-wide busy and steal seconds, and this process's CPU seconds, now."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    busy = sum(fields[:8]) - idle - fields[7]  # user..softirq, steal apart
    return busy / TICK, fields[7] / TICK, time.process_time()  # the process's own: nanosecond clock, all threads


def busy_neighbour(seconds: float) -> None:
    """A process that keeps one core busy, like a neighbour on a shared machine."""
    end = time.time() + seconds
    x = 0
    while time.time() < end:
        x += 1


def run(llm: Any, tok: Any, requests: int, tokens: int, phase: str) -> list[dict]:
    """Decode ``requests`` requests one at a time and record every step."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    collections = []
    gc.callbacks.append(lambda stage, info: collections.append(time.perf_counter()) if stage == "start" else None)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    rows = []
    engine = llm.llm_engine
    for i, ids in enumerate(prompts.distinct_prompts(tok, 128, requests, seed=7)):
        llm.reset_prefix_cache()
        engine.add_request(f"s-{uuid.uuid4().hex[:6]}", TokensPrompt(prompt_token_ids=ids), params)
        step = 0
        while engine.has_unfinished_requests():
            busy0, steal0, own0 = cpu_ticks()
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            engine.step()
            t1 = time.perf_counter()
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            busy1, steal1, own1 = cpu_ticks()
            rows.append({"phase": phase, "request": i, "step": step, "t_s": t0, "wall_ms": (t1 - t0) * 1e3,
                         "own_cpu_ms": (own1 - own0) * 1e3, "others_cpu_ms": max(0.0, (busy1 - busy0) - (own1 - own0)) * 1e3,
                         "steal_ms": (steal1 - steal0) * 1e3, "invol_switches": ru1.ru_nivcsw - ru0.ru_nivcsw,
                         "minor_faults": ru1.ru_minflt - ru0.ru_minflt, "major_faults": ru1.ru_majflt - ru0.ru_majflt,
                         "gc": any(t0 <= c <= t1 for c in collections)})
            step += 1
    gc.callbacks.pop()
    return rows


def classify(df: pd.DataFrame) -> pd.DataFrame:
    """Mark decode steps (not the first, prefill) slower than 2× their phase's median, and name the likely cause."""
    decode = df[df.step > 0].copy()
    med = decode.groupby("phase").wall_ms.transform("median")
    switches = decode.groupby("phase").invol_switches.transform("median")
    decode["stall"] = decode.wall_ms > 2 * med

    def cause(r: pd.Series) -> str:
        if not r.stall:
            return ""
        if r.gc:
            return "garbage collection"
        if r.major_faults or r.minor_faults > 1000:
            return "page faults"
        # vLLM's OpenMP threads hold every core; when the OS gives one of them away, the step waits for it at the next
        # barrier (the other threads spin, so this process's CPU time stays high) — many more involuntary switches
        if r.invol_switches > 2 * max(switches[r.name], 1) or r.others_cpu_ms > 0.2 * r.wall_ms or r.steal_ms > 0:
            return "descheduled: another process or thread had a core"
        return "work inside this process"
    decode["cause"] = decode.apply(cause, axis=1)
    return decode


def summarize(steps: pd.DataFrame) -> dict:
    """Per phase: the step-time distribution, the stalls and their causes, GC, CPU and switches."""
    phases = {}
    for phase, g in steps.groupby("phase", sort=False):
        stalls = g[g.stall]
        phases[phase] = {
            "decode steps": len(g), "median step ms": round(g.wall_ms.median(), 2),
            "p95 step ms": round(g.wall_ms.quantile(0.95), 2), "max step ms": round(g.wall_ms.max(), 1),
            "stalls (> 2x median)": len(stalls), "stall time share": round(stalls.wall_ms.sum() / g.wall_ms.sum(), 4),
            "causes": stalls.cause.value_counts().to_dict(),
            "steps with GC": int(g.gc.sum()), "GC steps median ms": round(g[g.gc].wall_ms.median(), 2) if g.gc.any() else None,
            "own CPU per step ms (median)": round(g.own_cpu_ms.median(), 2),
            "own CPU during stalls ms (median)": round(stalls.own_cpu_ms.median(), 2) if len(stalls) else None,
            "others' CPU during stalls ms (median)": round(stalls.others_cpu_ms.median(), 2) if len(stalls) else None,
            "steal ms in all steps": round(g.steal_ms.sum(), 1),
            "involuntary switches per step (median)": float(g.invol_switches.median()),
            "involuntary switches per stall (median)": float(stalls.invol_switches.median()) if len(stalls) else None,
        }
    return phases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reuse", action="store_true", help="re-read steps.csv and summarize again, no engine")
    a = ap.parse_args()
    if a.reuse:
        steps = classify(pd.read_csv(OUT / "steps.csv").query("step > 0"))
        summary = json.loads((OUT / "summary.json").read_text())
    else:
        llm = kvlab.make_engine(enable_prefix_caching=False)
        tok = llm.get_tokenizer()
        run(llm, tok, 2, 16, "warm-up")
        rows = run(llm, tok, a.requests, a.tokens, "alone")
        estimate = statistics.median(r["wall_ms"] for r in rows) * a.requests * a.tokens / 1e3
        neighbour = mp.get_context("spawn").Process(target=busy_neighbour, args=(estimate * 1.5,), daemon=True)
        neighbour.start()
        rows += run(llm, tok, a.requests, a.tokens, "next to a busy process")
        neighbour.terminate()
        kvlab.close_engine(llm)
        steps = classify(pd.DataFrame(rows))
        summary = {"env": {k: v for k, v in envinfo.env_report().items() if k != "model cache"}}
    OUT.mkdir(parents=True, exist_ok=True)
    steps.drop(columns=["stall", "cause"]).round(3).to_csv(OUT / "steps.csv", index=False)
    summary["phases"] = summarize(steps)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps(summary["phases"], indent=1, default=str))


if __name__ == "__main__":
    main()
