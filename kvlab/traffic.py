"""Traffic for a served model: short chats, agent loops whose prompts grow every turn, and the runner that sends them.

An *agent* turn sends everything so far — system prompt with tool schemas, the task, every earlier reply, every tool
result (JSON) and every retrieved document — and gets back a short reply. Its prompt grows turn after turn: a
"prefill storm" that a tokens-per-second panel does not show, and that TTFT percentiles and the prompt-token count do.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from kvlab import caching, metrics, prompts
from kvlab.runtime import templates
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.serving import Server, stream_chat
from kvlab.timing import p95

CHAT_SYSTEM = "You are Aria, the support assistant for Northwind Rail. Answer in two or three sentences."
AGENT_TASK = "Plan the cheapest trip from Harbour Central to Millbrook tomorrow before 9:00 and book it. Use the tools."


@dataclass
class Session:
    """One client conversation: a chat (one turn) or an agent loop (``turns`` turns, prompt growing each turn)."""

    kind: str
    messages: list[dict[str, str]]
    turns: int = 1
    growth: list[str] = field(default_factory=list)  # text appended after each turn (tool result + retrieved docs)


def chat_sessions(count: int, offset: int = 0) -> list[Session]:
    """``count`` one-turn chats with short, distinct user questions."""
    turns = caching.user_turns()
    return [Session("chat", [{"role": "system", "content": CHAT_SYSTEM},
                             {"role": "user", "content": turns[(offset + i) % len(turns)]}]) for i in range(count)]


def tool_result(turn: int, retrieved: str) -> str:
    """What an agent framework appends after a tool call: the tool's JSON result and the documents it retrieved."""
    result = {"tool": "search_documents", "call_id": f"call_{turn}", "status": "ok",
              "result": {"matches": 3, "source": "northwind-kb", "turn": turn}}
    return f"Tool result:\n{json.dumps(result)}\nRetrieved documents:\n{retrieved}"


def agent_session(tokenizer: Any, turns: int, growth_tokens: int, tools: int, seed: int = 0) -> Session:
    """An agent loop of ``turns`` turns; after each, ~``growth_tokens`` tokens of retrieved text (plus the tool's JSON
    and the agent's own reply) join the prompt. The system prompt carries ``tools`` tool schemas."""
    growth = []
    for t in range(turns - 1):  # nothing is appended after the last turn
        ids = prompts.prompt_of_length(tokenizer, growth_tokens, offset=seed * 9973 + t * growth_tokens) if growth_tokens else []
        growth.append(tool_result(t + 1, tokenizer.decode(ids)))
    messages = [{"role": "system", "content": caching.static_prefix(tools)}, {"role": "user", "content": AGENT_TASK}]
    return Session("agent", messages, turns, growth)


#: Tokens left spare when an agent turn's length is estimated: a real reply re-tokenizes a little differently.
AGENT_SPARE_TOKENS = 16


def agent_request_tokens(tokenizer: Any, turns: int, growth_tokens: int, tools: int, max_tokens: int) -> list[int]:
    """Each turn's request length (prompt + ``max_tokens`` reply + ``AGENT_SPARE_TOKENS``) in an agent session
    (``agent_session``), every earlier reply counted at ``max_tokens`` tokens."""
    session = agent_session(tokenizer, turns, growth_tokens, tools)
    reply = tokenizer.decode(prompts.prompt_of_length(tokenizer, max_tokens, offset=50_000))
    messages, lengths = list(session.messages), []
    for turn in range(turns):
        lengths.append(len(templates.chat_template_ids(tokenizer, messages)) + max_tokens + AGENT_SPARE_TOKENS)
        if turn < turns - 1:
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": session.growth[turn]}]
    return lengths


