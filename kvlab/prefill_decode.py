"""Prefill against decode (lesson 02): sweeps of prompt and output length on one engine, where prefill time overtakes
decode time, decode time against model width, and their figures."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from kvlab import outliers, roofline
from kvlab.prompts import check_fits, distinct_prompts
from kvlab.runtime import figures
from kvlab.runtime.engine import close_engine, make_engine
from kvlab.runtime.errors import KVLabError
from kvlab.timing import PHASE_COLORS, PRECISION, generate_timed, relative_ci, request_timing
from kvlab.variants import prepare_width_variant


def sweep(llm: Any, prompt_lengths: list[int], output_lengths: list[int], repeats: int, warmup: int = 1,
          desc: str = "sweep", sampling: dict[str, Any] | None = None, min_repeats: int | None = None,
          reuse: pd.DataFrame | None = None, **settings: Any) -> pd.DataFrame:
    """Time prompt lengths × output lengths × repeats, one request at a time, each cold (greedy unless ``sampling``
    gives other ``SamplingParams`` fields). With ``min_repeats``, ``repeats`` is a ceiling: after ``min_repeats``
    a point is repeated only while its median TTFT or TPOT is known to worse than ``timing.PRECISION``
    (``timing.relative_ci``), so quiet points cost few requests and noisy ones get more.

    Warm-up first (untimed, every prompt length, at most 8 output tokens); every timed request gets a prompt cut from
    a different place in the text and the prefix cache is emptied before it, so nothing is reused. Repeats are the outer loop, so
    slow moments of a shared machine spread over all points. A request far slower than its point (a stall,
    ``kvlab.outliers``) is flagged and its point measured again; the sentence saying how many is printed.
    ``settings`` become columns of every row. ``reuse``: rows of an earlier sweep on the same engine and settings;
    the (prompt, output) points it already timed are taken from it, not timed again.
    """
    import time

    from tqdm.auto import tqdm


    if repeats < 1 or not prompt_lengths or not output_lengths:
        raise KVLabError("sweep needs at least one prompt length, one output length and repeats ≥ 1.")
    tok = llm.get_tokenizer()
    max_len = llm.llm_engine.vllm_config.model_config.max_model_len
    for p in prompt_lengths:
        check_fits(p, max(output_lengths), max_len)
    prompts = {p: distinct_prompts(tok, p, repeats + warmup, seed=p) for p in prompt_lengths}
    for p in prompt_lengths:
        for w in range(warmup):
            generate_timed(llm, prompts[p][repeats + w], min(*output_lengths, 8), **(sampling or {}))

    def timed(p: int, n: int, r: int) -> dict[str, Any]:
        llm.reset_prefix_cache()
        start = time.perf_counter()
        out = generate_timed(llm, prompts[p][r], n, **(sampling or {}))
        wall = time.perf_counter() - start  # what `vllm bench latency` times: the whole generate call
        return request_timing(out) | {"repeat": r, "generate_wall_s": wall} | settings

    def settled(p: int, n: int) -> bool:
        mine = [row for row in rows if row["point"] == (p, n)]
        return all(relative_ci([row[c] for row in mine]) <= PRECISION for c in ("ttft_s", "tpot_s") if n > 1 or c == "ttft_s")

    points = [(p, n) for p in prompt_lengths for n in output_lengths]
    kept = pd.DataFrame()
    if reuse is not None:
        kept = reuse[[pt in points for pt in zip(reuse.prompt_tokens, reuse.output_tokens, strict=True)]]
        have = set(zip(kept.prompt_tokens, kept.output_tokens, strict=True))
        points = [pt for pt in points if pt not in have]
    rows: list[dict[str, Any]] = []
    with tqdm(total=repeats * len(points), desc=desc, unit="req") as bar:
        for r in range(repeats):
            for p, n in points:
                if min_repeats is None or r < min_repeats or not settled(p, n):
                    rows.append(timed(p, n, r) | {"point": (p, n)})
                bar.update()
    if not rows:
        return kept.reset_index(drop=True)
    df = outliers.remeasure(pd.DataFrame(rows).drop(columns="point"), ["prompt_tokens", "output_tokens"], ["ttft_s", "tpot_s"],
                            lambda row: timed(int(row.prompt_tokens), int(row.output_tokens), int(row["repeat"])))
    print(outliers.report(df, ["ttft_s", "tpot_s"]))
    df = pd.concat([kept, df], ignore_index=True) if len(kept) else df
    if min_repeats is not None:
        counts = pd.Series([row["point"] for row in rows]).value_counts()
        print(f"timed requests per point: {counts.min()}–{counts.max()} (at least {min_repeats}, at most {repeats}: "
              f"a point stops once its median TTFT and TPOT are known to ±{PRECISION:.0%}, 95 % confidence).")
    return df


def crossover(medians: pd.DataFrame, output_tokens: int) -> float | None:
    """Prompt length where prefill time equals decode time for ``output_tokens`` tokens (interpolated), or None.

    ``medians`` has one row per prompt length with median ``prefill_s`` and ``tpot_s``.
    """
    m = medians.sort_values("prompt_tokens")
    diff = (m.prefill_s - (output_tokens - 1) * m.tpot_s).to_list()
    p = m.prompt_tokens.to_list()
    for i in range(len(p) - 1):
        if diff[i] == 0:
            return float(p[i])
        if diff[i] < 0 < diff[i + 1]:
            return float(p[i] + (p[i + 1] - p[i]) * (-diff[i]) / (diff[i + 1] - diff[i]))
    return None


def decode_by_width(factors: list[float], prompt_tokens: int = 128, output_tokens: int = 32, repeats: int = 3,
                    base: str | None = None, min_repeats: int | None = None) -> pd.DataFrame:
    """TPOT of the chosen (or ``base``) model made wider (``variants.prepare_width_variant``: same layers, random weights):
    one engine per width (eager on CPU, fast to start), one cold request at a time. One row per request, with the
    width, the weight bytes and the bytes one decode step reads (weights + the KV of the average context)."""
    from tqdm.auto import tqdm


    tables = []
    for factor in tqdm(factors, desc="model widths", unit="model"):
        path = prepare_width_variant(factor, base)
        llm = make_engine(str(path), enable_prefix_caching=False, kv_cache_gib=0.25,
                          max_model_len=max(1024, prompt_tokens + output_tokens))
        try:
            cost = roofline.engine_cost(llm)
            hidden = llm.llm_engine.vllm_config.model_config.hf_config.get_text_config().hidden_size
            df = sweep(llm, [prompt_tokens], [output_tokens], repeats, min_repeats=min_repeats, desc=f"hidden {hidden}")
        finally:
            close_engine(llm)
        tables.append(df.assign(width_factor=factor, hidden_size=hidden, weight_bytes=cost.weights_read(1),
                                step_bytes=cost.decode_step_bytes(prompt_tokens + output_tokens / 2)))
    return pd.concat(tables, ignore_index=True)


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
    return figures.place_on_log_axes(fig)


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
