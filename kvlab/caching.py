"""Prefix caching: a realistic static prefix, prompt variants, the engine's hit counters, and a response cache.

vLLM's prefix cache keys whole KV blocks by the *token ids* they hold (and everything before them). A request
reuses the longest run of full blocks it shares, token for token, with something already cached; the rest of its
prompt is prefilled as usual (``num_cached_tokens`` says how many tokens were reused). Same meaning in other words
is a different key; so is the same text after a one-character change earlier in the prompt.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from kvlab.prompts import check_fits, distinct_prompts, prompt_of_length
from kvlab.runtime.config import REPO_ROOT
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.serving import stream_chat
from kvlab.runtime.templates import chat_template_ids
from kvlab.timing import generate_timed, request_timing

PREFIX_DIR = REPO_ROOT / "data" / "prefix"
VERSION_TAG = "Policy version: 2026-11-01."


def static_prefix(n_tools: int | None = None) -> str:
    """The static part of every prompt: the system prompt plus the tool schemas (``n_tools`` of them; all if None)."""
    system = (PREFIX_DIR / "system_prompt.md").read_text(encoding="utf-8").strip()
    tools = json.loads((PREFIX_DIR / "tools.json").read_text())["tools"][:n_tools]
    return f"{system}\n\n# Tools\n{json.dumps(tools)}"


def tools_that_fit(tokenizer: Any, wanted: int, context: int, room: int = 64) -> int:
    """How many tool schemas the static prefix can carry, up to ``wanted``, so that it, the longest user turn and
    ``room`` output tokens fit in ``context`` tokens: all ``wanted`` on most models, fewer on a short-context one."""
    longest = max(user_turns(), key=len)
    for n in range(wanted, -1, -1):
        if len(chat_ids(tokenizer, static_prefix(n), longest)) + room <= context:
            return n
    raise KVLabError(f"Even the system prompt without tools and one question do not fit a context of {context:,} tokens; "
                     "choose a model with a longer context (KVLAB_MODEL).")


def tools_for_time(llm: Any, wanted: int, context: int, target_s: float) -> tuple[int, float, int]:
    """How many tool schemas (up to ``wanted``, at least one) keep a cold prefill within ``target_s`` here, from one
    timed cold prefill of the longest prompt that fits: (tools, its TTFT in s, its prompt tokens)."""
    tok = llm.get_tokenizer()
    most = tools_that_fit(tok, wanted, context)
    turn = user_turns()[0]
    lengths = {n: len(chat_ids(tok, static_prefix(n), turn)) for n in range(min(1, most), most + 1)}
    timed_requests(llm, [prompt_of_length(tok, 32, offset=3_000)], cold=True)  # untimed warm-up
    ttft_s = float(timed_requests(llm, [chat_ids(tok, static_prefix(most), turn)], cold=True).ttft_s.iloc[0])
    return tools_within(lengths, ttft_s, target_s), ttft_s, lengths[most]


def tools_within(lengths: dict[int, int], ttft_s: float, target_s: float) -> int:
    """The most tools whose prompt (``lengths``: tools → prompt tokens) is forecast within ``target_s``, the longest
    prompt's cold TTFT being ``ttft_s`` and the others' in proportion to their tokens; the fewest if none is."""
    longest = lengths[max(lengths)]
    fits = [n for n, length in lengths.items() if ttft_s * length / longest <= target_s]
    return max(fits, default=min(lengths))


def user_turns() -> list[str]:
    """Distinct user questions that follow the static prefix."""
    return json.loads((PREFIX_DIR / "user_turns.json").read_text())["turns"]


def chat_ids(tokenizer: Any, system: str, user: str) -> list[int]:
    """Token ids of a chat prompt (system + user, generation prompt added) in the model's own chat template."""

    return chat_template_ids(tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": user}])


def common_prefix(a: list[int], b: list[int]) -> int:
    """Number of leading tokens two prompts share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def variants(system: str) -> dict[str, str]:
    """The token-identity experiments: the system prompt edited in ways that do or don't keep the cache."""
    first, rest = system.split(". ", 1)
    return {
        "identical": system,
        "one character changed at the start": system[0].swapcase() + system[1:],
        "one character changed at the end": system[:-1] + ("]" if system[-1] != "]" else "}"),
        "first sentence paraphrased": "Aria is the support assistant for Northwind Rail, a regional railway company. " + rest,
        "version string first (bumped)": VERSION_TAG.replace("11-01", "11-29") + "\n" + system,
        "version string last (bumped)": system + "\n" + VERSION_TAG.replace("11-01", "11-29"),
    }


def edited_prompts(system: str, kind: str, count: int) -> list[str]:
    """``count`` different edits of one kind, each new to the cache: the first sentence paraphrased another way
    (``"paraphrase"``), or a new version string at the top (``"version bump"``)."""
    first, rest = system.split(". ", 1)
    if kind == "paraphrase":
        openers = ["Aria is the support assistant for Northwind Rail, a regional railway company",
                   "Northwind Rail's passengers are helped by Aria, its support assistant",
                   "As Northwind Rail's support assistant, you are called Aria",
                   "Aria answers the questions of Northwind Rail's customers"]
        return [f"{openers[i % len(openers)]}{'.' * (1 + i // len(openers))} {rest}" for i in range(count)]
    if kind == "version bump":
        return [VERSION_TAG.replace("11-01", f"12-{i + 1:02d}") + "\n" + system for i in range(count)]
    raise ValueError(f"Unknown edit {kind!r}; use 'paraphrase' or 'version bump'.")


def prefix_counters(llm: Any) -> dict[str, int]:
    """The engine's own prefix-cache counters so far: tokens queried and tokens hit (for deltas)."""
    values = {"queries": 0, "hits": 0}
    for metric in llm.get_metrics():
        if metric.name == "vllm:prefix_cache_queries":
            values["queries"] += int(metric.value)
        elif metric.name == "vllm:prefix_cache_hits":
            values["hits"] += int(metric.value)
    return values


def timed_requests(llm: Any, prompts: list[list[int]], labels: list[str] | None = None, max_tokens: int = 4,
                   cold: bool = False) -> pd.DataFrame:
    """Send prompts one at a time; TTFT and cached tokens per request. ``cold`` empties the cache before each."""

    rows = []
    for i, ids in enumerate(prompts):
        if cold:
            llm.reset_prefix_cache()
        row = request_timing(generate_timed(llm, ids, max_tokens))
        rows.append(row | {"label": labels[i] if labels else str(i), "cold": cold})
    return pd.DataFrame(rows)


# ---- experiments (used by lesson 03 and lab L03) ---------------------------------------------------------


def cold_vs_warm(llm: Any, system: str, turns: list[str], max_tokens: int = 4) -> pd.DataFrame:
    """Each user turn after the shared prefix, first with the cache emptied (cold), then with the prefix cached (warm)."""
    tok = llm.get_tokenizer()
    prompts = [chat_ids(tok, system, t) for t in turns]
    cold = timed_requests(llm, prompts, turns, max_tokens, cold=True)
    llm.reset_prefix_cache()
    timed_requests(llm, [chat_ids(tok, system, "Hello.")], max_tokens=max_tokens)  # one earlier request caches the prefix
    warm = timed_requests(llm, prompts, turns, max_tokens, cold=False)
    return pd.concat([cold.assign(cache="cold"), warm.assign(cache="warm")], ignore_index=True)


def sweep_pair(tok: Any, length: int, suffix_tokens: int, repeat: int = 0, repeats: int = 1) -> tuple[list[int], list[int]]:
    """``prefix_length_sweep``'s cold and warm prompts for one length and repeat: the same ``length``-token prefix,
    two different ``suffix_tokens``-token suffixes."""
    prefix = prompt_of_length(tok, length, offset=0)
    suffixes = distinct_prompts(tok, suffix_tokens, 2 * repeats + 1, seed=length)
    return prefix + suffixes[2 * repeat], prefix + suffixes[2 * repeat + 1]


def prefix_length_sweep(llm: Any, prefix_lengths: list[int], suffix_tokens: int, repeats: int, max_tokens: int = 4) -> pd.DataFrame:
    """Shared prefix of each length + a unique suffix: cold and warm TTFT, and how many tokens were reused."""

    tok = llm.get_tokenizer()
    rows = []
    for length in prefix_lengths:
        for r in range(repeats):
            cold_ids, warm_ids = sweep_pair(tok, length, suffix_tokens, r, repeats)
            cold = timed_requests(llm, [cold_ids], max_tokens=max_tokens, cold=True)
            warm = timed_requests(llm, [warm_ids], max_tokens=max_tokens)  # the cold run cached the prefix
            rows += [cold.assign(cache="cold"), warm.assign(cache="warm")]
    df = pd.concat(rows, ignore_index=True)
    df["prefix_tokens"] = df.prompt_tokens - suffix_tokens
    return df


def identity_experiment(llm: Any, system: str, turn: str, max_tokens: int = 4) -> pd.DataFrame:
    """Cache the original prefix once, then send each variant of it: what the prefix cache still recognises."""
    tok = llm.get_tokenizer()
    llm.reset_prefix_cache()
    original = chat_ids(tok, system, turn)
    timed_requests(llm, [chat_ids(tok, system, "Hello.")], max_tokens=max_tokens)  # caches the original prefix
    rows = []
    for name, text in variants(system).items():
        ids = chat_ids(tok, text, turn)
        row = timed_requests(llm, [ids], [name], max_tokens).iloc[0].to_dict()
        rows.append(row | {"tokens shared with original": common_prefix(ids, original)})
    return pd.DataFrame(rows)


def _traffic_kinds(requests: int, shared_fraction: float, rng: Any) -> list[str]:
    kinds = ["shared prefix"] * round(requests * shared_fraction)
    kinds += ["unique"] * (requests - len(kinds))
    rng.shuffle(kinds)
    return kinds


def mixed_traffic(llm: Any, system: str, turns: list[str], requests: int, shared_fraction: float, seed: int = 0,
                  caching: bool = True, max_tokens: int = 4) -> tuple[pd.DataFrame, dict[str, float]]:
    """A stream of requests, ``shared_fraction`` of them prefix + user turn, the rest unique prompts of the same length.

    ``caching=False`` empties the cache before every request: the same traffic as if prefix caching were off.
    Returns per-request rows and the engine's own counter deltas (token hit rate).
    """
    import random


    tok = llm.get_tokenizer()
    rng = random.Random(seed)
    kinds = _traffic_kinds(requests, shared_fraction, rng)
    length = len(chat_ids(tok, system, turns[0]))
    uniques = iter(distinct_prompts(tok, length, kinds.count("unique"), seed=seed + 17))
    prompts = [chat_ids(tok, system, rng.choice(turns)) if k == "shared prefix" else next(uniques) for k in kinds]
    return _run_mixed(llm, prompts, kinds, caching, max_tokens)


def token_traffic(llm: Any, prefix_tokens: int, suffix_tokens: int, requests: int, shared_fraction: float, seed: int = 0,
                  caching: bool = True, max_tokens: int = 4) -> tuple[pd.DataFrame, dict[str, float]]:
    """Like ``mixed_traffic`` with token-exact prompts from real text: a shared prefix + unique suffixes, or unique."""
    import random


    tok = llm.get_tokenizer()
    kinds = _traffic_kinds(requests, shared_fraction, random.Random(seed))
    prefix = prompt_of_length(tok, prefix_tokens, offset=0)
    suffixes = iter(distinct_prompts(tok, suffix_tokens, requests, seed=seed + 1))
    uniques = iter(distinct_prompts(tok, prefix_tokens + suffix_tokens, requests, seed=seed + 17))
    prompts = [prefix + next(suffixes) if k == "shared prefix" else next(uniques) for k in kinds]
    return _run_mixed(llm, prompts, kinds, caching, max_tokens)


def _run_mixed(llm: Any, prompts: list[list[int]], kinds: list[str], caching: bool, max_tokens: int) -> tuple[pd.DataFrame, dict[str, float]]:

    for ids in prompts:
        check_fits(len(ids), max_tokens, llm.llm_engine.vllm_config.model_config.max_model_len)
    llm.reset_prefix_cache()
    before = prefix_counters(llm)
    df = timed_requests(llm, prompts, kinds, max_tokens, cold=not caching)
    after = prefix_counters(llm)
    queries = after["queries"] - before["queries"]
    hits = after["hits"] - before["hits"]
    return df.assign(caching="on" if caching else "off"), {"queried_tokens": queries, "hit_tokens": hits,
                                                           "token_hit_rate": hits / queries if queries else 0.0}


def three_paths(client: Any, system: str, turns: list[str], max_tokens: int = 8,
                variants: dict[str, list[str]] | None = None) -> Any:
    """The same kind of request down every path, through a gateway with Redis (lesson 03): **cold prefill** (each with
    a system prompt no earlier request had: a new ticket number first), **warm prefix** (the shared system prompt,
    cached by one earlier request), **response cache** (exact repeats of the warm ones), and each of ``variants``
    ({name: one edited system prompt per turn, for the first turns or all}, each new to both caches: a paraphrase, a
    version bump) — one row per request, client-side timing."""
    import pandas as pd


    def ask(path: str, system_text: str, turn: str) -> dict[str, Any]:
        messages = [{"role": "system", "content": system_text}, {"role": "user", "content": turn}]
        return stream_chat(client, messages, max_tokens, label=path) | {"question": turn[:40]}

    ask("warm-up", f"Warm-up\n{system}", "Hello.")  # the server's first long prefill warms its kernels: not a sample
    rows = [ask("cold prefill", f"Ticket #{40_000 + i}\n{system}", t) for i, t in enumerate(turns)]
    ask("warm-up", system, "Hello.")  # caches the shared prefix in the engine
    rows += [ask("warm prefix", system, t) for t in turns]
    rows += [ask("response cache", system, t) for t in turns]
    for name, texts in (variants or {}).items():
        if len(texts) > len(turns):
            raise ValueError(f"{len(texts)} {name} prompts for {len(turns)} turns: at most one per turn.")
        rows += [ask(name, text, t) for text, t in zip(texts, turns[: len(texts)], strict=True)]
    return pd.DataFrame(rows)
