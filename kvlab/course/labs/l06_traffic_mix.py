"""Lab L06 · traffic mix: chat only vs chat + agents on a local OpenAI-compatible server, the dashboard's view."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvlab import caching, traffic
from kvlab.course.exercises import Question, Tables
from kvlab.course.labs import Lab, Param, at_most, model_param, output_param, tokenizer_of
from kvlab.runtime import templates
from kvlab.timing import p95, ttft_bars_by_run

NAME = "L06_traffic_mix"


def p95_growth(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    chat, mixed = p95(r[r.mix == "chat only"].ttft_s), p95(r[r.mix == "chat + agents"].ttft_s)
    return round(mixed / chat, 2), f"TTFT p95 {chat * 1e3:.0f} ms (chat only) → {mixed * 1e3:.0f} ms (chat + agents)"


def slower_kind(t: Tables) -> tuple[Any, str]:
    m = t["results"][lambda d: d.mix == "chat + agents"].groupby("kind").ttft_s.median()
    return str(m.idxmax()), ", ".join(f"{k}: median TTFT {v * 1e3:.0f} ms" for k, v in m.items())


def tokens_per_s(t: Tables) -> tuple[Any, str]:
    s = t["summary"].set_index("mix")["output tokens/s (mean)"]
    change = abs(s["chat + agents"] / s["chat only"] - 1)
    return ("yes" if change > 0.2 else "no"), f"output tokens/s {s['chat only']:.1f} vs {s['chat + agents']:.1f} ({change:.0%} apart)"


def longest(p: dict[str, Any]) -> tuple[int, str]:
    """The longest request: the last agent turn where agents join, else the longest chat (tokens, output included)."""

    tok = tokenizer_of(p)
    chats = traffic.chat_sessions(len(caching.user_turns()))
    chat = max(len(templates.chat_template_ids(tok, s.messages)) for s in chats) + p["output_tokens"]
    if p["agent_share"] == 0:
        return chat, "the longest chat's prompt + output_tokens"
    agent = traffic.agent_request_tokens(tok, p["agent_turns"], p["growth_tokens"], p["agent_tools"], p["output_tokens"])
    return max(chat, agent[-1]), (f"the last agent turn's prompt (agent_tools schemas, agent_turns − 1 rounds of "
                                  f"growth_tokens and replies) + output_tokens + {traffic.AGENT_SPARE_TOKENS} spare")


def compare(t: pd.DataFrame) -> Any:
    """TTFT p95 of the two mixes, one bar group per run."""

    return ttft_bars_by_run(t, "mix", p95, "L06 · TTFT p95: chat only vs chat + agents", "TTFT p95 (ms)")


LAB = Lab(
    name=NAME,
    title="Traffic mix",
    about="chat only vs chat + agents on a local OpenAI-compatible server, the dashboard's view",
    params=(
        model_param(),
        Param("agent_share", 0.25, "fraction (0-1) of the mixed run's requests that are agent turns", fraction=True),
        Param("agent_turns", 4, "turns per agent loop (each turn is one request)", positive=True, quick=at_most(3)),
        Param("growth_tokens", 400, "tokens of retrieved text appended to the agent's prompt after each turn", positive=True),
        Param("agent_tools", 1, "tool schemas (0-13) in the agent's system prompt (1 ≈ 1,000 prompt tokens at turn 1)",
              between=(0, 13)),
        Param("requests", 24, "requests per mix", positive=True, quick=at_most(12)),
        Param("rate_per_s", 1.0, "arrival rate, requests per second (open loop)", positive=True),
        Param("concurrency", 32, "most clients in flight at once", positive=True),
        Param("output_tokens", 24, "output tokens per request (exact)", positive=True),
        Param("prefix_caching", True, "vLLM automatic prefix caching on the server"),
        Param("response_cache", False, "put the gateway with a Redis response cache in front (exact repeats of greedy requests)"),
        Param("cache_ttl_s", 600.0, "response-cache entry lifetime, seconds", positive=True),
        Param("input_cap", 0, "interactive input cap in prompt tokens, enforced by the gateway (0: none); over-cap requests "
              "go to its batch lane", between=(0, 10_000_000)),
        Param("kv_cache_gib", 1.0, "KV cache budget, GiB", positive=True),
        Param("enforce_eager", True, "True: no torch.compile; False: compiled (slow first start)"),
        Param("executor", "", "where the server runs the model: '' vLLM's default (on a CPU a worker process with one core "
              "kept for the scheduler, lesson 06), 'uni' inside its engine core on every core, 'mp' a worker process",
              choices=("", "uni", "mp")),
        output_param(NAME),
    ),
    questions=(
        Question("L06.1", "By what factor did TTFT p95 grow when agents joined the traffic? (±25 %)", p95_growth, tolerance=0.25),
        Question("L06.2", "In the mixed run, which kind of request had the higher median TTFT: chat or agent?", slower_kind,
                 ("chat", "agent")),
        Question("L06.3", "Did mean output tokens/s differ by more than 20 % between the two mixes? (yes/no)", tokens_per_s,
                 ("yes", "no")),
    ),
    compare=compare,
    longest=longest,
)
