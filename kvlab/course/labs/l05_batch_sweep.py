"""Lab L05 · batch sweep: offline batches of growing size, throughput against latency."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvlab.course.exercises import Question, Tables
from kvlab.course.labs import Lab, Param, at_most, first_and_last, model_param, output_param

NAME = "L05_batch_sweep"


def best_batch(t: Tables) -> tuple[Any, str]:
    tpot = t["results"].groupby("batch_size").tpot_s.median()
    tput = tpot.index.to_series() / tpot
    return int(tput.idxmax()), ", ".join(f"batch {b}: {v:.0f} tok/s" for b, v in tput.items()) + " (decode throughput = batch ÷ median TPOT)"


def ttft_growth(t: Tables) -> tuple[Any, str]:
    m = t["results"].groupby("batch_size").ttft_s.median()
    return round(m.iloc[-1] / m.iloc[0], 2), f"median TTFT {m.iloc[0] * 1e3:.0f} ms at batch {m.index[0]} → {m.iloc[-1] * 1e3:.0f} ms at {m.index[-1]}"


def compare(t: pd.DataFrame) -> Any:
    """Decode throughput vs batch size, one line per run."""
    import plotly.express as px

    m = t.groupby(["run", "batch_size"], as_index=False).tpot_s.median()
    m["decode_tok_s"] = m.batch_size / m.tpot_s
    return px.line(m, x="batch_size", y="decode_tok_s", color="run", markers=True, log_x=True,
                   title="L05 · decode throughput vs batch size",
                   labels={"batch_size": "batch size (log)", "decode_tok_s": "decode tokens/s"})


LAB = Lab(
    name=NAME,
    title="Batch sweep",
    about="offline batches of growing size, throughput against latency",
    params=(
        model_param(),
        Param("batch_sizes", [1, 4, 16, 32], "sequences submitted together", positive=True, quick=first_and_last()),
        Param("prompt_tokens", 128, "prompt tokens per sequence", positive=True),
        Param("output_tokens", 32, "output tokens per sequence (exact)", positive=True),
        Param("repeats", 2, "batches per size, after one warm-up batch", positive=True, quick=at_most(1)),
        Param("kv_cache_gib", 1.0, "KV cache budget, GiB (small values cap the batch: see preemptions)", positive=True),
        Param("enforce_eager", True, "True: no torch.compile; False: compiled (slow first start)"),
        output_param(NAME),
    ),
    questions=(
        Question("L05.1", "At which batch size was decode throughput highest?", best_batch),
        Question("L05.2", "How many times larger is the median TTFT at the largest batch than at the smallest? (±25 %)",
                 ttft_growth, tolerance=0.25),
    ),
    compare=compare,
    longest=lambda p: (p["prompt_tokens"] + p["output_tokens"], "prompt_tokens + output_tokens"),
)
