"""Plotly figures used across the lessons: titles, axis units and one idea per figure."""

from __future__ import annotations

import math
from typing import Any

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
    fig.update_xaxes(categoryorder="array", categoryarray=list(table.model))
    fig.update_layout(title=f"KV cache per token ({dtype}), all layers, K and V", yaxis_title="KiB per token",
                      xaxis_title="model", legend_title="attention", height=420)
    return fig


def sequences_that_fit(grid: pd.DataFrame) -> go.Figure:
    """Concurrent full-context sequences per model, context and card (log scale); hatched = beyond the model's context."""
    from plotly.subplots import make_subplots

    cards = sorted(grid.memory_gib.unique())
    models = list(dict.fromkeys(grid.model))
    fig = make_subplots(rows=len(cards), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[f"{m:g} GiB card" for m in cards])
    colors = ["#4c8bf5", "#e4572e", "#2ca02c", "#9467bd", "#8c564b"]
    for row, mem in enumerate(cards, start=1):
        for i, ctx in enumerate(sorted(grid.context.unique())):
            part = grid[(grid.memory_gib == mem) & (grid.context == ctx)].set_index("model").loc[models]
            fig.add_bar(x=models, y=part.max_sequences.clip(lower=0.5), name=f"{ctx // 1024}k tokens", legendgroup=str(ctx),
                        showlegend=row == 1, marker_color=colors[i % len(colors)],
                        marker_pattern_shape=["/" if b else "" for b in part.beyond_model_context],
                        text=[str(v) if v else "0" for v in part.max_sequences], textposition="outside", textfont_size=9,
                        hovertemplate="%{x}: %{text} sequences<extra>" + f"{ctx:,} tokens" + "</extra>", row=row, col=1)
        fig.update_yaxes(type="log", dtick=1, title_text="sequences (log)", row=row, col=1)
    fig.update_layout(barmode="group", height=300 * len(cards) + 120, legend_title="context",
                      title="Sequences that fit at once (KV = 90 % of memory − bf16 weights); hatched: beyond the model's own context")
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


def metric_vs_prompt(summary: pd.DataFrame, metric: str, bound: str | None, title: str, ylabel: str, log_y: bool = False) -> go.Figure:
    """Median of ``metric`` vs prompt length with a p50–p95 band, and its lower bound as a dashed line (ms)."""
    s = summary.sort_values("prompt_tokens")
    x = s.prompt_tokens
    fig = go.Figure()
    fig.add_scatter(x=x, y=s[f"{metric}_p95"] * 1e3, mode="lines", line_width=0, showlegend=False, hoverinfo="skip")
    fig.add_scatter(x=x, y=s[f"{metric}_p50"] * 1e3, mode="lines+markers", name="median (band: up to p95)",
                    fill="tonexty", fillcolor="rgba(76,139,245,0.25)", line_color="#4c8bf5")
    if bound:
        fig.add_scatter(x=x, y=s[bound] * 1e3, mode="lines", name="lower bound (machine limit)", line_dash="dash", line_color="black")
    fig.update_layout(title=title, xaxis_title="prompt length (tokens, log)", yaxis_title=ylabel, xaxis_type="log",
                      yaxis_type="log" if log_y else "linear", height=400)
    return fig


def mark_compute_bound(fig: go.Figure, from_tokens: int, max_tokens: int) -> go.Figure:
    """Mark, on a plot against prompt length, the length from which prefill is compute-bound on this machine (a dotted
    vertical line, drawn as a trace so it sits right on log axes); the x axis is widened to show it."""
    ys = [y for trace in fig.data for y in (trace.y if trace.y is not None else []) if y is not None and y > 0]
    low, high = (min(ys) * 0.8, max(ys) * 1.25) if ys else (0.1, 1.0)
    fig.add_scatter(x=[from_tokens, from_tokens], y=[low, high], mode="lines+text", line=dict(dash="dot", color="firebrick"),
                    text=["", f"compute-bound from {from_tokens:,} tokens"], textposition="top right",
                    name=f"prefill compute-bound from {from_tokens:,} tokens (ridge point)")
    xs = [x for trace in fig.data for x in (trace.x if trace.x is not None else []) if x]
    fig.update_xaxes(range=[math.log10(min([from_tokens, *xs]) / 1.5), math.log10(max(max_tokens, from_tokens) * 1.5)])
    return fig


