"""Capacity under SLOs: chat, agent and batch traffic on one engine, driven the two ways load tests drive a server.

- **Open loop** (``open_loop``): requests arrive as a Poisson process at a fixed rate whatever the engine does —
  users do not know the server is busy. vLLM's ``bench serve --request-rate`` sends this way.
- **Closed loop** (``closed_loop``): a fixed number of users, each sending the next request only when the last reply is
  complete. The offered load falls when the engine slows, so the queue can never hold more than the number of users:
  a closed-loop test cannot show the queue explosion of an overloaded product. ``--max-concurrency`` alone is this;
  with ``--request-rate`` too, vLLM bench holds requests at the client (and starts their TTFT after that wait).

Both run in this process through ``workload.run_workload``: the driver admits each request at its arrival time between
engine steps, as vLLM's API server hands requests to its engine core, and times every token on the client's clock.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from kvlab import caching, prompts, slo, traffic
from kvlab.runtime import figures, gateway
from kvlab.runtime.errors import KVLabError
from kvlab.workload import Arrival, FollowUp, run_workload

KINDS = ("chat", "agent", "batch")
#: Priority per kind under ``scheduling_policy="priority"`` (lower runs first; vLLM ignores it under FCFS).
PRIORITY = {"chat": 0, "agent": 0, "batch": 1}
SUMMARY_SYSTEM = "You summarize documents for the operations team."
SUMMARY_INSTRUCTION = "Summarize the following document in three sentences.\n\n"
#: The engine settings of vLLM's OpenAI server where they differ from the offline ``LLM`` (vllm/engine/arg_utils.py:
#: the server schedules at most 2,048 tokens and 128 sequences per step by default on this platform).
SERVER_LIKE = {"max_num_batched_tokens": 2048, "max_num_seqs": 128}


@dataclass(frozen=True)
class Mix:
    """A traffic mix: the share of requests of each kind (summing to 1) and their lengths in tokens."""

    chat_share: float = 1.0
    agent_share: float = 0.0
    batch_share: float = 0.0
    chat_output_tokens: int = 32
    agent_prompt_tokens: int = 1000
    agent_output_tokens: int = 16
    batch_prompt_tokens: int = 1500
    batch_output_tokens: int = 64

    def __post_init__(self) -> None:
        shares = {k: getattr(self, f"{k}_share") for k in KINDS}
        if any(not 0 <= v <= 1 for v in shares.values()) or abs(sum(shares.values()) - 1) > 1e-6:
            listed = ", ".join(f"{k} {v:g}" for k, v in shares.items())
            raise KVLabError(f"The traffic mix's shares ({listed}) must each be between 0 and 1 and sum to 1; "
                             f"they sum to {sum(shares.values()):g}.")
        for name in ("chat_output_tokens", "agent_prompt_tokens", "agent_output_tokens", "batch_prompt_tokens",
                     "batch_output_tokens"):
            if getattr(self, name) < 1:
                raise KVLabError(f"The traffic mix's {name} must be at least 1, got {getattr(self, name)!r}.")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Requests:
    """Makes requests of each kind from the model's tokenizer: chats (distinct short questions), agent turns (a long
    shared tool-schema system prompt + a distinct task and retrieved text) and batch summarization of distinct
    documents. Every prompt is in the model's chat template."""

    def __init__(self, tokenizer: Any, mix: Mix, seed: int = 0) -> None:
        self.tok, self.mix, self.seed = tokenizer, mix, seed
        self.questions = caching.user_turns()
        self.agent_system = caching.static_prefix(1)
        self.count = 0

    def prompt(self, kind: str) -> tuple[list[int], int]:
        """Token ids and output tokens of the next request of ``kind``."""
        i, self.count = self.count, self.count + 1
        m = self.mix
        if kind == "chat":
            question = self.questions[i % len(self.questions)]
            return caching.chat_ids(self.tok, traffic.CHAT_SYSTEM, f"[ticket {self.seed}-{i}] {question}"), m.chat_output_tokens
        offset = (self.seed * 7919 + i * 1543) * 13
        if kind == "agent":
            head = caching.chat_ids(self.tok, self.agent_system, traffic.AGENT_TASK)
            extra = max(m.agent_prompt_tokens - len(head), 1)
            text = self.tok.decode(prompts.prompt_of_length(self.tok, extra, offset=offset))
            return caching.chat_ids(self.tok, self.agent_system, f"{traffic.AGENT_TASK}\nRetrieved:\n{text}"), m.agent_output_tokens
        if kind == "batch":
            text = self.tok.decode(prompts.prompt_of_length(self.tok, m.batch_prompt_tokens, offset=offset))
            return caching.chat_ids(self.tok, SUMMARY_SYSTEM, SUMMARY_INSTRUCTION + text), m.batch_output_tokens
        raise KVLabError(f"Unknown request kind {kind!r}; the kinds are {', '.join(KINDS)}.")

    def make(self, kind: str, at_s: float, user: int = -1) -> Arrival:
        """One request of ``kind`` arriving at ``at_s`` (batch jobs in the "batch" lane, with a lower priority)."""
        ids, out = self.prompt(kind)
        return Arrival(kind, ids, out, at_s, priority=PRIORITY[kind], lane="batch" if kind == "batch" else "", user=user)

    def kinds(self, count: int, rng: random.Random) -> list[str]:
        """``count`` request kinds drawn with the mix's shares."""
        weights = [getattr(self.mix, f"{k}_share") for k in KINDS]
        return rng.choices(KINDS, weights=weights, k=count)


