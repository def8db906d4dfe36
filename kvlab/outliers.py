"""Stalls: requests far slower than the rest of their sweep point — flagged, re-measured, shown, kept out of percentiles.

A shared machine sometimes stops a request for a while (another tenant, the kernel; see docs/stalls.md). Such a
request says nothing about the engine, yet one of them sets a p95 of five requests. The rule: a request is a stall when
its time is above its point's median + ``K`` robust standard deviations (1.4826 × the median absolute deviation), and
at least ``MIN_SPREAD`` of the median per deviation, so a tight series is not flagged for ordinary noise. Only slower
requests are flagged: nothing on a machine makes a request faster than the engine can go. A flagged request keeps its
row (``outlier`` True) and the point is measured once more (``remeasured`` True); ``timing.summarize`` leaves flagged rows
out, and ``report`` says how many there were.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

#: Robust standard deviations above the median that make a stall.
K = 5.0
#: The smallest spread assumed, as a share of the median: with K = 5, nothing under 1.5 × the median is flagged.
MIN_SPREAD = 0.10


def flag(df: pd.DataFrame, by: list[str], columns: list[str], k: float = K, min_spread: float = MIN_SPREAD) -> pd.Series:
    """True for each row whose value in any of ``columns`` is above its group's median + ``k`` × spread. Groups of fewer
    than three rows are never flagged (no spread to judge by); missing values are never flagged."""
    flags = pd.Series(False, index=df.index)
    for _, group in df.groupby(by, dropna=False):
        if len(group) < 3:
            continue
        for c in columns:
            values = group[c].dropna()
            if len(values) < 3:
                continue
            median = float(values.median())
            spread = max(1.4826 * float((values - median).abs().median()), min_spread * abs(median))
            flags.loc[values.index[values > median + k * spread]] = True
    return flags


def remeasure(df: pd.DataFrame, by: list[str], columns: list[str], measure: Callable[[pd.Series], dict[str, Any]],
              rounds: int = 2) -> pd.DataFrame:
    """Flag stalls and measure each flagged point again with ``measure(row)`` (a dict: one new row), up to ``rounds``
    times (a re-measurement can stall too). Returns all rows with ``outlier`` and ``remeasured`` columns."""
    df = df.reset_index(drop=True).assign(outlier=False, remeasured=False)
    for _ in range(rounds):
        clean = df[~df.outlier]
        found = flag(clean, by, columns)
        stalled = found[found].index
        if not len(stalled):
            break
        df.loc[stalled, "outlier"] = True
        again = pd.DataFrame([measure(df.loc[i]) | {"outlier": False, "remeasured": True} for i in stalled])
        df = pd.concat([df, again], ignore_index=True)
    return df


def clean(df: pd.DataFrame) -> pd.DataFrame:
    """The rows percentiles are taken over: all, less the flagged stalls."""
    return df[~df.outlier.astype(bool)] if "outlier" in df else df


def report(df: pd.DataFrame, columns: list[str] | None = None) -> str:
    """One sentence: how many timed requests were flagged as stalls and re-measured, and how slow they were."""
    if "outlier" not in df:
        return "no stall check was run on these requests."
    flagged = df[df.outlier.astype(bool)]
    timed = len(df) - int(df.remeasured.astype(bool).sum())
    rule = f"above their point's median + {K:g} robust SD, at least {1 + K * MIN_SPREAD:.1f}× the median"
    if flagged.empty:
        return f"0 of {timed} timed requests flagged as stalls ({rule})."
    worst = ""
    for c in columns or []:
        if c in df and flagged[c].notna().any():
            worst += f"; worst {c} {flagged[c].max() * 1e3:,.0f} ms"
    return (f"{len(flagged)} of {timed} timed requests flagged as stalls ({rule}) and re-measured{worst}; "
            f"percentiles use the {len(clean(df))} others.")