def agent_turns_that_fit(tokenizer: Any, wanted: int, growth_tokens: int, tools: int, context: int, max_tokens: int) -> int:
    """How many turns, up to ``wanted``, an agent session can run before its prompt and a ``max_tokens`` reply outgrow
    ``context`` tokens: ``wanted`` on most models, fewer on a short-context one."""
    lengths = agent_request_tokens(tokenizer, wanted, growth_tokens, tools, max_tokens)
    fit = next((turn for turn, n in enumerate(lengths) if n > context), wanted)
    if fit == 0:
        raise KVLabError(f"Even an agent's first turn does not fit a context of {context:,} tokens; choose a "
                         "model with a longer context (KVLAB_MODEL).")
    return fit


def traffic_mix(tokenizer: Any, requests: int, agent_share: float, turns: int, growth_tokens: int, tools: int,
                seed: int = 0) -> list[Session]:
    """``requests`` requests in all, of which a share ``agent_share`` are agent turns (whole sessions of ``turns``),
    the agent sessions spread evenly among the chats. ``agent_share=0`` is chat only. A new ``seed`` gives agents
    other retrieved documents (so a second run does not find them in the prefix cache)."""
    agent_turns = round(agent_share * requests)
    n_agents = math.ceil(agent_turns / turns) if agent_turns else 0
    chats = chat_sessions(max(requests - n_agents * turns, 0))
    agents = [agent_session(tokenizer, turns, growth_tokens, tools, seed=seed * 1000 + i) for i in range(n_agents)]
    out: list[Session] = list(chats)
    for i, agent in enumerate(agents):  # evenly spaced, the first one early enough to overlap with chats
        out.insert(min(len(out), (i * len(out)) // max(n_agents, 1) + 1), agent)
    return out


def session_turns(client: Any, session: Session, max_tokens: int, t_origin: float | None = None,
                  salt: str | None = None) -> Iterator[dict[str, Any]]:
    """Send a session's turns one after another, yielding each turn's timing row: an agent waits for each reply, then
    its next prompt is everything so far plus the reply and that turn's tool result. With ``salt``, each turn gets
    its own ``cache_salt`` (``serving.stream_chat``), so no turn reuses an earlier turn's KV."""
    messages = list(session.messages)
    for turn in range(session.turns):
        row = stream_chat(client, messages, max_tokens, label=session.kind, t_origin=t_origin,
                          cache_salt=f"{salt}-{turn}" if salt else None)
        yield row | {"kind": session.kind, "turn": turn + 1}
        if turn < session.turns - 1:
            messages += [{"role": "assistant", "content": row["text"]}, {"role": "user", "content": session.growth[turn]}]


def run_session(client: Any, session: Session, max_tokens: int, t_origin: float, index: int) -> list[dict[str, Any]]:
    """All of a session's turns, each row tagged with the session's index."""
    return [row | {"session": index} for row in session_turns(client, session, max_tokens, t_origin)]


def start_times(sessions: list[Session], rate_per_s: float) -> list[float]:
    """When each session starts for a steady ``rate_per_s`` requests per second: an agent session takes as many
    request slots as it has turns (its later turns go out as soon as the previous reply is back)."""
    starts, slot = [], 0
    for s in sessions:
        starts.append(slot / rate_per_s)
        slot += s.turns
    return starts


def run_traffic(server: Server, sessions: list[Session], max_tokens: int, rate_per_s: float, concurrency: int = 64,
                progress: bool = True, poll_s: float = 0.5, client: Any = None) -> tuple[pd.DataFrame, dict[str, float], pd.DataFrame]:
    """Send ``sessions`` as open-loop traffic: requests go out at ``rate_per_s`` whether or not earlier ones are done
    (as users do), with at most ``concurrency`` clients in flight. Returns one row per request (client-side timing,
    prompt and output tokens apart), the dashboard numbers read from ``/metrics`` before and after, and the server's
    gauges (KV cache usage, requests running and waiting) sampled every ``poll_s`` seconds meanwhile.

    Below saturation, output tokens/sec is set by the demand (rate × tokens per request), not by how fast each
    request was served — which is why a tokens/sec panel can look flat while TTFT explodes. ``client``: send through
    another front (a ``kvlab.runtime.gateway.Gateway``'s client) instead of straight to the server.
    """
    from tqdm.auto import tqdm

    if rate_per_s <= 0 or concurrency < 1:
        raise KVLabError(f"rate_per_s ({rate_per_s}) and concurrency ({concurrency}) must be positive.")
    client = client or server.client()
    starts = start_times(sessions, rate_per_s)
    before = metrics.scrape(server.url)
    t0 = time.perf_counter()

    def _send(i: int) -> list[dict[str, Any]]:
        time.sleep(max(0.0, t0 + starts[i] - time.perf_counter()))
        return run_session(client, sessions[i], max_tokens, t0, i)

    done = threading.Event()
    samples: list[dict[str, float]] = []

    def _poll() -> None:
        while not done.wait(poll_s):
            with contextlib.suppress(Exception):  # a missed sample is not worth failing the run for
                g = metrics.scrape(server.url)
                samples.append({"t_s": time.perf_counter() - t0, "kv_cache_usage": g.get("vllm:kv_cache_usage_perc", math.nan),
                                "running": g.get("vllm:num_requests_running", math.nan),
                                "waiting": g.get("vllm:num_requests_waiting", math.nan)})

    poller = threading.Thread(target=_poll, daemon=True)
    poller.start()
    rows: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(_send, i) for i in range(len(sessions))]
        bar = tqdm(total=sum(s.turns for s in sessions), desc="requests", disable=not progress, leave=False)
        for fut in futures:
            result = fut.result()
            rows += result
            bar.update(len(result))
        bar.close()
    wall = time.perf_counter() - t0
    done.set()
    poller.join()
    after = metrics.scrape(server.url)
    df = pd.DataFrame(rows).sort_values("sent_s", ignore_index=True)
    gauges = pd.DataFrame(samples, columns=["t_s", "kv_cache_usage", "running", "waiting"])
    board = metrics.dashboard(before, after, wall) | {"wall_s": wall}
    if len(gauges):
        board |= {"KV cache usage (peak)": gauges.kv_cache_usage.max(), "requests waiting (peak)": gauges.waiting.max()}
    return df, board, gauges


def tokens_per_window(df: pd.DataFrame, window_s: float = 1.0) -> pd.DataFrame:
    """The tokens/sec panel: output tokens streamed to clients in each ``window_s`` window since the run began."""
    times = pd.Series([t for events in df["events_s"] for t in events])
    end = math.ceil(times.max() / window_s) * window_s if len(times) else window_s
    edges = [i * window_s for i in range(int(round(end / window_s)) + 1)]
    counts = pd.cut(times, edges, right=False, include_lowest=True).value_counts(sort=False)
    return pd.DataFrame({"t_s": edges[:-1], "tokens_per_s": counts.to_numpy() / window_s})


def summary(df: pd.DataFrame, wall_s: float) -> dict[str, float]:
    """A mix's headline numbers: mean output tokens/sec, TTFT p50/p95, mean prompt and output tokens per request."""

    return {"requests": len(df), "output tokens/s (mean)": df.output_tokens.sum() / wall_s,
            "TTFT p50 (ms)": df.ttft_s.median() * 1e3, "TTFT p95 (ms)": p95(df.ttft_s) * 1e3,
            "TPOT p50 (ms)": df.tpot_s.median() * 1e3,
            "prompt tokens (mean)": df.prompt_tokens.mean(), "output tokens (mean)": df.output_tokens.mean()}


def client_vs_engine(server: Server, sessions: list[Session], max_tokens: int, settle_s: float = 5.0) -> pd.DataFrame:
    """Send requests one at a time and put each one's client-side TTFT next to the engine's own TTFT, queue and
    prefill time for *that* request: the difference of the server's histogram sums around it (exact, because only
    one request is in flight)."""
    client = server.client()
    rows = []
    for i, session in enumerate(sessions):
        before = metrics.scrape(server.url)
        row = stream_chat(client, session.messages, max_tokens, label=session.kind)
        deadline = time.perf_counter() + settle_s
        while True:  # the engine records a request's histograms when it finishes: wait until it has
            d = metrics.delta(before, metrics.scrape(server.url))
            if d.get("vllm:e2e_request_latency_seconds_count", 0) >= 1 or time.perf_counter() > deadline:
                break
            time.sleep(0.05)
        rows.append({"request": i, "kind": session.kind, "prompt_tokens": row["prompt_tokens"], "output_tokens": row["output_tokens"],
                     "client_ttft_s": row["ttft_s"],
                     "engine_ttft_s": d.get("vllm:time_to_first_token_seconds_sum", math.nan),
                     "engine_queue_s": d.get("vllm:request_queue_time_seconds_sum", math.nan),
                     "engine_prefill_s": d.get("vllm:request_prefill_time_seconds_sum", math.nan),
                     "client_tpot_s": row["tpot_s"], "client_e2e_s": row["e2e_s"],
                     "engine_e2e_s": d.get("vllm:e2e_request_latency_seconds_sum", math.nan)})
    df = pd.DataFrame(rows)
    df["gap_ms"] = (df.client_ttft_s - df.engine_ttft_s) * 1e3
    return df


def agent_storm(server: Server, session: Session, max_tokens: int, reuse: bool = True) -> pd.DataFrame:
    """One agent loop alone: TTFT, prompt tokens and prompt tokens served from the prefix cache, per turn (the
    server's counters read after each turn, so each delta is that turn's). ``reuse=False`` salts every turn
    differently: the same server then prefills each turn whole, as with prefix caching off."""
    import uuid

    rows = []
    before = metrics.scrape(server.url)
    for row in session_turns(server.client(), session, max_tokens, salt=None if reuse else uuid.uuid4().hex):
        after = metrics.scrape(server.url)
        d = metrics.delta(before, after)
        before = after
        rows.append({"turn": row["turn"], "prompt_tokens": row["prompt_tokens"], "output_tokens": row["output_tokens"],
                     "cached_tokens": d.get("vllm:prompt_tokens_cached_total", 0.0), "ttft_s": row["ttft_s"], "tpot_s": row["tpot_s"]})
    return pd.DataFrame(rows)


def faq_traffic(client: Any, sessions: list[Any], repeats: int, max_tokens: int = 16, seed: int = 0) -> Any:
    """Each session's messages asked ``repeats`` times, in a shuffled order (an FAQ: the same questions come back),
    one at a time; one row per request with who answered it and the gateway's own time."""
    import random

    import pandas as pd


    order = [s for s in sessions for _ in range(repeats)]
    random.Random(seed).shuffle(order)
    return pd.DataFrame([stream_chat(client, s.messages, max_tokens, label=s.kind) for s in order])


def bad_dashboard(runs: dict[str, pd.DataFrame], window_s: float = 2.0) -> go.Figure:
    """Three panels for traffic mixes: output tokens/s over time (flat while the server keeps up), TTFT p50/p95, and
    prompt tokens sent per second (the cause). The title says what this run's numbers show."""
    from plotly.subplots import make_subplots


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
    tps = [float(df.output_tokens.sum() / max((max(e) for e in df["events_s"] if len(e)), default=1.0))
           for df in runs.values()]
    p95s = [p95(df.ttft_s) for df in runs.values()]
    apart, worse = max(tps) / min(tps) - 1, max(p95s) / min(p95s)
    title = (f"Output tokens/s within {apart:.0%}, TTFT p95 {worse:.1f}× apart" if apart <= 0.15 else
             f"Output tokens/s {apart:.0%} apart — the server fell behind — and TTFT p95 {worse:.1f}× apart")
    fig.update_layout(barmode="group", height=420, title=title)
    return fig
