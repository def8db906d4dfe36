"""Concurrent workloads on one engine: submit requests at chosen moments and record every token's arrival.

The driver runs the engine step by step in this process (like a server's engine loop): before each step it
admits the requests whose arrival time has come, after each step it timestamps every new token. So the inter-token
gaps of running decoders can be watched while another request's long prefill runs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvlab.prompts import check_fits, distinct_prompts
from kvlab.runtime.errors import KVLabError
from kvlab.timing import request_timing


@dataclass
class Arrival:
    """One request of a workload: who it is, its prompt, how many tokens it wants, when it arrives (s), its priority
    (lower runs first, only under ``scheduling_policy="priority"``) and its lane ("" = straight to the engine; a lane
    named in ``run_workload``'s ``lane_limits`` is a queue in front of the engine)."""

    label: str
    prompt_ids: list[int]
    max_tokens: int
    at_s: float = 0.0
    priority: int = 0
    lane: str = ""
    user: int = -1  # closed loop: which user sent it
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:10])


#: Closed loop: called when a request finishes (with the finish time, s); returns that user's next request or None.
FollowUp = Callable[[Arrival, float], "Arrival | None"]


def run_workload(llm: Any, arrivals: list[Arrival], timeout_s: float = 900.0, lane_limits: dict[str, int] | None = None,
                 follow_up: FollowUp | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run the arrivals; return (one row per token with its time, one row per request with TTFT, TPOT, E2E, ITL and
    the engine's own queue and prefill times).

    TTFT counts from the request's arrival time, not from when the driver could hand it to the engine: like a
    server's queue, a request that arrives during a long step waits for that step to end, and the user sees that wait
    (vLLM's API server also hands new requests to its engine core between steps). ``lane_limits`` ({lane: n}) holds a
    lane's requests in a queue in front of the engine while ``n`` of them are in it (a batch queue); their TTFT
    includes that wait too. ``follow_up`` makes a closed loop: each finished request may bring its user's next one.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind


    engine = llm.llm_engine
    max_len = engine.vllm_config.model_config.max_model_len
    for a in arrivals:
        check_fits(len(a.prompt_ids), a.max_tokens, max_len)
    limits = lane_limits or {}
    pending = sorted(arrivals, key=lambda a: a.at_s)
    by_id = {a.request_id: a for a in arrivals}
    in_lane: dict[str, int] = {}
    submitted: dict[str, float] = {}
    finals: dict[str, Any] = {}
    stamps: dict[str, list[float]] = {}  # one time per token (a chunk's tokens share its time)
    chunks: dict[str, list[float]] = {}  # one time per streamed chunk: ITL is the gap between chunks
    start = time.perf_counter()

    def admit(now: float) -> None:
        held = []
        while pending and pending[0].at_s <= now:
            a = pending.pop(0)
            if a.lane in limits and in_lane.get(a.lane, 0) >= limits[a.lane]:
                held.append(a)  # waits in its lane's queue, in arrival order
                continue
            params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
            engine.add_request(a.request_id, TokensPrompt(prompt_token_ids=list(a.prompt_ids)), params, priority=a.priority)
            submitted[a.request_id] = time.perf_counter() - start
            in_lane[a.lane] = in_lane.get(a.lane, 0) + 1
        pending[:0] = held

    while pending or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        if now > timeout_s:
            raise KVLabError(f"The workload ran longer than {timeout_s:.0f} s; use fewer or shorter requests.")
        admit(now)
        if not engine.has_unfinished_requests():
            due = [a.at_s for a in pending if a.at_s > now]
            time.sleep(max(0.0, min(0.01, min(due) - now)) if due else 0)
            continue
        outputs = engine.step()
        t = time.perf_counter() - start
        for out in outputs:
            if out.outputs[0].token_ids:
                stamps.setdefault(out.request_id, []).extend([t] * len(out.outputs[0].token_ids))
                chunks.setdefault(out.request_id, []).append(t)
            if out.finished:
                finals[out.request_id] = out
                done = by_id[out.request_id]
                in_lane[done.lane] -= 1
                nxt = follow_up(done, t) if follow_up else None
                if nxt is not None:
                    check_fits(len(nxt.prompt_ids), nxt.max_tokens, max_len)
                    by_id[nxt.request_id] = nxt
                    pending.append(nxt)
                    pending.sort(key=lambda a: a.at_s)
    token_rows = [{"request_id": rid, "label": by_id[rid].label, "token": i + 1, "t_s": t}
                  for rid, times in stamps.items() for i, t in enumerate(times)]
    tokens = pd.DataFrame(token_rows, columns=["request_id", "label", "token", "t_s"])
    rows = []
    for rid, a in by_id.items():
        times = stamps.get(rid, [])
        if not times:
            continue
        arrived = chunks[rid]
        gaps = [b - x for x, b in zip(arrived, arrived[1:], strict=False)]
        n = len(times)
        row = {"request_id": rid, "label": a.label, "lane": a.lane, "priority": a.priority, "user": a.user,
               "prompt_tokens": len(a.prompt_ids), "output_tokens": n,
               "arrival_s": a.at_s, "submitted_s": submitted[rid], "first_token_s": times[0], "last_token_s": times[-1],
               "ttft_s": times[0] - a.at_s, "tpot_s": (times[-1] - times[0]) / (n - 1) if n > 1 else float("nan"),
               "e2e_s": times[-1] - a.at_s, "itl_max_s": max(gaps) if gaps else float("nan"), "itl_s": gaps,
               "decode_steps": len(arrived) - 1}
        if rid in finals and getattr(finals[rid], "metrics", None) is not None:
            eng = request_timing(finals[rid])
            row |= {"engine_queue_s": eng["queue_s"], "engine_prefill_s": eng["prefill_s"], "preemptions": eng["preemptions"],
                    "cached_tokens": eng["cached_tokens"]}
        rows.append(row)
    return tokens, pd.DataFrame(rows)


def poisson_arrivals(tokenizer: Any, requests: int, rate_per_s: float, prompt_tokens: int, output_tokens: int, seed: int = 0) -> list[Arrival]:
    """``requests`` chats arriving as a Poisson process at ``rate_per_s`` (exponential gaps, seeded)."""
    import random


    rng = random.Random(seed)
    t, out = 0.0, []
    for i, ids in enumerate(distinct_prompts(tokenizer, prompt_tokens, requests, seed=seed + 23)):
        out.append(Arrival(f"request {i + 1}", ids, output_tokens, t))
        t += rng.expovariate(rate_per_s)
    return out


def concurrency(requests: pd.DataFrame) -> float:
    """Mean number of requests in flight (submitted, not finished) over the run: Little's law from the timeline."""
    span = requests.last_token_s.max() - requests.arrival_s.min()
    busy = (requests.last_token_s - requests.arrival_s).sum()
    return float(busy / span) if span > 0 else float("nan")