def ttft_bars_by_run(t: pd.DataFrame, by: str, agg: Any, title: str, ylabel: str) -> go.Figure:
    """Collected lab runs (a ``run`` column): TTFT aggregated (``"median"``, ``timing.p95``…) per run and ``by`` group,
    as grouped bars in ms."""
    import plotly.express as px

    m = t.groupby(["run", by], as_index=False).ttft_s.agg(agg)
    return px.bar(m.assign(ttft_ms=m.ttft_s * 1e3), x="run", y="ttft_ms", color=by, barmode="group", title=title,
                  labels={"ttft_ms": ylabel})


def phase_split(df: pd.DataFrame) -> go.Figure:
    """Stacked bars of median prefill and decode time per (prompt length, output length), dominant phase annotated."""
    m = df.groupby(["prompt_tokens", "output_tokens"], as_index=False)[["prefill_s", "decode_s"]].median()
    labels = [f"{p:,} in / {n} out" for p, n in zip(m.prompt_tokens, m.output_tokens, strict=True)]
    fig = go.Figure()
    fig.add_bar(x=labels, y=m.prefill_s, name="prefill", marker_color=PHASE_COLORS["prefill"])
    fig.add_bar(x=labels, y=m.decode_s, name="decode", marker_color=PHASE_COLORS["decode"])
    for label, pre, dec in zip(labels, m.prefill_s, m.decode_s, strict=True):
        top = "prefill" if pre > dec else "decode"
        fig.add_annotation(x=label, y=pre + dec, text=f"{top} {max(pre, dec) / (pre + dec):.0%}", showarrow=False, yshift=10)
    fig.update_layout(barmode="stack", title="Where a request's time goes: prefill vs decode (medians)",
                      yaxis_title="seconds", xaxis_title="prompt tokens / output tokens", height=420, legend_title="phase")
    return fig


def crossover_plot(medians: pd.DataFrame, outputs: list[int], crossings: dict[int, float | None]) -> go.Figure:
    """Prefill time vs prompt length against decode time for N output tokens; crossovers marked."""
    m = medians.sort_values("prompt_tokens")
    fig = go.Figure()
    fig.add_scatter(x=m.prompt_tokens, y=m.prefill_s, mode="lines+markers", name="prefill (measured)", line_color=PHASE_COLORS["prefill"])
    for n in outputs:
        fig.add_scatter(x=m.prompt_tokens, y=(n - 1) * m.tpot_s, mode="lines", name=f"decode of {n} tokens", line_dash="dot")
        if crossings.get(n):
            fig.add_vline(x=crossings[n], line_dash="dash", line_color="grey",
                          annotation_text=f"{n} out: crossover ≈ {crossings[n]:,.0f} tokens", annotation_position="top left")
    fig.update_layout(title="When does prefill outweigh decode?", xaxis_title="prompt length (tokens, log)", xaxis_type="log",
                      yaxis_title="seconds", yaxis_type="log", height=420)
    return fig


def itl_scatter(streams: pd.DataFrame) -> go.Figure:
    """Every inter-token gap of each streamed request, by token position (ms)."""
    fig = go.Figure()
    for _, row in streams.iterrows():
        gaps = [g * 1e3 for g in row.itl_s]
        fig.add_scatter(x=list(range(2, len(gaps) + 2)), y=gaps, mode="markers", name=f"{row.prompt_tokens:,}-token prompt")
    fig.update_layout(title="Inter-token latency (ITL): every gap in the stream", xaxis_title="output token #",
                      yaxis_title="gap since previous token (ms)", height=380)
    return fig


