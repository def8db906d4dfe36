"""The paged KV cache on the live engine: budgets in whole blocks, shared-prefix traffic, hit rate per budget, preemption.

vLLM keeps the KV cache in fixed-size blocks; a sequence holds ⌈tokens / block size⌉ of them; a full block whose
tokens (and whole prefix) match another request's is shared; blocks of finished requests stay cached until their
memory is needed, then the least recently used is evicted (``vllm/v1/core/block_pool.py``, ``free_block_queue``).
When a running request cannot get its next block, the scheduler preempts **another** running request — under FCFS the
last admitted, under priority scheduling the lowest-priority (latest among equals) — and the one that needed the block
is itself preempted only when it is that victim (``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``). The
victim's blocks are freed, but with prefix caching on its full blocks keep their hashes in the free queue, so when it
is admitted again part of it can be a prefix-cache hit rather than a recompute (``PreemptedHits`` counts how much).
"""

from __future__ import annotations

import random
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from kvlab import kvevents, metrics
from kvlab.caching import prefix_counters, timed_requests
from kvlab.prompts import distinct_prompts, prompt_of_length
from kvlab.runtime.engine import close_engine, kv_capacity, make_engine
from kvlab.runtime.errors import KVLabError
from kvlab.sizing import blocks_needed  # ⌈tokens / block size⌉: lesson 01's arithmetic, one definition
from kvlab.timing import generate_batch, p95, timing_table


def check_budget(blocks: int, block_size: int, max_model_len: int) -> None:
    """Refuse a budget smaller than one sequence of ``max_model_len`` tokens, naming the smallest that works."""
    need = blocks_needed(max_model_len, block_size)
    if blocks < need:
        raise KVLabError(f"A KV budget of {blocks} blocks ({blocks * block_size:,} tokens) cannot hold one sequence of "
                         f"max_model_len {max_model_len:,} tokens; use at least {need} blocks or a smaller max_model_len.")


def pool_blocks(blocks: int, groups: int = 1) -> int:
    """The engine blocks of a pool that holds ``blocks`` − the null block in each of ``groups`` KV cache groups: vLLM
    stores a block of tokens once per group (while it is inside a sliding group's window), and keeps one null block."""
    return groups * (blocks - RESERVED_BLOCKS) + RESERVED_BLOCKS


def engine_with_blocks(blocks: int, block_size: int, bytes_per_block: int, max_model_len: int, model: str | None = None,
                       groups: int = 1, **engine_args: Any) -> Any:
    """An engine whose KV cache is exactly ``blocks`` blocks per KV cache group (``pool_blocks``; budget = engine
    blocks × bytes per block, lesson 01's arithmetic); refuses a budget too small for one sequence before anything
    starts."""

    check_budget(blocks, block_size, max_model_len)
    want = pool_blocks(blocks, groups)
    llm = make_engine(model, kv_cache_memory_bytes=want * bytes_per_block, max_model_len=max_model_len, **engine_args)
    got = kv_capacity(llm).num_blocks
    if got != want:  # the engine's own count must be the arithmetic's: say so rather than measure the wrong pool
        close_engine(llm)
        raise KVLabError(f"Asked for {want} KV blocks, the engine made {got}; check bytes_per_block "
                         "(KVCapacity.bytes_per_block) and the number of KV cache groups (kvlab.kv_groups).")
    return llm


