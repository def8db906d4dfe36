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


def memory_split(model: str, weight_gib: float, kv_gib: float, usable_gib: float, sequences: int, context: int,
                 plan: object) -> go.Figure:
    """One card's usable memory as a stacked bar: weights, the KV cache asked for, what is left (GiB)."""
    free = usable_gib - weight_gib - kv_gib
    fig = go.Figure()
    fig.add_bar(y=["memory"], x=[weight_gib], name="weights", orientation="h", marker_color="#6c757d")
    fig.add_bar(y=["memory"], x=[kv_gib], name=f"KV: {sequences} × {context:,} tokens", orientation="h",
                marker_color="#e4572e" if free < 0 else "#4c8bf5")
    if free > 0:
        fig.add_bar(y=["memory"], x=[free], name="headroom", orientation="h", marker_color="#d9ead3")
    fig.add_vline(x=usable_gib, line_dash="dash", annotation_text=f"usable {usable_gib:.0f} GiB")
    verdict = "fits" if free >= 0 else f"does NOT fit ({-free:.1f} GiB short)"
    fig.update_layout(barmode="stack", height=260, xaxis_title="GiB",
                      title=f"{model}: {sequences} sequences × {context:,} tokens {verdict} — at most "
                            f"{plan.max_sequences} sequences at this context, {plan.largest_context_for_target or 0:,} tokens max for {sequences}",
                      title_font_size=13, yaxis_visible=False, margin={"t": 70})
    return fig


def bytes_per_token_bar(table: pd.DataFrame, dtype: str) -> go.Figure:
    """KV bytes per token for each model preset, coloured by attention type."""
    fig = go.Figure()
    colors = {"MHA": "#e4572e", "GQA": "#4c8bf5", "MQA": "#2ca02c", "MLA": "#9467bd"}
    for att, part in table.groupby("attention", sort=False):
        fig.add_bar(x=part.model, y=part.kv_bytes_per_token / 1024, name=att, marker_color=colors.get(att))
    fig.update_layout(title=f"KV cache per token ({dtype}), all layers, K and V", yaxis_title="KiB per token",
                      xaxis_title="model", legend_title="attention", height=420)
    return fig


def sequences_that_fit(grid: pd.DataFrame) -> go.Figure:
    """Concurrent full-context sequences per model, context and card (log scale); grey = beyond the model's context."""
    import plotly.express as px

    df = grid.assign(context=grid.context.map(lambda c: f"{c // 1024}k"), card=grid.memory_gib.map(lambda m: f"{m:.0f} GiB card"),
                     sequences=grid.max_sequences.clip(lower=0.5))
    fig = px.bar(df, x="model", y="sequences", color="context", barmode="group", facet_row="card", log_y=True,
                 pattern_shape="beyond_model_context", pattern_shape_map={True: "/", False: ""},
                 title="Sequences that fit at once (KV budget = 90 % of memory − bf16 weights); hatched: beyond the model's own context",
                 labels={"sequences": "sequences (log)"}, height=640)
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=")[-1]))
    return fig


def capacity_lines(results: pd.DataFrame) -> go.Figure:
    """Sequences that fit vs context length, one line per card memory (log-log)."""
    fig = go.Figure()
    for mem, part in results.groupby("memory_gib"):
        fig.add_scatter(x=part.context, y=part.max_sequences.clip(lower=0.5), mode="lines+markers", name=f"{mem:g} GiB")
    model = results.model.iloc[0]
    fig.update_layout(title=f"{model}: concurrent full-context sequences that fit ({results.kv_dtype.iloc[0]} KV)",
                      xaxis_title="context length (tokens)", yaxis_title="sequences (log)", xaxis_type="log", yaxis_type="log",
                      legend_title="card memory", height=420)
    return fig
