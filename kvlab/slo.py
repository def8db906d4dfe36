"""Service-level objectives, goodput and the largest arrival rate an engine sustains under them.

Definitions, as vLLM 0.32's ``vllm bench serve --goodput ttft:X tpot:Y e2el:Z`` computes them
(``vllm/benchmarks/serve.py``, ``calculate_metrics``):

- a request is **good** when every objective it is given holds *for that request*: TTFT ≤ X ms, TPOT ≤ Y ms,
  E2E latency ≤ Z ms (a request with a single output token has TPOT 0 there, and here);
- ``request_goodput`` = good requests ÷ the benchmark's duration (req/s), and ``request_throughput`` = completed
  requests ÷ the same duration, over every request of the run (``vllm_goodput`` computes exactly these).

The rest is the course's own, not vLLM's: **attainment** = good ÷ completed (the share of users who got the service
promised); each load point drops its first 20 % of requests by arrival (they met an empty engine, ``steady_state``)
and is timed from its first arrival to its last token (``rate_point``'s ``goodput_rps`` and ``throughput_rps``); and
a *rate meets the SLO* when the p95 of each named metric is within its threshold — the SLO as an SRE writes it
("TTFT p95 ≤ 500 ms"). The **maximum sustainable rate** is found by scanning the measured rates upward: the last rate
that meets the SLO before the first one that does not, interpolated between those two on the worst metric's
p95 ÷ threshold (which crosses 1 between them). All times here are on the client's clock: TTFT counts from the
request's arrival, so it includes any time spent queued.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from kvlab.runtime.errors import KVLabError


@dataclass(frozen=True)
class SLO:
    """Objectives in milliseconds (``e2e_ms=None``: no end-to-end objective) at a percentile (95: p95)."""

    ttft_ms: float
    tpot_ms: float
    e2e_ms: float | None = None
    percentile: float = 95.0

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            value = getattr(self, name)
            if value is None and name == "e2e_ms":
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or math.isinf(value):
                raise KVLabError(f"SLO threshold {name} must be a positive number of milliseconds, got {value!r}.")
        if not 0 < self.percentile < 100:
            raise KVLabError(f"SLO percentile must be between 0 and 100, got {self.percentile!r}.")

    @property
    def thresholds_s(self) -> dict[str, float]:
        """{timing column: threshold in seconds} for the objectives that are set."""
        out = {"ttft_s": self.ttft_ms / 1e3, "tpot_s": self.tpot_ms / 1e3}
        if self.e2e_ms is not None:
            out["e2e_s"] = self.e2e_ms / 1e3
        return out

    def describe(self) -> str:
        """``TTFT p95 ≤ 400 ms, TPOT p95 ≤ 80 ms``."""
        p = f"p{self.percentile:g}"
        names = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}
        return ", ".join(f"{names[k]} {p} ≤ {v * 1e3:,.0f} ms" for k, v in self.thresholds_s.items())

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Any, q: float) -> float:
    """The ``q``-th percentile (linear interpolation, numpy's default and vLLM bench's); NaN for no values."""
    arr = np.asarray(pd.Series(values, dtype=float).dropna())
    return float(np.percentile(arr, q)) if arr.size else math.nan


def good(requests: pd.DataFrame, slo: SLO) -> pd.Series:
    """True for each request that meets every objective (a missing TPOT — one output token — counts as 0)."""
    ok = pd.Series(True, index=requests.index)
    for column, limit in slo.thresholds_s.items():
        values = requests[column].fillna(0.0) if column == "tpot_s" else requests[column]
        ok &= values <= limit
    return ok


def steady_state(requests: pd.DataFrame, warmup_fraction: float = 0.2, min_warmup: int = 2) -> pd.DataFrame:
    """Drop the first requests by arrival (``warmup_fraction`` of them, at least ``min_warmup`` when enough remain):
    they met an empty engine, so they show a load lighter than the rate being measured."""
    ordered = requests.sort_values("arrival_s")
    drop = max(math.ceil(warmup_fraction * len(ordered)), min_warmup if len(ordered) > 2 * min_warmup else 0)
    return ordered.iloc[drop:]


def rate_point(requests: pd.DataFrame, slo: SLO) -> dict[str, float]:
    """One load point's numbers: requests behind the percentiles, duration (first arrival → last token), the rate they
    actually arrived at (``arrived_rps``: gaps between first and last arrival; a short run's throughput sits below it
    by the last request's E2E, which the duration includes), throughput,
    goodput, attainment, output tokens/s, TTFT/TPOT/E2E mean, p50 and p(SLO), each objective's percentile ÷ threshold
    (``ttft_ratio``…; ≤ 1 meets), the worst of them (``slo_ratio``) and whether the SLO is met."""
    if requests.empty:
        raise KVLabError("No finished requests at this load point; send more requests or a longer run.")
    q = slo.percentile
    duration = float(requests.last_token_s.max() - requests.arrival_s.min())
    n_good = int(good(requests, slo).sum())
    arriving = float(requests.arrival_s.max() - requests.arrival_s.min())
    row: dict[str, float] = {"requests": len(requests), "duration_s": duration,
                             "arrived_rps": (len(requests) - 1) / arriving if arriving > 0 else math.nan,
                             "throughput_rps": len(requests) / duration, "goodput_rps": n_good / duration,
                             "attainment": n_good / len(requests),
                             "output_tokens_per_s": float(requests.output_tokens.sum()) / duration}
    for column in ("ttft_s", "tpot_s", "e2e_s"):
        name = column.removesuffix("_s")
        row[f"{name}_mean_ms"] = float(requests[column].mean()) * 1e3
        row[f"{name}_p50_ms"] = percentile(requests[column], 50) * 1e3
        row[f"{name}_p{q:g}_ms"] = percentile(requests[column], q) * 1e3
    for column, limit in slo.thresholds_s.items():
        values = requests[column].fillna(0.0) if column == "tpot_s" else requests[column]
        row[f"{column.removesuffix('_s')}_ratio"] = percentile(values, q) / limit
    worst = max(row[f"{c.removesuffix('_s')}_ratio"] for c in slo.thresholds_s)
    row |= {"slo_ratio": worst, "meets_slo": bool(worst <= 1.0)}
    return row


def vllm_goodput(requests: pd.DataFrame, slo: SLO) -> dict[str, float]:
    """vLLM ``bench serve``'s own two rates over every request of a run, warm-up included: good ÷ duration and
    completed ÷ duration, the duration from the first request sent to the last token (``calculate_metrics``)."""
    duration = float(requests.last_token_s.max() - requests.arrival_s.min())
    return {"vllm_goodput_rps": int(good(requests, slo).sum()) / duration, "vllm_throughput_rps": len(requests) / duration}


def rate_table(requests: pd.DataFrame, slo: SLO, by: str = "rate_rps", warmup_fraction: float = 0.2) -> pd.DataFrame:
    """``rate_point`` for each load point (``by``), after dropping each point's warm-up requests, beside vLLM bench's
    goodput and throughput over all of the point's requests (``vllm_goodput``); sorted by ``by``."""
    rows = [{by: key} | rate_point(steady_state(part, warmup_fraction), slo) | vllm_goodput(part, slo)
            for key, part in requests.groupby(by)]
    return pd.DataFrame(rows).sort_values(by, ignore_index=True)


def max_sustainable_rate(table: pd.DataFrame, by: str = "rate_rps") -> dict[str, Any]:
    """The largest rate meeting the SLO, from ``rate_table``'s rows: scanning upward, the last passing rate before the
    first failing one, interpolated on ``slo_ratio``. ``bracket`` holds the two measured rates; ``at_least`` is True
    when every rate passed (the true maximum lies above the sweep); ``rate`` is None when even the lowest failed."""
    rows = table.sort_values(by).reset_index(drop=True)
    if rows.empty:
        raise KVLabError("No load points to search; run a rate sweep first.")
    failing = rows.index[~rows.meets_slo.astype(bool)]
    if len(failing) == 0:
        top = rows.iloc[-1]
        return {"rate": float(top[by]), "bracket": (float(top[by]), None), "at_least": True}
    first_fail = int(failing[0])
    if first_fail == 0:
        return {"rate": None, "bracket": (None, float(rows.loc[0, by])), "at_least": False}
    lo, hi = rows.loc[first_fail - 1], rows.loc[first_fail]
    span = hi.slo_ratio - lo.slo_ratio
    frac = (1.0 - lo.slo_ratio) / span if span > 0 else 0.0
    rate = float(lo[by] + min(max(frac, 0.0), 1.0) * (hi[by] - lo[by]))
    return {"rate": rate, "bracket": (float(lo[by]), float(hi[by])), "at_least": False}


def knee(table: pd.DataFrame, by: str = "rate_rps") -> float:
    """The rate where goodput peaked: past it, more offered load brings fewer good requests per second."""
    return float(table.loc[table.goodput_rps.idxmax(), by])
