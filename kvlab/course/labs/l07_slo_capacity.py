"""Lab L07 · SLO capacity: an open-loop rate sweep of a traffic mix, goodput under an SLO, the largest sustainable rate."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvlab import loadtest
from kvlab.course.exercises import Question, Tables
from kvlab.course.labs import Lab, Param, at_most, first_middle_last, model_param, output_param, tokenizer_of
from kvlab.loadtest import goodput_by_run
from kvlab.slo import steady_state

NAME = "L07_slo_capacity"
#: vLLM 0.32's scheduling policies (vllm/config/scheduler.py: SchedulerPolicy = Literal["fcfs", "priority"]).
POLICIES = ("fcfs", "priority")


def check(p: dict[str, Any]) -> str | None:
    """Rules across parameters: shares sum to 1, rates increase, the E2E objective is 0 (none) or positive."""
    shares = {k: p[f"{k}_share"] for k in ("chat", "agent", "batch")}
    if abs(sum(shares.values()) - 1) > 1e-6:
        listed = ", ".join(f"{k}_share={v:g}" for k, v in shares.items())
        return f"the traffic shares must sum to 1, got {listed} (sum {sum(shares.values()):g})."
    if shares["chat"] + shares["agent"] == 0:
        return "the SLO applies to interactive requests: chat_share + agent_share must be above 0."
    rates = p["rates"]
    if any(b <= a for a, b in zip(rates, rates[1:], strict=False)):
        return f"parameter rates must increase from one point to the next, got {rates!r}."
    if p["slo_e2e"] < 0:
        return f"parameter slo_e2e must be 0 (no E2E objective) or positive, got {p['slo_e2e']!r}."
    return None


def _capacity(t: Tables) -> pd.Series:
    return t["capacity"].iloc[0]


def max_rate(t: Tables) -> tuple[Any, str]:
    c = _capacity(t)
    rate = 0.0 if pd.isna(c.max_sustainable_rps) else round(float(c.max_sustainable_rps), 2)
    return rate, (f"between the measured rates {c.bracket_low_rps} and {c.bracket_high_rps} req/s ({c.slo}); "
                  "0 means even the lowest rate broke the SLO")


def knee_rate(t: Tables) -> tuple[Any, str]:
    r = t["rates"]
    return float(r.loc[r.goodput_rps.idxmax(), "rate_rps"]), ", ".join(
        f"{a:.2f} req/s: goodput {g:.2f}" for a, g in zip(r.rate_rps, r.goodput_rps, strict=True))


def first_broken(t: Tables) -> tuple[Any, str]:
    r = t["rates"].sort_values("rate_rps")
    failing = r[~r.meets_slo.astype(bool)]
    if failing.empty:
        return "none", "every rate met the SLO"
    row = failing.iloc[0]
    ratios = {k: row[f"{k}_ratio"] for k in ("ttft", "tpot", "e2e") if f"{k}_ratio" in row and pd.notna(row[f"{k}_ratio"])}
    worst = max(ratios, key=ratios.get)
    return worst, f"at {row.rate_rps:.2f} req/s: " + ", ".join(f"{k} at {v:.2f}× its objective" for k, v in ratios.items())


def throughput_kept_rising(t: Tables) -> tuple[Any, str]:
    r = t["rates"].sort_values("rate_rps").reset_index(drop=True)
    k = r.goodput_rps.idxmax()
    top, at_knee = r.iloc[-1], r.iloc[k]
    return ("yes" if top.throughput_rps > at_knee.throughput_rps else "no"), (
        f"throughput {at_knee.throughput_rps:.2f} req/s at the knee ({at_knee.rate_rps:.2f}) vs {top.throughput_rps:.2f} "
        f"at {top.rate_rps:.2f}; goodput {at_knee.goodput_rps:.2f} vs {top.goodput_rps:.2f}")


def longest(p: dict[str, Any]) -> tuple[int, str]:
    """The longest request of the kinds in the mix (tokens, output included), from the model's tokenizer."""

    mix = loadtest.Mix(p["chat_share"], p["agent_share"], p["batch_share"], p["chat_output_tokens"],
                       p["agent_prompt_tokens"], p["agent_output_tokens"], p["batch_prompt_tokens"], p["batch_output_tokens"])
    return loadtest.longest_request(tokenizer_of(p), mix)