def longest_request(tokenizer: Any, mix: Mix) -> tuple[int, str]:
    """The longest request a mix makes (prompt in the chat template + output, tokens) and which kind it is, so that a
    mix too long for the model's context is refused before any engine starts."""
    maker, made = Requests(tokenizer, mix), {}
    for kind in (k for k in KINDS if getattr(mix, f"{k}_share") > 0):
        tries = len(maker.questions) if kind == "chat" else 1  # chats differ in length; agent and batch prompts do not
        made[kind] = max(len(ids) + out for ids, out in (maker.prompt(kind) for _ in range(tries)))
    kind = max(made, key=made.get)
    lengths = {"chat": "its prompt + chat_output_tokens", "agent": "agent_prompt_tokens + agent_output_tokens",
               "batch": "batch_prompt_tokens + the summary instruction + batch_output_tokens"}
    return made[kind], f"a {kind} request ({lengths[kind]})"


def open_loop(maker: Requests, rate_rps: float, count: int, start_s: float = 0.0, seed: int = 0,
              kinds: list[str] | None = None) -> list[Arrival]:
    """``count`` requests arriving as a Poisson process at ``rate_rps`` (exponential gaps, seeded) from ``start_s``."""
    if rate_rps <= 0 or count < 1:
        raise KVLabError(f"An open loop needs a positive rate and at least one request, got rate {rate_rps!r}, count {count!r}.")
    rng = random.Random(seed)
    kinds = kinds or maker.kinds(count, rng)
    t, out = start_s, []
    for kind in kinds:
        out.append(maker.make(kind, t))
        t += rng.expovariate(rate_rps)
    return out


def closed_loop(maker: Requests, users: int, count: int, think_s: float = 0.0, stagger_s: float = 0.5,
                seed: int = 0) -> tuple[list[Arrival], FollowUp]:
    """``users`` users, each sending its next request ``think_s`` after its last reply, ``count`` requests in all.
    Users start spread over ``stagger_s`` seconds. Returns the first requests and the follow-up rule."""
    if users < 1 or count < users:
        raise KVLabError(f"A closed loop needs at least one user and at least one request per user, got {users} users, {count} requests.")
    rng = random.Random(seed)
    kinds = maker.kinds(count, rng)
    first = [maker.make(kinds[u], stagger_s * u / users, user=u) for u in range(users)]
    sent = [users]

    def follow_up(done: Arrival, t_s: float) -> Arrival | None:
        if sent[0] >= count:
            return None
        sent[0] += 1
        return maker.make(kinds[sent[0] - 1], t_s + think_s, user=done.user)

    return first, follow_up


def run_open_loop(llm: Any, maker: Requests, rates_rps: list[float], seconds: float, min_requests: int = 12,
                  seed: int = 0, progress: bool = True, **run_args: Any) -> pd.DataFrame:
    """One open-loop run per rate (``max(min_requests, rate × seconds)`` requests each, the prefix cache emptied
    before each); one row per request with its ``rate_rps``."""
    from tqdm.auto import tqdm

    check_rates(rates_rps)
    frames = []
    for rate in tqdm(rates_rps, desc="rates", unit="rate", disable=not progress, leave=False):
        count = max(min_requests, math.ceil(rate * seconds))
        reqs = run_setting(llm, open_loop(maker, rate, count, seed=seed), **run_args)
        frames.append(reqs.assign(rate_rps=rate, loop="open"))
    return pd.concat(frames, ignore_index=True)


#: Backlog growth (requests per second, ``backlog_growth``) above which a rate overloads the engine: its queue grows
#: visibly for as long as requests arrive.
OVERLOAD_GROWTH_RPS = 0.5


