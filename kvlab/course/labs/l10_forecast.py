"""Lab L10 · Predict, then measure: a step model calibrated here, vLLM's scheduler driven with it over a held-out grid,
every prediction written before the grid runs, then the scorecard."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvlab import scorecard
from kvlab.course.exercises import Question, Tables
from kvlab.course.labs import Lab, Param, at_most, first, first_and_last, model_param, output_param

NAME = "L10_forecast"
METRICS = ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms", "e2e_p50_ms", "throughput_tok_s", "hit_rate",
           "peak_blocks")


def check(p: dict[str, Any]) -> str | None:
    """Rules across parameters: distinct budgets, the SLO looser than unloaded."""
    if len(set(p["budgets"])) != len(p["budgets"]):
        return f"parameter budgets lists a value twice: {p['budgets']!r}."
    if p["ttft_slo_x"] <= 1 or p["tpot_slo_x"] <= 1:
        return "ttft_slo_x and tpot_slo_x must be above 1 (an SLO at or below unloaded latency is met by no load)."
    return None


def longest(p: dict[str, Any]) -> tuple[int, str]:
    """The longest request: the longest unloaded or long prompt with its output tokens."""
    n = max([*p["prompt_lengths"], *p["long_prompts"]])
    return n + p["output_tokens"], f"the longest prompt ({n}) + output_tokens ({p['output_tokens']})"


def tpot_error(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    e = r[r.metric.str.startswith("tpot")].error.abs()
    return round(float(e.median()), 3), f"over {len(e)} TPOT predictions"


def coverage(t: Tables) -> tuple[Any, str]:
    share, inside, total = scorecard.coverage(t["results"])
    return round(share, 3), f"{inside} of {total} measurements inside their 80 % interval (KV blocks aside: exact)"


def worst_metric(t: Tables) -> tuple[Any, str]:
    s = t["summary"].set_index("metric").median_abs_error
    return str(s.idxmax()), ", ".join(f"{m}: {e:.0%}" for m, e in s.items())


def compare(t: pd.DataFrame) -> Any:
    """Median |error| per metric, one bar per run."""
    import plotly.express as px

    rows = (t.assign(abs_error=t.error.abs()).groupby(["run", "metric"]).abs_error.median().reset_index())
    return px.bar(rows, x="metric", y="abs_error", color="run", barmode="group",
                  labels={"abs_error": "median |error| (predicted ÷ measured − 1)"},
                  title="Forecast error per metric, per run")


LAB = Lab(
    name=NAME,
    title="Predict, then measure",
    about="a step model calibrated here drives vLLM's scheduler over a held-out grid: predictions written first, then "
          "measured and scored (median error, 80 % interval coverage, SLO calls)",
    params=(
        model_param(),
        Param("budgets", [512, 256], "chunked-prefill budgets, tokens per step (the first is the main engine's)",
              positive=True, quick=first(1)),
        Param("prompt_lengths", [96, 384, 1536, 3072], "prompt tokens of the unloaded points (each request alone)",
              positive=True, quick=first_and_last()),
        Param("batch_sizes", [6, 16], "sequences submitted together in the batch points", positive=True,
              quick=first(1)),
        Param("batch_prompt_tokens", 384, "prompt tokens per sequence in the batch points", positive=True),
        Param("long_prompts", [1024, 2048], "prompt tokens of the long request arriving during decodes", positive=True,
              quick=first(1)),
        Param("prefixes", [256, 1024], "shared-prefix lengths of the prefix-caching points, tokens", positive=True,
              quick=first(1)),
        Param("rate_fractions", [0.4, 0.7, 0.95, 1.25], "Poisson rates as fractions of the forecast capacity",
              positive=True, quick=first_and_last()),
        Param("poisson_requests", 24, "most requests per Poisson rate", positive=True, quick=at_most(16)),
        Param("poisson_window_s", 25.0, "each Poisson rate sends the requests that arrive in this many seconds (at least 8)",
              positive=True, quick=at_most(15.0)),
        Param("output_tokens", 24, "output tokens per request (exact)", positive=True, quick=at_most(16)),
        Param("ttft_slo_x", 3.0, "SLO: TTFT p90 within this many times the forecast unloaded TTFT", positive=True),
        Param("tpot_slo_x", 2.0, "SLO: TPOT p90 within this many times the forecast unloaded TPOT", positive=True),
        Param("second_model", True, "also forecast the other course model, never calibrated on"),
        Param("speculation_k", 4, "draft tokens per step of the n-gram speculation point (0: no speculation point)",
              between=(0, 8)),
        Param("enforce_eager", True, "True: no torch.compile; False: compiled (slow first start)"),
        output_param(NAME),
    ),
    questions=(
        Question("L10.1", "What was the median |error| of the TPOT predictions? (a fraction, ±20 %)", tpot_error,
                 tolerance=0.2),
        Question("L10.2", "What share of measurements fell inside their 80 % interval? (a fraction, ±5 %)", coverage,
                 tolerance=0.05),
        Question("L10.3", "Which metric had the largest median |error|?", worst_metric, METRICS),
    ),
    compare=compare,
    check=check,
    longest=longest,
)
