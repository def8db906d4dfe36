"""What every topic's figures share: annotations placed where they belong on log axes.

Plotly reads an annotation's coordinate on a log axis as log10 of the value, but ``add_hline``/``add_vline`` (and a
plain ``add_annotation``) pass the value itself: a label meant for 500 ms lands at 10^500 and drags the axis with it
(plotly.py's known behaviour). ``place_on_log_axes`` converts them once the axis types are set.
"""

from __future__ import annotations

import math
from typing import Any

_PLACED = "kvlab-log-placed"  # set on an annotation once converted, so a second call changes nothing


def _axis(fig: Any, ref: str | None) -> Any:
    """The layout axis an annotation coordinate refers to in data units (None for paper or domain references)."""
    if not ref or ref == "paper" or ref.endswith("domain"):
        return None
    return fig.layout[f"{ref[0]}axis{ref[1:]}"]


def place_on_log_axes(fig: Any) -> Any:
    """Convert every data-unit annotation coordinate on a log axis to log10 (once); returns the figure."""
    for ann in fig.layout.annotations:
        if ann.name == _PLACED:
            continue
        for letter in ("x", "y"):
            axis, value = _axis(fig, getattr(ann, f"{letter}ref")), getattr(ann, letter)
            if axis is not None and axis.type == "log" and isinstance(value, (int, float)) and value > 0:
                setattr(ann, letter, math.log10(value))
        ann.name = _PLACED
    return fig


def _numbers(values: Any) -> list[float]:
    """The finite numbers among a trace's coordinates (categories, dates and gaps left out), numpy arrays and the
    base64 form plotly writes them in (``{"bdata": …, "dtype": …}``, what an executed notebook holds) included."""
    import base64

    import numpy as np

    if values is None:
        return []
    if isinstance(values, dict) and "bdata" in values:
        values = np.frombuffer(base64.b64decode(values["bdata"]), dtype=values.get("dtype", "f8"))
    if isinstance(values, np.ndarray):
        values = values.ravel().tolist() if values.dtype.kind in "iuf" else list(values.ravel())
    out = []
    for v in values:
        if isinstance(v, (np.integer, np.floating)):
            v = v.item()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
    return out


def overreach(fig: Any, decades: float = 2.0) -> list[str]:
    """Annotations and axis ranges that lie far beyond the plotted data: on a log axis more than ``decades`` decades
    past it, on a linear one more than 10 spans — the mark of a label placed in the wrong units. One line each."""
    extents: dict[str, list[float]] = {}
    for trace in fig.data:
        for letter in ("x", "y"):
            ref = getattr(trace, f"{letter}axis", None) or letter
            extents.setdefault(ref, []).extend(_numbers(getattr(trace, letter, None)))
    problems = []

    def check(ref: str, value: float, what: str) -> None:
        axis, data = _axis(fig, ref), extents.get(ref, [])
        if axis is None or not data:
            return
        if axis.type == "log":
            logs = [math.log10(v) for v in data if v > 0]
            if logs and (value > max(logs) + decades or value < min(logs) - decades):
                problems.append(f"{what} at 10^{value:.3g} on a log axis whose data span 10^{min(logs):.2g}–10^{max(logs):.2g}")
        else:
            lo, hi = min(data), max(data)
            span = max(hi - lo, abs(hi), 1e-12)
            if value > hi + 10 * span or value < lo - 10 * span:
                problems.append(f"{what} at {value:.3g} on an axis whose data span {lo:.3g}–{hi:.3g}")

    for ann in fig.layout.annotations:
        for letter in ("x", "y"):
            ref, value = getattr(ann, f"{letter}ref") or letter, getattr(ann, letter)
            if isinstance(value, (int, float)) and ref != "paper" and not ref.endswith("domain"):
                check(ref, float(value), f"annotation '{(ann.text or '')[:40]}'")
    for ref in extents:
        axis = _axis(fig, ref)
        if axis is not None and axis.range is not None:
            for value in axis.range:
                if isinstance(value, (int, float)):
                    check(ref, float(value), f"the {ref} axis range")
    return problems


def output_problems(outputs: list[dict[str, Any]]) -> list[str]:
    """``overreach`` over every plotly figure among a notebook cell's outputs (nbformat's dicts): the one check the
    course build and nbval apply to a cell."""
    import json

    import plotly.io as pio

    problems = []
    for out in outputs:
        spec = (out.get("data") or {}).get("application/vnd.plotly.v1+json")
        if spec is not None:
            problems += overreach(pio.from_json(json.dumps(spec)))
    return problems