def shared_prefix_traffic(tokenizer: Any, count: int, shared_share: float, prefix_tokens: int, suffix_tokens: int,
                          unique_tokens: int, seed: int = 0) -> list[tuple[str, list[int]]]:
    """``count`` requests as (label, token ids): a share ``shared_share`` start with the same ``prefix_tokens``-token
    prefix (then a distinct suffix), the rest are unique prompts of ``unique_tokens`` tokens; order seeded."""

    if not 0 <= shared_share <= 1:
        raise KVLabError(f"shared_share must be a fraction between 0 and 1, got {shared_share!r}.")
    rng = random.Random(seed)
    kinds = ["shared" if rng.random() < shared_share else "unique" for _ in range(count)]
    prefix = prompt_of_length(tokenizer, prefix_tokens, offset=0)
    suffixes = iter(distinct_prompts(tokenizer, suffix_tokens, count, seed=seed + 101))
    uniques = iter(distinct_prompts(tokenizer, unique_tokens, count, seed=seed + 202))
    return [(k, prefix + next(suffixes) if k == "shared" else next(uniques)) for k in kinds]


def run_sequential(llm: Any, requests: list[tuple[str, list[int]]], max_tokens: int) -> pd.DataFrame:
    """Send the requests one after another; one timing row each (with ``label`` and ``cached_tokens``)."""

    return timed_requests(llm, [ids for _, ids in requests], [label for label, _ in requests], max_tokens)


