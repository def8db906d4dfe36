"""Chunked prefill (lesson 04): a long prompt arriving while others decode, the short request behind a long one, what
each chunk size does to the decoders' gaps and the long prompt's TTFT, and their figures."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from kvlab.prompts import distinct_prompts, prompt_of_length
from kvlab.timing import PHASE_COLORS, p95
from kvlab.workload import Arrival, run_workload


def gaps_between(tokens: pd.DataFrame, labels: list[str] | str, start_s: float, end_s: float) -> list[float]:
    """Inter-token gaps of the given requests whose later token landed in [start_s, end_s] (e.g. during a prefill)."""
    labels = [labels] if isinstance(labels, str) else labels
    gaps = []
    for _, part in tokens[tokens.label.isin(labels)].groupby("request_id"):
        t = part.sort_values("token").t_s.to_list()
        gaps += [b - a for a, b in zip(t, t[1:], strict=False) if start_s <= b <= end_s + 1e-9]
    return gaps


#: Output tokens of the long prompt in the interference workloads: its TTFT is what they measure.
LONG_PROMPT_OUTPUT_TOKENS = 4


def interference_arrivals(tokenizer: Any, decoders: int, decoder_prompt: int, decoder_tokens: int, long_prompt: int,
                          long_at_s: float) -> list[Arrival]:
    """``decoders`` short chats streaming from t=0, and one long prompt (a document ingest) arriving at ``long_at_s``."""

    chats = [Arrival(f"decoder {i + 1}", ids, decoder_tokens, 0.0) for i, ids in enumerate(distinct_prompts(tokenizer, decoder_prompt, decoders, seed=5))]
    return chats + [Arrival("long prompt", prompt_of_length(tokenizer, long_prompt, offset=20_000), LONG_PROMPT_OUTPUT_TOKENS,
                            long_at_s)]


def arrival_once_streaming(llm: Any, tokenizer: Any, decoders: int, decoder_prompt: int, decoder_tokens: int,
                           tokens_before: int = 6) -> float:
    """When the long prompt should arrive on this machine: once every decoder has streamed ``tokens_before`` tokens
    (measured on ``llm``, after an untimed warm-up), with half that time again as margin — so the decoders' gaps
    before it exist on a slow machine, and the decoders are still streaming when it comes on a fast one."""
    arrivals = interference_arrivals(tokenizer, decoders, decoder_prompt, decoder_tokens, 64, 0.0)[:decoders]
    for a in arrivals:
        a.max_tokens = min(decoder_tokens, tokens_before + 1)
    run_workload(llm, arrivals)  # warm-up
    tokens, _ = run_workload(llm, arrivals)
    streaming = float(tokens[tokens.token == tokens_before].t_s.max())
    llm.reset_prefix_cache()  # the workload that follows must not reuse these prompts' KV
    return max(0.01, round(1.5 * streaming, 2))


def long_prompt_for_time(llm: Any, tokenizer: Any, options: list[int], target_s: float) -> tuple[int, float]:
    """The longest of ``options`` (prompt tokens, largest first) whose prefill is forecast within ``target_s`` here,
    from one timed prefill of the shortest, in proportion to tokens; else the shortest: (tokens, the timed seconds)."""
    shortest = min(options)
    _, requests = run_workload(llm, [Arrival("probe", prompt_of_length(tokenizer, shortest, offset=40_000), 1, 0.0)])
    llm.reset_prefix_cache()  # the workloads that follow must not reuse the probe's KV
    probe_s = float(requests.ttft_s.iloc[0])
    return next((n for n in options if probe_s * n / shortest <= target_s), shortest), probe_s


def short_behind_long_arrivals(tokenizer: Any, long_prompt: int, short_prompt: int, short_at_s: float) -> list[Arrival]:
    """A long prompt at t=0 and a short interactive request just after it."""

    return [Arrival("long prompt", prompt_of_length(tokenizer, long_prompt, offset=7_000), LONG_PROMPT_OUTPUT_TOKENS, 0.0),
            Arrival("short prompt", prompt_of_length(tokenizer, short_prompt, offset=30_000), 8, short_at_s)]


def interference_summary(tokens: pd.DataFrame, requests: pd.DataFrame) -> dict[str, float]:
    """The long prompt's TTFT and the decoders' inter-token gaps while it was being prefilled (ms)."""

    long = requests[requests.label == "long prompt"].iloc[0]
    decoders = [lbl for lbl in requests.label if lbl.startswith("decoder")]
    during = gaps_between(tokens, decoders, long.arrival_s, long.first_token_s)
    before = gaps_between(tokens, decoders, 0.0, long.arrival_s)
    return {"long_ttft_ms": long.ttft_s * 1e3,
            "decoder_itl_p50_ms": float(pd.Series(during).median() * 1e3) if during else float("nan"),
            "decoder_itl_p95_ms": p95(during) * 1e3 if during else float("nan"),
            "decoder_itl_max_ms": max(during) * 1e3 if during else float("nan"),
            "decoder_itl_before_p50_ms": float(pd.Series(before).median() * 1e3) if before else float("nan")}


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
