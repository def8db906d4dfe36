"""Per-request timing read from the engine's own timestamps.

Definitions (the names vLLM's benchmarks use):
- **queue time**: request queued in the engine → first scheduled (waiting for a slot / KV blocks).
- **prefill time**: first scheduled → first output token (the prompt's forward pass, possibly in chunks).
- **TTFT** (time to first token): request arrival → first output token; includes queue and prefill.
  vLLM's ``first_token_latency`` measures it from the moment the request arrived at the front end.
- **decode time**: first output token → last output token.
- **TPOT** (time per output token): decode time ÷ (output tokens − 1); the first token belongs to TTFT.
- **E2E latency**: arrival → last token = TTFT + decode time.
- **ITL** (inter-token latency): every gap between two consecutive *chunks* of the stream, as seen by whoever
  reads it; its tail (p95, max) shows stalls that a mean hides. Needs token-by-token timing (``stream_timing``).
  Within one request whose chunks carry one token each, the mean of its gaps equals its TPOT. In general they differ:
  vLLM's ``bench serve`` pools the gaps of *all* requests before taking the mean (so long requests weigh more;
  ``vllm/benchmarks/serve.py``: ``itls += outputs[i].itl``), and a chunk can carry several tokens (speculative
  decoding, stream batching), so one gap then covers several tokens.

Other tools use the same words for different things (see ``NAMES_ACROSS_TOOLS``, with the versions it describes):
AIPerf calls vLLM's TPOT "inter_token_latency" and reports the per-chunk gaps as "inter_chunk_latency"; LLMPerf's
"inter_token_latency_s" includes the first token's wait; GuideLLM's per-token definitions changed between releases.

vLLM's engine clock (``queued_ts`` … ``last_token_ts``) is monotonic; ``arrival_time`` is wall-clock,
so the two are never subtracted from each other here.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from kvlab.runtime.engine import chat
from kvlab.runtime.errors import KVLabError

#: Phase names, in order, for tables and plots.
PHASES = ("queue", "prefill", "decode")

#: How benchmark tools name these metrics, as the named versions define them (definitions move: check yours):
#: vLLM 0.32 ``vllm bench serve`` (vllm/benchmarks/serve.py), AIPerf 0.13 (its metrics reference; GenAI-Perf, its
#: predecessor, used the same names), GuideLLM 0.3 (its ``GenerativeRequestStats``; earlier releases defined its
#: per-token figures differently), LLMPerf (ray-project/llmperf at its last release).
NAMES_ACROSS_TOOLS = [
    {"KV Lab / vLLM bench 0.32": "TTFT", "AIPerf 0.13": "time_to_first_token", "GuideLLM 0.3": "time_to_first_token",
     "LLMPerf": "ttft_s", "meaning": "arrival → first output token"},
    {"KV Lab / vLLM bench 0.32": "TPOT", "AIPerf 0.13": "inter_token_latency", "GuideLLM 0.3": "inter_token_latency",
     "LLMPerf": "—", "meaning": "(E2E − TTFT) ÷ (output tokens − 1), per request"},
    {"KV Lab / vLLM bench 0.32": "ITL", "AIPerf 0.13": "inter_chunk_latency", "GuideLLM 0.3": "—",
     "LLMPerf": "—", "meaning": "each gap between consecutive stream chunks (vLLM bench: pooled over all requests; "
                                "a chunk may hold several tokens)"},
    {"KV Lab / vLLM bench 0.32": "—", "AIPerf 0.13": "—", "GuideLLM 0.3": "time_per_output_token",
     "LLMPerf": "inter_token_latency_s", "meaning": "E2E ÷ output tokens: the first token's wait included"},
    {"KV Lab / vLLM bench 0.32": "E2E latency (E2EL)", "AIPerf 0.13": "request_latency", "GuideLLM 0.3": "request_latency",
     "LLMPerf": "end_to_end_latency_s", "meaning": "arrival → last output token"},
]


def _metrics(out: Any) -> Any:
    m = getattr(out, "metrics", None)
    if m is None or getattr(m, "first_token_ts", 0) == 0:

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


#: How well a repeated point's median must be known before it stops repeating (``relative_ci``): ±10 %, 95 % confidence.
PRECISION = 0.10


def relative_ci(values: Iterable[float], z: float = 1.96) -> float:
    """Half-width of the ~95 % confidence interval of the median, as a share of the median (SE of a median ≈
    1.2533 × SD ÷ √n). Sizes repeats by what they buy: a tight point stops early, a noisy one gets more."""
    vals = [v for v in values if v == v]
    if len(vals) < 2:
        return float("inf")
    median = statistics.median(vals)
    return z * 1.2533 * statistics.stdev(vals) / len(vals) ** 0.5 / abs(median) if median else float("inf")


def summarize(df: pd.DataFrame, columns: Iterable[str] = ("ttft_s", "tpot_s", "e2e_s"), by: list[str] | None = None) -> pd.DataFrame:
    """Median and p95 (never a lone mean) of the timing columns, optionally per group. Rows flagged as stalls
    (``outlier`` True, see ``kvlab.outliers``) are left out; ``requests`` counts the rows used."""
    columns = list(columns)
    if "outlier" in df:
        df = df[~df.outlier.astype(bool)]

    def _one(g: pd.DataFrame) -> pd.Series:
        stats: dict[str, float] = {"requests": float(len(g))}
        for c in columns:
            stats[f"{c}_p50"] = statistics.median(g[c].dropna()) if g[c].notna().any() else float("nan")
            stats[f"{c}_p95"] = p95(g[c])
        return pd.Series(stats)

    if not by:
        return _one(df).to_frame().T
    return df.groupby(by).apply(_one, include_groups=False).reset_index()


def stream_timing(llm: Any, prompt_token_ids: list[int], max_tokens: int, ignore_eos: bool = True) -> dict[str, Any]:
    """Drive one request chunk by chunk in-process and time each chunk as the caller receives it.

    This is the client-side timing shape: TTFT = first chunk − submit; TPOT = (last chunk − first chunk) ÷ (tokens −
    1); ITL = every gap between chunks (``itl_s``), with the tokens each chunk carried (``chunk_tokens``: one each
    without speculative decoding, several with it). The engine's own timestamps come back alongside (``engine_*``).
    """
    import time
    import uuid

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos, output_kind=RequestOutputKind.DELTA)
    engine = llm.llm_engine
    rid = f"stream-{uuid.uuid4().hex[:8]}"
    stamps: list[float] = []
    sizes: list[int] = []
    token_ids: list[int] = []
    final = None
    submit = time.perf_counter()
    engine.add_request(rid, TokensPrompt(prompt_token_ids=list(prompt_token_ids)), params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id != rid:
                continue
            new = list(out.outputs[0].token_ids)
            if new:
                stamps.append(time.perf_counter())
                sizes.append(len(new))
                token_ids += new
            if out.finished:
                final = out
    n = len(token_ids)
    row = {
        "prompt_tokens": len(prompt_token_ids),
        "output_tokens": n,
        "client_ttft_s": stamps[0] - submit,
        "client_tpot_s": (stamps[-1] - stamps[0]) / (n - 1) if n > 1 else float("nan"),
        "client_e2e_s": stamps[-1] - submit,
        "itl_s": [b - a for a, b in zip(stamps, stamps[1:], strict=False)],
        "chunk_tokens": sizes,
        "token_ids": token_ids,
    }
    if final is not None and getattr(final, "metrics", None) is not None:
        engine_row = request_timing(final)
        row |= {f"engine_{k}": engine_row[k] for k in ("ttft_s", "tpot_s", "e2e_s", "prefill_s", "decode_s")}
    return row


def repeat_chat(llm: Any, question: str, repeats: int, max_tokens: int, warmup: int = 1, cold: bool = True) -> tuple[pd.DataFrame, list[Any]]:
    """Ask one chat question ``repeats`` times after ``warmup`` untimed runs; exactly ``max_tokens`` out each.

    ``cold=True`` empties the prefix cache before each timed run, so no run reuses another's KV.
    Returns the tidy timing table and the raw vLLM outputs.
    """
    if repeats < 1 or max_tokens < 1:

        raise KVLabError(f"repeats={repeats} and max_tokens={max_tokens} must both be at least 1.")
    for _ in range(warmup):
        chat(llm, question, max_tokens=max_tokens, ignore_eos=True)
    outputs = []
    for _ in range(repeats):
        if cold:
            llm.reset_prefix_cache()
        outputs.append(chat(llm, question, max_tokens=max_tokens, ignore_eos=True))
    return timing_table(outputs, max_tokens=max_tokens, cold=cold), outputs


def generate_batch(llm: Any, prompts: list[list[int]], max_tokens: int, **sampling: Any) -> list[Any]:
    """Requests from token ids submitted together, exactly ``max_tokens`` out each, greedy unless ``sampling`` says
    otherwise (any ``SamplingParams`` field); returns vLLM's RequestOutputs, in order (``timing.timing_table`` reads them)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(**({"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True} | sampling))
    return llm.generate([TokensPrompt(prompt_token_ids=list(ids)) for ids in prompts], params, use_tqdm=False)


def generate_timed(llm: Any, prompt_ids: list[int], max_tokens: int, **sampling: Any) -> Any:
    """One request from token ids with exactly ``max_tokens`` output tokens (greedy unless ``sampling`` says
    otherwise); returns vLLM's RequestOutput."""
    return generate_batch(llm, [prompt_ids], max_tokens, **sampling)[0]

PHASE_COLORS = {"queue": "#9e9e9e", "prefill": "#e4572e", "decode": "#4c8bf5"}


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


def ttft_bars_by_run(t: pd.DataFrame, by: str, agg: Any, title: str, ylabel: str) -> go.Figure:
    """Collected lab runs (a ``run`` column): TTFT aggregated (``"median"``, ``timing.p95``…) per run and ``by`` group,
    as grouped bars in ms."""
    import plotly.express as px

    m = t.groupby(["run", by], as_index=False).ttft_s.agg(agg)
    return px.bar(m.assign(ttft_ms=m.ttft_s * 1e3), x="run", y="ttft_ms", color=by, barmode="group", title=title,
                  labels={"ttft_ms": ylabel})