class PreemptedHits:
    """What re-admitted (preempted) requests found in the prefix cache, from the scheduler's own per-step stats
    (``vllm/v1/metrics/stats.py``, ``PrefixCacheStats.preempted_queries`` / ``preempted_hits``: tokens a re-admitted
    request looked up, and those it found cached). vLLM's Prometheus counters count new requests only, so this listens
    as one more of the in-process engine's stat loggers (``LLMEngine.logger_manager``)."""

    def __init__(self) -> None:
        self.readmissions = self.queried_tokens = self.hit_tokens = 0

    @classmethod
    def attach(cls, llm: Any) -> PreemptedHits:
        """A new counter listening to ``llm``'s steps (needs ``disable_log_stats=False``, which ``make_engine`` sets)."""
        counter = cls()
        manager = llm.llm_engine.logger_manager
        if manager is None:
            raise KVLabError("This engine records no stats; start it with kvlab.make_engine (disable_log_stats=False).")
        manager.stat_loggers.append(counter)
        return counter

    def detach(self, llm: Any) -> None:
        """Stop listening."""
        loggers = llm.llm_engine.logger_manager.stat_loggers
        if self in loggers:
            loggers.remove(self)

    @property
    def recomputed_tokens(self) -> int:
        """Tokens re-admitted requests had to compute again (looked up and not found)."""
        return self.queried_tokens - self.hit_tokens

    def record(self, scheduler_stats: Any, iteration_stats: Any = None, mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
        stats = getattr(scheduler_stats, "prefix_cache_stats", None)
        if stats is not None:
            self.readmissions += stats.preempted_requests
            self.queried_tokens += stats.preempted_queries
            self.hit_tokens += stats.preempted_hits

    def record_sleep_state(self, *args: Any, **kwargs: Any) -> None:
        """Not needed: part of vLLM's stat-logger interface."""

    def record_admission_rejection(self, *args: Any, **kwargs: Any) -> None:
        """Not needed: part of vLLM's stat-logger interface."""

    def log(self) -> None:
        """Not needed: part of vLLM's stat-logger interface."""

    def log_engine_initialized(self) -> None:
        """Not needed: part of vLLM's stat-logger interface."""


def preemption_run(llm: Any, sequences: int, prompt_tokens: int, output_tokens: int, seed: int = 0) -> pd.DataFrame:
    """``sequences`` distinct requests submitted together, each growing to ``prompt_tokens + output_tokens``; one
    timing row each with the engine's count of its preemptions, and the run's re-admissions: how many, the tokens they
    looked up in the prefix cache, and how many of those were hits (``PreemptedHits``; the same on every row)."""

    prompts = distinct_prompts(llm.get_tokenizer(), prompt_tokens, sequences, seed=seed)
    llm.reset_prefix_cache()
    counter = PreemptedHits.attach(llm)
    try:
        outputs = generate_batch(llm, prompts, output_tokens)
    finally:
        counter.detach(llm)
    return timing_table(outputs, sequences=sequences).assign(
        run_readmissions=counter.readmissions, run_readmitted_tokens=counter.queried_tokens,
        run_readmitted_hit_tokens=counter.hit_tokens)


#: Blocks of the pool no request can use: vLLM keeps one as its "null block" (``vllm/v1/core/block_pool.py``:
#: ``self.null_block = self.free_block_queue.popleft()``).
RESERVED_BLOCKS = 1


def _prefix_pressure(requests: list[tuple[str, list[int]]], prefix_blocks: int, block_size: int,
                     output_tokens: int) -> list[int | None]:
    """For each "shared" request after the first: blocks it takes for the prefix to still be cached — the prefix, the
    full blocks cached since its last use, one partial block (reused first: uncached blocks go to the front of the free
    queue) and vLLM's reserved null block. None for the other requests and the first shared one."""
    out: list[int | None] = []
    since: int | None = None  # full blocks cached since the prefix was last used (None: never used yet)
    for label, ids in requests:
        full = (len(ids) + output_tokens) // block_size
        if label == "shared":
            out.append(None if since is None else prefix_blocks + since + 1 + RESERVED_BLOCKS)
            since = full - prefix_blocks  # its own full blocks beyond the prefix are freed before the prefix: older
        else:
            out.append(None)
            if since is not None:
                since += full
    return out


def predicted_prefix_hits(requests: list[tuple[str, list[int]]], prefix_blocks: int, block_size: int, output_tokens: int,
                          pool_blocks: int) -> list[bool | None]:
    """For requests sent one after another into a pool of ``pool_blocks``: will each "shared" request find the prefix
    cached? (None for the others and for the first shared one, which is cold.) LRU arithmetic: after a shared request
    the prefix's blocks are the most recently used (cached blocks are freed to the back of the free queue, the
    request's tail first); every later request takes blocks from the front, so the prefix survives while the full
    blocks cached since its last use, one partial block and the null block fit beside it."""
    return [None if need is None else need <= pool_blocks
            for need in _prefix_pressure(requests, prefix_blocks, block_size, output_tokens)]


def survival_budget(requests: list[tuple[str, list[int]]], prefix_blocks: int, block_size: int, output_tokens: int) -> int:
    """The smallest pool (blocks) in which every shared request after the first finds the prefix cached."""
    needs = [n for n in _prefix_pressure(requests, prefix_blocks, block_size, output_tokens) if n is not None]
    return max(needs, default=prefix_blocks + 1 + RESERVED_BLOCKS)


# ---- budgets, traffic and the sweep over budgets (lesson 08 section 5, lab L08) ------------------------------------
#: Units a KV budget can be given in: whole blocks, tokens or GiB (rounded down to whole blocks), or multiples of the
#: traffic's survival budget (fits any model and block size).
BUDGET_UNITS = ("survival", "blocks", "tokens", "GiB")


def to_blocks(budgets: list[float], unit: str, block_size: int, bytes_per_block: int, survival: int,
              groups: int = 1) -> list[int]:
    """Budgets as whole blocks (rounded down, duplicates dropped, increasing)."""
    per_block = {"blocks": 1, "tokens": block_size, "GiB": groups * bytes_per_block / 2**30,
                 "survival": 1 / survival}
    if unit not in per_block:
        raise KVLabError(f"Unknown budget unit {unit!r}; use one of {', '.join(BUDGET_UNITS)}.")
    return sorted({int(b / per_block[unit] + 1e-9) for b in budgets})


def check_traffic(prefix_tokens: int, suffix_tokens: int, unique_tokens: int, output_tokens: int, max_context: int | None) -> int:
    """The longest request (tokens, output included); refuses traffic longer than the model's context in one sentence."""
    longest = max(prefix_tokens + suffix_tokens, unique_tokens) + output_tokens
    if max_context and prefix_tokens + suffix_tokens + output_tokens > max_context:
        raise KVLabError(f"The shared prefix ({prefix_tokens:,} tokens) plus its suffix ({suffix_tokens:,}) and the output "
                         f"({output_tokens:,}) is longer than the model's context of {max_context:,} tokens; use a shorter "
                         "shared prefix.")
    if max_context and longest > max_context:
        raise KVLabError(f"A unique prompt of {unique_tokens:,} tokens plus {output_tokens:,} output tokens is longer than "
                         f"the model's context of {max_context:,} tokens; use a shorter unique prompt.")
    return longest


def prefix_blocks_of(prefix_tokens: int, block_size: int) -> int:
    """Whole blocks of a shared prefix (only full blocks are shared); refuses a prefix shorter than one block."""
    if prefix_tokens < block_size:
        raise KVLabError(f"A shared prefix of {prefix_tokens:,} tokens is shorter than one KV block ({block_size} tokens): "
                         f"only full blocks are shared; use a prefix of at least {block_size} tokens.")
    return prefix_tokens // block_size


def run_in_waves(llm: Any, requests: list[tuple[str, list[int]]], max_tokens: int, concurrency: int = 1) -> pd.DataFrame:
    """The requests one after another (``concurrency`` 1), or in waves of ``concurrency`` submitted together."""
    if concurrency <= 1:
        return run_sequential(llm, requests, max_tokens)

    waves = []
    for start in range(0, len(requests), concurrency):
        wave = requests[start : start + concurrency]
        outs = generate_batch(llm, [ids for _, ids in wave], max_tokens)
        waves.append(timing_table(outs, wave=start // concurrency).assign(label=[label for label, _ in wave]))
    return pd.concat(waves, ignore_index=True)


def block_residency(llm: Any) -> dict[str, float]:
    """The engine's block residency histograms (``kv_cache_metrics=True``, ``vllm/v1/core/kv_cache_metrics.py``): how
    many blocks were handed out again and how long they had lived / sat idle. vLLM records a block when the pool hands
    it out again, cached or not (``block_pool.py``: ``_maybe_evict_cached_block`` calls ``on_block_evicted`` before it
    checks for a hash), so with sample rate 1 the count is at least the BlockRemoved events."""

    values = metrics.engine_values(llm)
    life, idle = "vllm:kv_block_lifetime_seconds", "vllm:kv_block_idle_before_evict_seconds"
    return {"reallocated_blocks": values.get(life + "_count", 0.0),
            "block_lifetime_p50_s": metrics.quantile(values, life, 0.5),
            "idle_before_evict_p50_s": metrics.quantile(values, idle, 0.5),
            "idle_before_evict_p95_s": metrics.quantile(values, idle, 0.95)}


def expected_stored(results: pd.DataFrame, block_size: int) -> int:
    """Blocks the requests should have stored: each caches its full blocks of computed tokens (prompt + output − 1:
    the last token's KV is never computed) except the ones it found cached."""
    full = (results.prompt_tokens + results.output_tokens - 1) // block_size
    return int((full - results.cached_tokens // block_size).sum())


def budget_sweep(traffic: list[tuple[str, list[int]]], budgets: list[int], prefix_ids: list[int], block_size: int,
                 bytes_per_block: int, output_tokens: int, max_model_len: int, subscriber: Any = None,
                 concurrency: int = 1, model: str | None = None, group: int | None = None, groups: int = 1,
                 **engine_args: Any) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The same traffic on an engine of each budget (whole blocks): per-request rows (with the prefix hit and, for
    sequential traffic, the predicted one), one row per budget of the engine's own counters and histograms, and the
    KV cache events (when a ``kvevents.Subscriber`` is given; of KV cache ``group`` only, where the model has
    several; a budget counts blocks per group, ``pool_blocks``). Each engine is closed before the next starts."""
    from tqdm.auto import tqdm


    prefix_blocks = len(prefix_ids) // block_size
    rows, engine_rows, event_tables = [], [], []
    extra = (subscriber.engine_args() if subscriber else {}) | {"kv_cache_metrics": True, "kv_cache_metrics_sample": 1.0}
    for blocks in tqdm(budgets, desc="KV budgets", leave=False):
        llm = engine_with_blocks(blocks, block_size, bytes_per_block, max_model_len, model=model, groups=groups, **extra,
                                 **engine_args)
        try:
            if subscriber:
                subscriber.wait_quiet()
                subscriber.clear()
            before = prefix_counters(llm)
            res = run_in_waves(llm, traffic, output_tokens, concurrency)
            after = prefix_counters(llm)
            residency = block_residency(llm)
        finally:
            close_engine(llm)
        predicted = predicted_prefix_hits(traffic, prefix_blocks, block_size, output_tokens, blocks) \
            if concurrency <= 1 else [None] * len(traffic)
        res = res.assign(budget_blocks=blocks, budget_tokens=blocks * block_size, predicted_hit=predicted,
                         hit=(res.label == "shared") & (res.cached_tokens >= prefix_blocks * block_size))
        rows.append(res)
        row = {"budget_blocks": blocks, "engine_hit_tokens": after["hits"] - before["hits"],
               "engine_query_tokens": after["queries"] - before["queries"], **residency}
        if subscriber:
            subscriber.wait_quiet()
            ev = subscriber.table(group)
            ev = ev.assign(budget_blocks=blocks, owner=kvevents.owners(ev, {"shared prefix": prefix_ids}, block_size))
            event_tables.append(ev.drop(columns=["token_ids"]))
            row |= {"stored_events": int((ev.event == "stored").sum()), "removed_events": int((ev.event == "removed").sum()),
                    "prefix_blocks_evicted": int(((ev.event == "removed") & (ev.owner == "shared prefix")).sum()),
                    "expected_stored": expected_stored(res, block_size)}
        engine_rows.append(row)
    events = pd.concat(event_tables, ignore_index=True) if event_tables else pd.DataFrame()
    return pd.concat(rows, ignore_index=True), pd.DataFrame(engine_rows), events


def budget_table(results: pd.DataFrame, engine: pd.DataFrame, block_size: int, bytes_per_block: int,
                 groups: int = 1) -> pd.DataFrame:
    """One row per budget: its size in blocks, tokens and MiB, the engine's token hit rate, the shared requests' prefix
    hits (measured and predicted) and TTFT p50/p95 of shared and unique requests."""

    def per_budget(g: pd.DataFrame) -> pd.Series:
        shared, unique = g[g.label == "shared"], g[g.label == "unique"]
        checked = shared.dropna(subset=["predicted_hit"])
        return pd.Series({
            "shared_requests": len(shared), "prefix_hits": int(shared.hit.sum()),
            "predicted_hits": int(checked.predicted_hit.astype(bool).sum()) if len(checked) else float("nan"),
            "prediction_agrees": (checked.predicted_hit.astype(bool) == checked.hit).mean() if len(checked) else float("nan"),
            "shared_ttft_p50_ms": shared.ttft_s.median() * 1e3, "shared_ttft_p95_ms": p95(shared.ttft_s) * 1e3,
            "unique_ttft_p50_ms": unique.ttft_s.median() * 1e3, "unique_ttft_p95_ms": p95(unique.ttft_s) * 1e3,
            "cached_tokens": int(g.cached_tokens.sum())})

    table = results.groupby("budget_blocks").apply(per_budget, include_groups=False).reset_index()
    table = table.astype({"shared_requests": int, "prefix_hits": int, "cached_tokens": int})
    table.insert(1, "budget_tokens", table.budget_blocks * block_size)
    table.insert(2, "budget_mib", table.budget_blocks.map(lambda b: pool_blocks(b, groups)) * bytes_per_block / 2**20)
    table = table.merge(engine, on="budget_blocks")
    table["token_hit_rate"] = table.engine_hit_tokens / table.engine_query_tokens
    return table


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
