"""Lab L03 · prefix cache delta: shared-prefix and unique traffic with prefix caching on and off."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvlab.course.exercises import Question, Tables
from kvlab.course.labs import Lab, Param, at_most, model_param, output_param
from kvlab.timing import ttft_bars_by_run

NAME = "L03_prefix_cache_delta"


def saved(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    shared = r[r.label.str.contains("shared")]
    on, off = shared[shared.caching == "on"].ttft_s.median(), shared[shared.caching == "off"].ttft_s.median()
    return round((off - on) * 1e3, 1), f"shared-prefix requests: median TTFT {off * 1e3:.0f} ms without caching, {on * 1e3:.0f} ms with"


def who_gains(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    gains = {}
    for kind in ("shared", "unique"):
        k = r[r.label.str.contains(kind)]
        gains[kind] = k[k.caching == "on"].ttft_s.median() / k[k.caching == "off"].ttft_s.median()
    winners = [k for k, g in gains.items() if g < 0.8]
    answer = "both" if len(winners) == 2 else (winners[0] if winners else "neither")
    return answer, ", ".join(f"{k}: TTFT with ÷ without = {g:.2f}" for k, g in gains.items()) + " (a gain means below 0.8)"


def compare(t: pd.DataFrame) -> Any:
    """Median TTFT with and without prefix caching, one bar group per run."""

    return ttft_bars_by_run(t, "caching", "median", "L03 · median TTFT with and without prefix caching", "TTFT (ms)")


LAB = Lab(
    name=NAME,
    title="Prefix cache delta",
    about="shared-prefix and unique traffic with prefix caching on and off",
    params=(
        model_param(),
        Param("prefix_tokens", 1024, "tokens of the shared prefix", positive=True),
        Param("suffix_tokens", 64, "tokens of each request's unique suffix", positive=True),
        Param("shared_fraction", 0.8, "share of requests that carry the shared prefix, 0-1", fraction=True),
        Param("requests", 12, "requests per run (one run with caching, one without)", positive=True, quick=at_most(6)),
        Param("output_tokens", 4, "output tokens per request", positive=True),
        Param("seed", 0, "order of shared and unique requests"),
        output_param(NAME),
    ),
    questions=(
        Question("L03.1", "How many milliseconds of median TTFT did prefix caching save the shared-prefix requests? (±25 %)",
                 saved, tolerance=0.25),
        Question("L03.2", "Which requests gained from caching: shared, unique, both or neither?", who_gains,
                 ("shared", "unique", "both", "neither")),
    ),
    compare=compare,
    longest=lambda p: (p["prefix_tokens"] + p["suffix_tokens"] + p["output_tokens"],
                       "prefix_tokens + suffix_tokens + output_tokens"),
)