def decode_fit(widths: pd.DataFrame, fit: Any, bandwidth: float) -> go.Figure:
    """TPOT of every request against the bytes its decode step reads (one colour per model width; stalls as crosses),
    the fitted line overhead + bytes ÷ bandwidth, and the bound bytes ÷ peak bandwidth through zero."""
    fig = go.Figure()
    flagged = widths.outlier.astype(bool) if "outlier" in widths else pd.Series(False, index=widths.index)
    for hidden, g in widths[~flagged].groupby("hidden_size"):
        fig.add_scatter(x=g.step_bytes / 1e6, y=g.tpot_s * 1e3, mode="markers", name=f"hidden size {hidden}")
    if flagged.any():
        f = widths[flagged]
        fig.add_scatter(x=f.step_bytes / 1e6, y=f.tpot_s * 1e3, mode="markers", marker_symbol="x", marker_color="grey",
                        name="stalls (flagged, re-measured)")
    x = [0.0, float(widths.step_bytes.max()) * 1.1]
    fig.add_scatter(x=[v / 1e6 for v in x], y=[(fit.overhead_s + v / fit.bandwidth) * 1e3 for v in x], mode="lines",
                    name=f"fit: {fit.overhead_s * 1e3:.1f} ms + bytes ÷ {fit.bandwidth / 1e9:.1f} GB/s", line_color="#4c8bf5")
    fig.add_scatter(x=[v / 1e6 for v in x], y=[v / bandwidth * 1e3 for v in x], mode="lines", line_dash="dash",
                    line_color="black", name=f"bound: bytes ÷ peak {bandwidth / 1e9:.1f} GB/s")
    fig.update_layout(title="TPOT = fixed cost per step + bytes ÷ bandwidth", xaxis_title="bytes read per decode step (MB)",
                      yaxis_title="TPOT (ms)", height=420)
    return fig


def token_timeline(tokens: pd.DataFrame, requests: pd.DataFrame, title: str) -> go.Figure:
    """Every token of every request over time; the long prompt's arrival and first token marked."""
    fig = go.Figure()
    for label, part in tokens.groupby("label", sort=False):
        fig.add_scatter(x=part.t_s, y=part.token, mode="lines+markers", marker_size=3, name=label,
                        line_color="black" if label == "long prompt" else None)
    for _, r in requests[requests.label == "long prompt"].iterrows():
        fig.add_vrect(x0=r.submitted_s, x1=r.first_token_s, fillcolor=PHASE_COLORS["prefill"], opacity=0.15, line_width=0,
                      annotation_text="long prompt's prefill", annotation_position="top left")
    fig.update_layout(title=title, xaxis_title="time since start (s)", yaxis_title="tokens received", height=400)
    return fig


def tradeoff(summary: pd.DataFrame) -> go.Figure:
    """Each configuration as a point: the long prompt's TTFT against the decoders' worst gaps during it."""
    fig = go.Figure()
    fig.add_scatter(x=summary.long_ttft_ms / 1e3, y=summary.decoder_itl_p95_ms, mode="markers+text", text=summary.config,
                    textposition="top center", name="p95 gap", marker_size=10)
    fig.add_scatter(x=summary.long_ttft_ms / 1e3, y=summary.decoder_itl_max_ms, mode="markers", name="max gap", marker_symbol="x")
    fig.update_layout(title="Chunked prefill's trade-off: the long prompt waits longer, the decoders stall less",
                      xaxis_title="long prompt's TTFT (s)", yaxis_title="decoders' inter-token gap during it (ms)", yaxis_type="log", height=440)
    return fig


