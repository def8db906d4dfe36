"""Per-request timing read from the engine's own timestamps.

Definitions (the names vLLM's benchmarks use):
- **queue time**: request queued in the engine → first scheduled (waiting for a slot / KV blocks).
- **prefill time**: first scheduled → first output token (the prompt's forward pass, possibly in chunks).
- **TTFT** (time to first token): request arrival → first output token; includes queue and prefill.
  vLLM's ``first_token_latency`` measures it from the moment the request arrived at the front end.
- **decode time**: first output token → last output token.
- **TPOT** (time per output token): decode time ÷ (output tokens − 1); the first token belongs to TTFT.
- **E2E latency**: arrival → last token = TTFT + decode time.

vLLM's engine clock (``queued_ts`` … ``last_token_ts``) is monotonic; ``arrival_time`` is wall-clock,
so the two are never subtracted from each other here.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

import pandas as pd

#: Phase names, in order, for tables and plots.
PHASES = ("queue", "prefill", "decode")


def _metrics(out: Any) -> Any:
    m = getattr(out, "metrics", None)
    if m is None or getattr(m, "first_token_ts", 0) == 0:
        from kvlab.errors import KVLabError

        raise KVLabError("This request has no engine timestamps; build the engine with kvlab.make_engine() (it turns stats on).")
    return m


def request_timing(out: Any) -> dict[str, Any]:
    """One row of timing for a finished vLLM ``RequestOutput`` (seconds; token counts kept apart)."""
    m = _metrics(out)
    n_out = int(m.num_generation_tokens)
    decode = max(m.last_token_ts - m.first_token_ts, 0.0)
    ttft = float(m.first_token_latency)
    return {
        "request_id": out.request_id,
        "prompt_tokens": len(out.prompt_token_ids or []),
        "output_tokens": n_out,
        "cached_tokens": int(out.num_cached_tokens or 0),
        "queue_s": m.scheduled_ts - m.queued_ts,
        "prefill_s": m.first_token_ts - m.scheduled_ts,
        "decode_s": decode,
        "ttft_s": ttft,
        "tpot_s": decode / (n_out - 1) if n_out > 1 else float("nan"),
        "e2e_s": ttft + decode,
        "preemptions": int(getattr(m, "num_preemptions", 0)),
    }


def timing_table(outputs: Iterable[Any], **settings: Any) -> pd.DataFrame:
    """Tidy table, one row per request, with any run settings attached as extra columns."""
    rows = [request_timing(o) | settings for o in outputs]
    return pd.DataFrame(rows)


def timeline(out: Any) -> pd.DataFrame:
    """The request's life as events on the engine clock, relative to when it was queued (ms)."""
    m = _metrics(out)
    t0 = m.queued_ts
    events = [("queued", m.queued_ts), ("scheduled", m.scheduled_ts), ("first token", m.first_token_ts), ("last token", m.last_token_ts)]
    return pd.DataFrame({"event": [e for e, _ in events], "t_ms": [(t - t0) * 1e3 for _, t in events]})


def p95(values: Iterable[float]) -> float:
    """95th percentile (linear interpolation, like numpy's default)."""
    vals = sorted(v for v in values if v == v)
    if not vals:
        return float("nan")
    if len(vals) == 1:
        return vals[0]
    pos = 0.95 * (len(vals) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def summarize(df: pd.DataFrame, columns: Iterable[str] = ("ttft_s", "tpot_s", "e2e_s"), by: list[str] | None = None) -> pd.DataFrame:
    """Median and p95 (never a lone mean) of the timing columns, optionally per group."""
    columns = list(columns)

    def _one(g: pd.DataFrame) -> pd.Series:
        stats: dict[str, float] = {"requests": float(len(g))}
        for c in columns:
            stats[f"{c}_p50"] = statistics.median(g[c].dropna()) if g[c].notna().any() else float("nan")
            stats[f"{c}_p95"] = p95(g[c])
        return pd.Series(stats)

    if not by:
        return _one(df).to_frame().T
    return df.groupby(by).apply(_one, include_groups=False).reset_index()
