"""Lab L08 · KV budget: the same shared-prefix traffic on pools of several sizes — hit rate, TTFT and evictions."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvlab.course.exercises import Question, Tables
from kvlab.course.labs import Lab, Param, at_most, first_middle_last, model_param, output_param
from kvlab.paged import BUDGET_UNITS

NAME = "L08_kv_budget"


def _budgets(t: Tables) -> pd.DataFrame:
    return t["budgets"].sort_values("budget_blocks").reset_index(drop=True)


def survives_from(t: Tables) -> tuple[Any, str]:
    b = _budgets(t)
    all_hit = b.prefix_hits >= b.shared_requests - 1  # the first shared request is always cold
    tail = all_hit[::-1].cummin()[::-1]  # from this budget up, every budget kept the prefix
    answer = int(b.budget_blocks[tail].min()) if tail.any() else 0
    return answer, ", ".join(f"{r.budget_blocks} blocks: {r.prefix_hits} of {r.shared_requests} shared requests hit"
                             for r in b.itertuples())


def hit_rate_smallest(t: Tables) -> tuple[Any, str]:
    row = _budgets(t).iloc[0]
    return round(float(row.token_hit_rate), 3), (f"{row.budget_blocks} blocks: {row.engine_hit_tokens:.0f} of "
                                                 f"{row.engine_query_tokens:.0f} prompt tokens hit (the engine's counters)")


def prefix_evicted_smallest(t: Tables) -> tuple[Any, str]:
    row = _budgets(t).iloc[0]
    return int(row.prefix_blocks_evicted), (f"{row.removed_events} BlockRemoved events at {row.budget_blocks} blocks; "
                                            "count the ones whose owner is the shared prefix in events.csv")


def ttft_fell(t: Tables) -> tuple[Any, str]:
    b = _budgets(t)
    lo, hi = b.iloc[0], b.iloc[-1]
    return ("yes" if hi.shared_ttft_p95_ms < lo.shared_ttft_p95_ms else "no"), (
        f"shared-prefix TTFT p95 {lo.shared_ttft_p95_ms:.0f} ms at {lo.budget_blocks} blocks vs {hi.shared_ttft_p95_ms:.0f} ms "
        f"at {hi.budget_blocks} (a miss recomputes the whole prefix: it shows in the tail, not the median, while most hit)")


def compare(t: pd.DataFrame) -> Any:
    """Share of shared-prefix requests that found the prefix cached, against the budget in tokens, per run."""
    import plotly.express as px

    shared = t[t.label == "shared"]
    rows = shared.groupby(["run", "budget_tokens"]).hit.mean().reset_index()
    return px.line(rows, x="budget_tokens", y="hit", color="run", markers=True,
                   labels={"budget_tokens": "KV budget (tokens)", "hit": "shared requests that hit the prefix"},
                   title="The shared prefix survives from a budget on: where, per run")


LAB = Lab(
    name=NAME,
    title="KV budget",
    about="the same shared-prefix traffic on KV pools of several sizes: prefix hits, TTFT, evictions, engine cross-checks",
    params=(
        model_param(),
        Param("budgets", [0.6, 0.8, 0.9, 1.0, 1.25], "KV budgets to run, in budget_unit (each rounded down to whole blocks)",
              positive=True, quick=first_middle_last()),
        Param("budget_unit", "survival", "'survival': multiples of the smallest pool where every shared request hits "
              "(computed from the traffic: fits any model and block size); 'blocks', 'tokens' or 'GiB'", choices=BUDGET_UNITS),
        Param("shared_prefix_tokens", 512, "tokens of the shared prefix (a system prompt); whole blocks of it are shared",
              positive=True),
        Param("shared_share", 0.5, "share (0-1) of requests that start with the shared prefix", fraction=True),
        Param("suffix_tokens", 40, "tokens after the shared prefix, different in every shared request", positive=True),
        Param("unique_prompt_tokens", 400, "tokens of each unique (no shared prefix) prompt", positive=True),
        Param("requests", 20, "requests per budget (the same traffic on every budget)", positive=True, quick=at_most(12)),
        Param("output_tokens", 2, "output tokens per request (exact)", positive=True),
        Param("concurrency", 1, "requests submitted together; 1: one after another (the LRU prediction holds only then)",
              positive=True),
        Param("seed", 4, "order of shared and unique requests", between=(0, 2**31)),
        Param("enforce_eager", True, "True: no torch.compile; False: compiled (slow first start)"),
        output_param(NAME),
    ),
    questions=(
        Question("L08.1", "From which budget (blocks) on did every shared request after the first find the prefix cached? "
                 "(0 if at none)", survives_from),
        Question("L08.2", "What was the engine's token hit rate at the smallest budget? (a fraction, ±5 %)",
                 hit_rate_smallest, tolerance=0.05),
        Question("L08.3", "How many of the shared prefix's blocks were evicted at the smallest budget?",
                 prefix_evicted_smallest),
        Question("L08.4", "Was the shared requests' TTFT p95 lower at the largest budget than at the smallest? (yes/no)",
                 ttft_fell, ("yes", "no")),
    ),
    compare=compare,
)