def bad_dashboard(runs: dict[str, pd.DataFrame], window_s: float = 2.0) -> go.Figure:
    """Three panels for traffic mixes: output tokens/s over time (looks flat), TTFT p50/p95 (doesn't), and prompt
    tokens sent per second (the cause)."""
    from plotly.subplots import make_subplots

    from kvlab.timing import p95
    from kvlab.traffic import tokens_per_window

    fig = make_subplots(rows=1, cols=3, subplot_titles=("Output tokens/s (the usual panel)", "TTFT p50 and p95",
                                                        "Prompt tokens sent per second"))
    colors = ["#636efa", "#ef553b", "#00cc96", "#ab63fa"]
    for i, (name, df) in enumerate(runs.items()):
        color = colors[i % len(colors)]
        w = tokens_per_window(df, window_s)
        fig.add_scatter(x=w.t_s, y=w.tokens_per_s, name=name, mode="lines+markers", line_color=color, legendgroup=name, row=1, col=1)
        fig.add_bar(x=["p50", "p95"], y=[df.ttft_s.median() * 1e3, p95(df.ttft_s) * 1e3], name=name, marker_color=color,
                    legendgroup=name, showlegend=False, row=1, col=2)
        sent = (df.sent_s // window_s * window_s).rename("t_s")
        prompt_rate = df.groupby(sent).prompt_tokens.sum().reindex(w.t_s, fill_value=0) / window_s
        fig.add_scatter(x=prompt_rate.index, y=prompt_rate.to_numpy(), name=name, mode="lines+markers", line_color=color,
                        legendgroup=name, showlegend=False, row=1, col=3)
    fig.update_xaxes(title_text="seconds since start", row=1, col=1)
    fig.update_xaxes(title_text="percentile", row=1, col=2)
    fig.update_xaxes(title_text="seconds since start", row=1, col=3)
    fig.update_yaxes(title_text="output tokens / s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="TTFT (ms)", row=1, col=2)
    fig.update_yaxes(title_text="prompt tokens / s", row=1, col=3)
    fig.update_layout(barmode="group", height=420, title="Same tokens/sec, very different first-token waits")
    return fig


def capacity_sweep(table: pd.DataFrame, objective: Any, knee_rps: float, sustainable: dict[str, Any],
                   title: str = "Capacity under the SLO: throughput keeps rising after goodput collapses") -> go.Figure:
    """The rate sweep on one figure: throughput and goodput (top, req/s), TTFT p50/p(SLO) and TPOT p(SLO) with the SLO
    lines (bottom, ms, log scale) against the arrival rate; the knee (goodput's peak) and the maximum sustainable
    rate marked. ``table`` is ``slo.rate_table``'s."""
    from plotly.subplots import make_subplots

    q = f"p{objective.percentile:g}"
    x = table.rate_rps
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("requests per second served", "latency (client clock, queueing included)"))
    fig.add_scatter(x=x, y=table.throughput_rps, name="throughput (all requests)", mode="lines+markers", row=1, col=1)
    fig.add_scatter(x=x, y=table.goodput_rps, name="goodput (requests meeting the SLO)", mode="lines+markers", row=1, col=1)
    fig.add_scatter(x=x, y=x, name="offered load (= arrival rate)", mode="lines", line={"dash": "dot", "color": "gray"}, row=1, col=1)
    colors = {"ttft": "#e4572e", "tpot": "#4c8bf5"}
    fig.add_scatter(x=x, y=table.ttft_p50_ms, name="TTFT p50", mode="lines+markers", line={"color": colors["ttft"], "dash": "dot"}, row=2, col=1)
    fig.add_scatter(x=x, y=table[f"ttft_{q}_ms"], name=f"TTFT {q}", mode="lines+markers", line={"color": colors["ttft"]}, row=2, col=1)
    fig.add_scatter(x=x, y=table[f"tpot_{q}_ms"], name=f"TPOT {q}", mode="lines+markers", line={"color": colors["tpot"]}, row=2, col=1)
    fig.add_hline(y=objective.ttft_ms, line_dash="dash", line_color=colors["ttft"], annotation_text=f"TTFT SLO {objective.ttft_ms:,.0f} ms", row=2, col=1)
    fig.add_hline(y=objective.tpot_ms, line_dash="dash", line_color=colors["tpot"], annotation_text=f"TPOT SLO {objective.tpot_ms:,.0f} ms", row=2, col=1)
    fig.add_vline(x=knee_rps, line_dash="dot", line_color="black", annotation_text="knee: goodput peaks", row="all", col=1)
    if sustainable.get("rate") is not None:
        label = ("≥ " if sustainable["at_least"] else "") + f"max sustainable {sustainable['rate']:.2f} req/s"
        fig.add_vline(x=sustainable["rate"], line_color="green", annotation_text=label, annotation_position="bottom right", row="all", col=1)
    fig.update_yaxes(title_text="req/s", row=1, col=1)
    fig.update_yaxes(title_text="ms", type="log", row=2, col=1)
    fig.update_xaxes(title_text="arrival rate (requests/s, Poisson)", row=2, col=1)
    fig.update_layout(title=title, height=650, legend={"orientation": "h", "y": -0.15})
    return fig


def in_flight(runs: dict[str, pd.DataFrame], step_s: float = 0.25) -> go.Figure:
    """Requests in the system (arrived, last token not yet out) over time, one line per run: flat for a closed loop,
    climbing for an open loop above capacity."""
    fig = go.Figure()
    for name, df in runs.items():
        end = float(df.last_token_s.max())
        times = [i * step_s for i in range(int(end / step_s) + 1)]
        counts = [int(((df.arrival_s <= t) & (df.last_token_s > t)).sum()) for t in times]
        fig.add_scatter(x=times, y=counts, name=name, mode="lines")
    fig.update_layout(title="Requests in the system over time: a closed loop caps the queue, an open loop does not",
                      xaxis_title="time since the run began (s)", yaxis_title="requests in flight")
    return fig


def mitigations(table: pd.DataFrame, objective: Any) -> go.Figure:
    """Chat TTFT p(SLO) per setting (log ms, the SLO drawn) next to batch throughput (tokens/s)."""
    from plotly.subplots import make_subplots

    q = f"p{objective.percentile:g}"
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"chat TTFT {q} (ms, log)", "batch work done (prompt + output tokens/s)"))
    fig.add_bar(x=table.setting, y=table[f"chat TTFT {q} (ms)"], name=f"chat TTFT {q}", marker_color="#e4572e", row=1, col=1)
    fig.add_hline(y=objective.ttft_ms, line_dash="dash", annotation_text="TTFT SLO", row=1, col=1)
    fig.add_bar(x=table.setting, y=table["batch tokens/s"], name="batch tokens/s", marker_color="#4c8bf5", row=1, col=2)
    fig.update_yaxes(type="log", title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="tokens/s", row=1, col=2)
    fig.update_layout(title="Chat next to batch jobs: each mitigation on the same traffic", showlegend=False, height=420)
    return fig


