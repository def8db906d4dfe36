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