def extend_to_overload(llm: Any, maker: Requests, sweep: pd.DataFrame, seconds: float, min_requests: int = 12,
                       factor: float = 2.0, tries: int = 2, seed: int = 0, objective: slo.SLO | None = None,
                       **run_args: Any) -> pd.DataFrame:
    """Add a rate at ``factor`` × the top one while the top rate did not overload the engine — its backlog did not
    grow, or it still met ``objective`` — at most ``tries`` times. A closed loop's saturation understates an open
    loop's capacity (the open loop batches more requests than there were users) by an amount that depends on the
    machine and model, and a short run whose requests all fit in one batch can queue without breaking an SLO. With
    ``objective``, a top rate whose goodput is still the highest of two or more is doubled too: the knee must lie inside."""
    for _ in range(tries):
        top = float(sweep.rate_rps.max())
        run = sweep[sweep.rate_rps == top]
        past_knee, met = True, False
        if objective is not None:
            table = slo.rate_table(sweep, objective).set_index("rate_rps")
            met = bool(table.meets_slo[top])
            past_knee = len(table) < 2 or table.goodput_rps[top] < table.goodput_rps.max()
        if backlog_growth(run) > OVERLOAD_GROWTH_RPS and not met and past_knee:
            break
        more = run_open_loop(llm, maker, [round(top * factor, 2)], seconds, min_requests, seed, progress=False, **run_args)
        sweep = pd.concat([sweep, more], ignore_index=True)
    return sweep


def run_closed_loop(llm: Any, maker: Requests, users: int, count: int, think_s: float = 0.0, seed: int = 0,
                    **run_args: Any) -> pd.DataFrame:
    """One closed-loop run; one row per request with the number of ``users``."""
    first, follow = closed_loop(maker, users, count, think_s, seed=seed)
    return run_setting(llm, first, follow_up=follow, **run_args).assign(users=users, loop="closed")


def check_rates(rates_rps: list[float]) -> None:
    """Rates must be positive and strictly increasing (a sweep reads left to right)."""
    if not rates_rps or any(not isinstance(r, (int, float)) or r <= 0 for r in rates_rps):
        raise KVLabError(f"Arrival rates must be positive numbers of requests per second, got {rates_rps!r}.")
    if any(b <= a for a, b in zip(rates_rps, rates_rps[1:], strict=False)):
        raise KVLabError(f"Arrival rates must increase from one point to the next, got {rates_rps!r}.")


def unloaded(llm: Any, maker: Requests, count: int) -> pd.DataFrame:
    """``count`` chats one after another (one user, closed loop): the latency with no one else on the engine."""
    return run_closed_loop(llm, maker, users=1, count=count)


def relative_slo(alone: pd.DataFrame, ttft_times: float, tpot_times: float, e2e_times: float | None = None) -> slo.SLO:
    """An SLO set as multiples of the unloaded medians, so the same lesson is a fair test on any machine and model."""
    med = alone[["ttft_s", "tpot_s", "e2e_s"]].median() * 1e3
    return slo.SLO(ttft_ms=ttft_times * med.ttft_s, tpot_ms=tpot_times * med.tpot_s,
                   e2e_ms=None if e2e_times is None else e2e_times * med.e2e_s)


def saturation_rps(requests: pd.DataFrame, warmup_fraction: float = 0.2) -> float:
    """Requests per second a (closed-loop) run completed in its steady state: the engine's throughput at that load."""
    steady = slo.steady_state(requests, warmup_fraction)
    return float(len(steady) / (steady.last_token_s.max() - steady.arrival_s.min()))


def in_flight_at(requests: pd.DataFrame, t_s: float) -> int:
    """Requests in the system at ``t_s``: arrived, last token not yet out."""
    return int(((requests.arrival_s <= t_s) & (requests.last_token_s > t_s)).sum())


def _growth_window(requests: pd.DataFrame) -> tuple[float, float]:
    """From the arrival a quarter of the way through the run (by time) to the last arrival."""
    arrivals = requests.arrival_s.sort_values().to_numpy()
    t0 = arrivals[min(arrivals.searchsorted(arrivals[0] + (arrivals[-1] - arrivals[0]) / 4), len(arrivals) - 1)]
    return float(t0), float(arrivals[-1])


def backlog_growth(requests: pd.DataFrame) -> float:
    """How fast the requests in the system grew while requests were arriving (requests per second): the change from
    the arrival a quarter of the way through the run (by time) to the last arrival, over the time between. ~0 for a
    steady backlog; arrival rate − completion rate over that window (``arrivals_and_completions``)."""
    t0, t1 = _growth_window(requests)
    return (in_flight_at(requests, t1) - in_flight_at(requests, t0)) / (t1 - t0) if t1 > t0 else 0.0


def arrivals_and_completions(requests: pd.DataFrame) -> dict[str, float]:
    """Over ``backlog_growth``'s window: requests that arrived and that completed per second, and the window (s) —
    so that arrived − completed is the growth, not the whole run's throughput, which includes the drain."""
    t0, t1 = _growth_window(requests)
    span = t1 - t0
    if span <= 0:
        return {"window_s": 0.0, "arrived_rps": math.nan, "completed_rps": math.nan}
    arrived = ((requests.arrival_s > t0) & (requests.arrival_s <= t1)).sum()
    completed = ((requests.last_token_s > t0) & (requests.last_token_s <= t1)).sum()
    return {"window_s": span, "arrived_rps": float(arrived / span), "completed_rps": float(completed / span)}