def goodput_by_run(t: pd.DataFrame) -> go.Figure:
    """Goodput and throughput against arrival rate, one pair of lines per run (``kvlab labs collect``)."""
    fig = go.Figure()
    for run, part in t.groupby("run"):
        part = part.sort_values("rate_rps")
        fig.add_scatter(x=part.rate_rps, y=part.goodput_rps, name=f"{run}: goodput", mode="lines+markers")
        fig.add_scatter(x=part.rate_rps, y=part.throughput_rps, name=f"{run}: throughput", mode="lines", line={"dash": "dot"})
    fig.update_layout(title="L07 · goodput and throughput vs arrival rate, per run", xaxis_title="arrival rate (requests/s)",
                      yaxis_title="requests/s")
    return fig


def block_pool(life: pd.DataFrame, t0: float, end_ts: float,
               title: str = "The prefix cache's blocks over time (from the engine's KV events)") -> go.Figure:
    """One horizontal bar per cached block — from stored to removed (or to ``end_ts`` if still cached) — coloured by
    owner, times in seconds since ``t0``: who holds the pool, and whose blocks are evicted when it fills."""
    fig = go.Figure()
    life = life.reset_index(drop=True)
    for owner, part in life.groupby(life.owner.replace("", "other"), sort=False):
        end = part.removed_ts.fillna(end_ts)
        fig.add_bar(y=part.index, x=end - part.stored_ts, base=part.stored_ts - t0, orientation="h", name=owner,
                    hovertemplate="block %{y}: cached %{base:.2f}–%{x:.2f} s<extra>" + owner + "</extra>")
    fig.update_layout(title=title, barmode="overlay", xaxis_title="time (s)", yaxis_title="cached block (in order stored)",
                      yaxis_autorange="reversed", legend_title="owner", height=420)
    return fig


def hit_rate_by_budget(table: pd.DataFrame, survival_blocks: int | None = None,
                       title: str = "The prefix survives once the pool holds it and everything cached between its uses") -> go.Figure:
    """Per KV budget (blocks): the engine's token hit rate and the share of shared requests that hit the prefix (left),
    shared-prefix TTFT p50/p95 (right, ms); the survival budget marked (``paged.budget_table``'s columns)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    hit_share = table.prefix_hits / (table.shared_requests - 1).clip(lower=1)
    fig.add_scatter(x=table.budget_blocks, y=table.token_hit_rate, name="prefix-cache hit rate (tokens, engine)",
                    mode="lines+markers")
    fig.add_scatter(x=table.budget_blocks, y=hit_share, name="shared requests that hit (after the first)",
                    mode="lines+markers", line_dash="dash")
    for q, dash in (("p50", "dot"), ("p95", "dashdot")):
        fig.add_scatter(x=table.budget_blocks, y=table[f"shared_ttft_{q}_ms"], name=f"shared-prefix TTFT {q} (ms)",
                        mode="lines+markers", line_dash=dash, secondary_y=True)
    if survival_blocks:
        fig.add_vline(x=survival_blocks, line_dash="dash",
                      annotation_text=f"prefix + cached since + 2 = {survival_blocks} blocks")
    fig.update_layout(title=title, xaxis_title="KV pool (blocks)", yaxis_title="hit rate (0-1)", yaxis2_title="TTFT (ms)")
    return fig