def compare(t: pd.DataFrame) -> Any:
    """Goodput and throughput vs arrival rate, per run (interactive requests, warm-up dropped)."""

    rows = []
    for (run, rate), part in t[t.label != "batch"].groupby(["run", "rate_rps"]):
        kept = steady_state(part)
        span = kept.last_token_s.max() - kept.arrival_s.min()
        rows.append({"run": run, "rate_rps": rate, "goodput_rps": kept.good.sum() / span, "throughput_rps": len(kept) / span})
    return goodput_by_run(pd.DataFrame(rows))


LAB = Lab(
    name=NAME,
    title="SLO capacity",
    about="an open-loop rate sweep of a traffic mix: goodput under an SLO and the largest sustainable rate",
    params=(
        model_param(),
        Param("slo_ttft", 4.0, "TTFT objective at p95: multiples of the unloaded chat median (slo_unit unloaded) or ms",
              positive=True),
        Param("slo_tpot", 2.0, "TPOT objective at p95, same unit as slo_ttft", positive=True),
        Param("slo_e2e", 0.0, "E2E latency objective at p95, same unit; 0: no E2E objective"),
        Param("slo_unit", "unloaded", "unit of the objectives: 'unloaded' (× this engine's unloaded chat median) or 'ms'",
              choices=("unloaded", "ms")),
        Param("rates", [0.25, 0.5, 0.75, 1.0, 1.25, 1.5], "arrival rates to sweep, increasing (unit: rate_unit)",
              positive=True, quick=first_middle_last()),
        Param("rate_unit", "saturation", "'saturation': fractions of the throughput measured with saturation_users closed-"
              "loop users (fits any machine); 'req/s': requests per second", choices=("saturation", "req/s")),
        Param("saturation_users", 32, "closed-loop users of the run that measures saturation throughput", positive=True,
              quick=at_most(16)),
        Param("seconds_per_rate", 8.0, "seconds of Poisson arrivals per rate (at least min_requests requests)", positive=True,
              quick=at_most(5.0)),
        Param("min_requests", 12, "fewest requests per rate", positive=True, quick=at_most(8)),
        Param("warmup_fraction", 0.2, "share of each rate's first requests dropped before the percentiles (warm-up)",
              fraction=True),
        Param("chat_share", 1.0, "share (0-1) of requests that are short chats", fraction=True),
        Param("agent_share", 0.0, "share (0-1) of requests that are agent turns (long shared system prompt)", fraction=True),
        Param("batch_share", 0.0, "share (0-1) of requests that are batch summarization jobs (no SLO, lower priority)",
              fraction=True),
        Param("chat_output_tokens", 32, "output tokens per chat (exact)", positive=True),
        Param("agent_prompt_tokens", 1000, "prompt tokens per agent turn (about)", positive=True),
        Param("agent_output_tokens", 16, "output tokens per agent turn (exact)", positive=True),
        Param("batch_prompt_tokens", 1200, "document tokens per batch job", positive=True),
        Param("batch_output_tokens", 64, "output tokens per batch job (exact)", positive=True),
        Param("scheduling_policy", "fcfs", "vLLM scheduling policy; 'priority' runs chat and agents before batch jobs",
              choices=POLICIES),
        Param("prefix_caching", True, "vLLM automatic prefix caching"),
        Param("max_num_batched_tokens", 2048, "tokens scheduled per engine step (2,048: vLLM's server default here)",
              positive=True),
        Param("long_prefill_token_threshold", 0, "most prompt tokens one request prefills per step; 0: no limit",
              between=(0, 1_000_000)),
        Param("kv_cache_gib", 1.0, "KV cache budget, GiB", positive=True),
        Param("enforce_eager", True, "True: no torch.compile; False: compiled (slow first start)"),
        output_param(NAME),
    ),
    questions=(
        Question("L07.1", "What is the largest arrival rate (req/s) that still met the SLO? (±15 %; 0 if none did)",
                 max_rate, tolerance=0.15),
        Question("L07.2", "At which measured arrival rate (req/s) did goodput peak? (±2 %)", knee_rate, tolerance=0.02),
        Question("L07.3", "At the first rate that broke the SLO, which objective was broken furthest?", first_broken,
                 ("ttft", "tpot", "e2e", "none")),
        Question("L07.4", "Was throughput at the highest rate above throughput at the knee? (yes/no)",
                 throughput_kept_rising, ("yes", "no")),
    ),
    compare=compare,
    check=check,
    longest=longest,
)