def warm_up(llm: Any, maker: Requests, jobs: int = 2) -> None:
    """Untimed: ``jobs`` batch jobs and two chats at once, so the engine has run full-budget prefill steps and mixed
    steps before anything is timed (new shapes and freshly touched KV pages cost extra the first time)."""
    arrivals = [maker.make("batch", 0.0) for _ in range(jobs)] + [maker.make("chat", 0.0) for _ in range(2)]
    for a in arrivals:
        a.max_tokens = min(a.max_tokens, 4)
    run_workload(llm, arrivals)
    llm.reset_prefix_cache()


def max_in_flight(requests: pd.DataFrame) -> int:
    """Most requests in the system at once (arrived, last token not yet out), checked at every arrival."""
    return max(in_flight_at(requests, t) for t in requests.arrival_s)


# ---- interactive and batch work on one pool --------------------------------------------------------------------
def chat_and_batch(maker: Requests, chat_rate_rps: float, seconds: float, batch_jobs: int, batch_at: tuple[float, ...] = (0.2, 0.55),
                   seed: int = 0) -> list[Arrival]:
    """Steady Poisson chat for ``seconds``; ``batch_jobs`` summarization jobs (0: none) submitted in equal bursts at
    the given fractions of the window, as an offline job hands over its documents."""
    chat_count = max(1, math.ceil(chat_rate_rps * seconds))
    arrivals = open_loop(maker, chat_rate_rps, chat_count, seed=seed, kinds=["chat"] * chat_count)
    for j in range(batch_jobs):
        burst = batch_at[j * len(batch_at) // batch_jobs]
        arrivals.append(maker.make("batch", burst * seconds + 0.01 * j))
    return arrivals


def run_setting(llm: Any, arrivals: list[Arrival], **run_args: Any) -> pd.DataFrame:
    """One setting of a comparison on the same traffic: the prefix cache emptied first (every setting sends the same
    prompts, and none may reuse another setting's KV), then the arrivals; one row per request."""
    llm.reset_prefix_cache()
    return run_workload(llm, arrivals, **run_args)[1]


#: The gateway's batch lane as a workload lane limit: over-cap requests reach the engine one at a time.
BATCH_LANE = {"batch": gateway.BATCH_CONCURRENCY}


def route_by_input_cap(arrivals: list[Arrival], cap_tokens: int) -> list[Arrival]:
    """The gateway's interactive input cap (``gateway.route`` with ``over_cap="batch"``) applied to in-process
    traffic: a request over ``cap_tokens`` prompt tokens goes to the batch lane (lane "batch"; run with
    ``lane_limits=BATCH_LANE`` for the gateway's one batch job at the engine at a time)."""
    if cap_tokens < 1:
        raise KVLabError(f"The interactive input cap must be at least 1 token, got {cap_tokens!r}.")
    for a in arrivals:
        a.lane = "batch" if gateway.route(len(a.prompt_ids), cap_tokens, "batch") == "batch_lane" else ""
    return arrivals


def pool_row(name: str, requests: pd.DataFrame, objective: slo.SLO) -> dict[str, Any]:
    """One row of the mitigations table: chat TTFT p50/p95 and goodput (with the requests behind them), batch jobs'
    throughput (tokens/s: prompt + output, over the window from the first arrival to the last token of all work)."""
    chats = requests[requests.label == "chat"]
    batch = requests[requests.label == "batch"]
    point = slo.rate_point(chats, objective)
    span = float(requests.last_token_s.max() - requests.arrival_s.min())
    q = f"p{objective.percentile:g}"
    return {"setting": name, "chat requests": len(chats), "chat TTFT p50 (ms)": point["ttft_p50_ms"],
            f"chat TTFT {q} (ms)": point[f"ttft_{q}_ms"], f"chat TPOT {q} (ms)": point[f"tpot_{q}_ms"],
            "chat attainment": point["attainment"], "chat goodput (req/s)": point["goodput_rps"],
            "batch jobs": len(batch),
            "batch tokens/s": float((batch.prompt_tokens + batch.output_tokens).sum() / span) if len(batch) else 0.0,
            "batch E2E p50 (s)": float(batch.e2e_s.median()) if len(batch) else math.nan,
            "all tokens/s": float((requests.prompt_tokens + requests.output_tokens).sum() / span)}


def rate_sweep_figure(table: pd.DataFrame, objective: Any, knee_rps: float, sustainable: dict[str, Any],
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
    return figures.place_on_log_axes(fig)


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
    return figures.place_on_log_axes(fig)  # the SLO label at log10(ms), where the log axis reads it


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
