"""Lab L09 · Speculative decoding: n-gram speculation per task and k — acceptance, TPOT speed-up, same answers, and
the gain as the batch grows."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvlab.course.exercises import Question, Tables
from kvlab.course.labs import Lab, Param, at_most, first_and_last, model_param, output_param
from kvlab.speculative import TASKS, speedups

NAME = "L09_speculative"


def check(p: dict[str, Any]) -> str | None:
    """Rules across parameters: distinct k values, a lookup window that makes sense (empty lists are refused by type)."""
    if len(set(p["ks"])) != len(p["ks"]):
        return f"parameter ks lists a value twice: {p['ks']!r}."
    if p["prompt_lookup_min"] > p["prompt_lookup_max"]:
        return (f"prompt_lookup_min ({p['prompt_lookup_min']}) must not exceed prompt_lookup_max "
                f"({p['prompt_lookup_max']}).")
    return None


def best_acceptance(t: Tables) -> tuple[Any, str]:
    s = t["summary"]
    top = s[s.k == s.k.max()].set_index("task").acceptance_rate
    return str(top.idxmax()), ", ".join(f"{task}: {a:.0%}" for task, a in top.items()) + f" at k = {s.k.max()}"


def best_speedup(t: Tables) -> tuple[Any, str]:
    s = t["summary"]
    s = s[s.k > 0]
    row = s.loc[s.speedup.idxmax()]
    return round(float(row.speedup), 2), f"{row.task} at k = {row.k}; TPOT p50 {row.tpot_p50_ms:.1f} ms"


def identical_share(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    spec = r[r.k > 0]
    return round(float(spec.identical.mean()), 3), f"{int(spec.identical.sum())} of {len(spec)} answers with speculation"


def batch_shrinks(t: Tables) -> tuple[Any, str]:
    b = t["batch_summary"]
    gains = b[b.k > 0].sort_values("batch_size").set_index("batch_size").speedup
    return ("yes" if gains.iloc[-1] < gains.iloc[0] else "no"), ", ".join(
        f"batch {size}: {g:.2f}×" for size, g in gains.items())


def compare(t: pd.DataFrame) -> Any:
    """Speed-up against acceptance rate, one point per task × k, per run."""
    import plotly.express as px


    rows = pd.concat([speedups(part).assign(run=run) for run, part in t.groupby("run")], ignore_index=True)
    rows = rows[rows.k > 0]
    return px.scatter(rows, x="acceptance_rate", y="speedup", color="run", symbol="task", hover_data=["k"],
                      labels={"acceptance_rate": "acceptance rate", "speedup": "TPOT speed-up (off ÷ on)"},
                      title="Speed-up against acceptance, per run")


LAB = Lab(
    name=NAME,
    title="Speculative decoding",
    about="n-gram speculation per task and k: acceptance, TPOT/E2E speed-up, identical answers, gain vs batch size",
    params=(
        model_param(),
        Param("tasks", list(TASKS), "tasks to run: 'edit' (fix a paragraph), 'code' (type-hint a function), 'chat' "
              "(open questions)", choices=TASKS),
        Param("ks", [2, 4, 8], "proposed tokens per step (k) to compare with speculation off", positive=True,
              quick=first_and_last()),
        Param("prompt_lookup_min", 2, "shortest n-gram the proposer matches (tokens)", positive=True),
        Param("prompt_lookup_max", 4, "longest n-gram the proposer matches (tokens)", positive=True),
        Param("requests", 4, "distinct requests per task (each alone, streamed)", positive=True, quick=at_most(2)),
        Param("repeats", 1, "times each task's requests are run", positive=True),
        Param("output_tokens", 96, "most output tokens per request (greedy, stops at end of text)", positive=True,
              quick=at_most(64)),
        Param("batch_sizes", [1, 4, 8, 16], "batch sizes for the gain-vs-batch run (edit task, largest k vs off)",
              positive=True, quick=first_and_last()),
        Param("batch_output_tokens", 64, "output tokens per request in the batch runs (exact)", positive=True),
        Param("seed", 0, "which paragraphs, functions and questions the tasks use", between=(0, 2**31)),
        Param("enforce_eager", True, "True: no torch.compile; False: compiled (slow first start)"),
        output_param(NAME),
    ),
    questions=(
        Question("L09.1", "At the largest k, which task had the highest acceptance rate?", best_acceptance, TASKS),
        Question("L09.2", "What was the best TPOT speed-up (off ÷ on) you measured? (±10 %)", best_speedup, tolerance=0.1),
        Question("L09.3", "What share of answers with speculation were identical token for token to those without? "
                 "(a fraction, ±2 %)", identical_share, tolerance=0.02),
        Question("L09.4", "Was the speed-up at the largest batch smaller than at the smallest? (yes/no)", batch_shrinks,
                 ("yes", "no")),
    ),
    compare=compare,
    check=check,
)
