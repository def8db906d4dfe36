"""Lab L02 · TTFT and TPOT sweep: prompt lengths × output lengths on one engine, against this machine's limits."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvlab.course.exercises import Question, Tables
from kvlab.course.labs import Lab, Param, at_most, first, model_param, output_param
from kvlab.outliers import clean

NAME = "L02_ttft_tpot_sweep"


def _longest(t: Tables) -> pd.DataFrame:
    r = clean(t["results"])  # stalls stay in the results, flagged; answers come from the rest
    return r[(r.prompt_tokens == r.prompt_tokens.max()) & (r.output_tokens == r.output_tokens.min())]


def phase(t: Tables) -> tuple[Any, str]:
    d = _longest(t)
    ttft, decode = d.ttft_s.median(), d.decode_s.median()
    return ("prefill" if ttft > decode else "decode"), (
        f"at {int(d.prompt_tokens.iloc[0]):,} prompt tokens and {int(d.output_tokens.iloc[0])} output tokens: median TTFT "
        f"{ttft * 1e3:.0f} ms vs decode {decode * 1e3:.0f} ms")


def ttft_growth(t: Tables) -> tuple[Any, str]:
    m = clean(t["results"]).groupby("prompt_tokens").ttft_s.median()
    ratio = m.iloc[-1] / m.iloc[0]
    return round(ratio, 2), f"median TTFT {m.iloc[0] * 1e3:.0f} ms at {m.index[0]:,} tokens → {m.iloc[-1] * 1e3:.0f} ms at {m.index[-1]:,}"


def tpot_vs_ttft(t: Tables) -> tuple[Any, str]:
    m = clean(t["results"]).groupby("prompt_tokens")[["ttft_s", "tpot_s"]].median()
    g_ttft, g_tpot = m.ttft_s.iloc[-1] / m.ttft_s.iloc[0], m.tpot_s.iloc[-1] / m.tpot_s.iloc[0]
    return ("less" if g_tpot < g_ttft else "more"), (
        f"TPOT ×{g_tpot:.2f} vs TTFT ×{g_ttft:.2f}: decode reads the weights once per token whatever the prompt; prefill "
        "does work proportional to the prompt")


def compare(t: pd.DataFrame) -> Any:
    """Median TTFT vs prompt length, one line per run."""
    import plotly.express as px

    m = clean(t).groupby(["run", "prompt_tokens"], as_index=False).ttft_s.median()
    return px.line(m.assign(ttft_ms=m.ttft_s * 1e3), x="prompt_tokens", y="ttft_ms", color="run", markers=True,
                   title="L02 · median TTFT vs prompt length", labels={"prompt_tokens": "prompt tokens", "ttft_ms": "TTFT (ms)"})


LAB = Lab(
    name=NAME,
    title="TTFT and TPOT sweep",
    about="prompt lengths × output lengths on one engine, against this machine's limits",
    params=(
        model_param(),
        Param("prompt_lengths", [128, 512, 1024, 2048], "prompt tokens per request", positive=True, quick=first(2)),
        Param("output_lengths", [32], "output tokens per request (exact: end-of-sequence is ignored)", positive=True,
              quick=first(1)),
        Param("repeats", 3, "timed requests per (prompt, output) point, after one warm-up", positive=True, quick=at_most(2)),
        Param("dtype", "auto", "model dtype: auto (the machine's choice: bfloat16 on a CPU with native bf16, else float32), float32, bfloat16, float16",
              choices=("auto", "float32", "bfloat16", "float16")),
        Param("enforce_eager", True, "True: no torch.compile (fast start); False: compiled (faster decode, slow first start)"),
        Param("kv_cache_gib", 1.0, "KV cache budget, GiB", positive=True),
        output_param(NAME),
    ),
    questions=(
        Question("L02.1", "At the longest prompt (shortest output), which phase takes longer: prefill or decode?", phase,
                 ("prefill", "decode")),
        Question("L02.2", "How many times larger is the median TTFT at the longest prompt than at the shortest? (±25 %)",
                 ttft_growth, tolerance=0.25),
        Question("L02.3", "From the shortest to the longest prompt, does TPOT grow less or more than TTFT? (less/more)",
                 tpot_vs_ttft, ("less", "more")),
    ),
    compare=compare,
    longest=lambda p: (max(p["prompt_lengths"]) + max(p["output_lengths"]), "max(prompt_lengths) + max(output_lengths)"),
)
