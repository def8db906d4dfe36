"""Plotly figures used across the lessons: titles, axis units and one idea per figure."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kvlab.timing import PHASES

PHASE_COLORS = {"queue": "#9e9e9e", "prefill": "#e4572e", "decode": "#4c8bf5"}


def use_offline_renderer() -> None:
    """Figures embed plotly.js inline, so executed notebooks and their HTML pages work offline."""
    import plotly.io as pio

    pio.renderers.default = "notebook+plotly_mimetype"


def request_timeline(row: pd.Series | dict, title: str = "One request's timeline") -> go.Figure:
    """Horizontal bar of one request: queue, prefill, decode (ms), from a ``request_timing`` row."""
    fig = go.Figure()
    start = 0.0
    for phase in PHASES:
        width = float(row[f"{phase}_s"]) * 1e3
        fig.add_bar(y=["request"], x=[width], base=[start], orientation="h", name=phase,
                    marker_color=PHASE_COLORS[phase], hovertemplate=f"{phase}: %{{x:.1f}} ms<extra></extra>")
        start += width
    marks = {"scheduled": float(row["queue_s"]) * 1e3,
             "first token": (float(row["queue_s"]) + float(row["prefill_s"])) * 1e3,
             "last token": start}
    for label, x in marks.items():
        fig.add_vline(x=x, line_dash="dot", line_color="black", annotation_text=label, annotation_position="top")
    fig.update_layout(title=title, barmode="overlay", height=260, xaxis_title="time since queued (ms)",
                      yaxis_visible=False, legend_title="phase", margin={"t": 80})
    return fig
