"""The paged KV cache on the live engine: budgets in whole blocks, shared-prefix traffic, hit rate per budget, preemption.

vLLM keeps the KV cache in fixed-size blocks; a sequence holds ⌈tokens / block size⌉ of them; a full block whose
tokens (and whole prefix) match another request's is shared; blocks of finished requests stay cached until their
memory is needed, then the least recently used is evicted (``vllm/v1/core/block_pool.py``, ``free_block_queue``); a
running sequence that cannot get its next block is preempted and later recomputed (``vllm/v1/core/sched/scheduler.py``).
"""

from __future__ import annotations

import math
import random
from typing import Any

import pandas as pd

from kvlab.errors import KVLabError


def blocks_needed(tokens: int, block_size: int) -> int:
    """Blocks one sequence of ``tokens`` tokens holds: ⌈tokens / block size⌉."""
    return math.ceil(tokens / block_size)


def check_budget(blocks: int, block_size: int, max_model_len: int) -> None:
    """Refuse a budget smaller than one sequence of ``max_model_len`` tokens, naming the smallest that works."""
    need = blocks_needed(max_model_len, block_size)
    if blocks < need:
        raise KVLabError(f"A KV budget of {blocks} blocks ({blocks * block_size:,} tokens) cannot hold one sequence of "
                         f"max_model_len {max_model_len:,} tokens; use at least {need} blocks or a smaller max_model_len.")


def engine_with_blocks(blocks: int, block_size: int, bytes_per_token: int, max_model_len: int, model: str | None = None,
                       **engine_args: Any) -> Any:
    """An engine whose KV cache is exactly ``blocks`` blocks (budget = blocks × block size × bytes per token, lesson
    01's arithmetic); refuses a budget too small for one sequence before anything starts."""
    from kvlab.engine import kv_capacity, make_engine

    check_budget(blocks, block_size, max_model_len)
    llm = make_engine(model, kv_cache_memory_bytes=blocks * block_size * bytes_per_token, max_model_len=max_model_len,
                      **engine_args)
    got = kv_capacity(llm).num_blocks
    if got != blocks:  # the engine's own count must be the arithmetic's: say so rather than measure the wrong pool
        raise KVLabError(f"Asked for {blocks} KV blocks, the engine made {got}; check block_size and bytes_per_token.")
    return llm


def shared_prefix_traffic(tokenizer: Any, count: int, shared_share: float, prefix_tokens: int, suffix_tokens: int,
                          unique_tokens: int, seed: int = 0) -> list[tuple[str, list[int]]]:
    """``count`` requests as (label, token ids): a share ``shared_share`` start with the same ``prefix_tokens``-token
    prefix (then a distinct suffix), the rest are unique prompts of ``unique_tokens`` tokens; order seeded."""
    from kvlab.prompts import distinct_prompts, prompt_of_length

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
    from kvlab.caching import timed_requests

    return timed_requests(llm, [ids for _, ids in requests], [label for label, _ in requests], max_tokens)


def preemption_run(llm: Any, sequences: int, prompt_tokens: int, output_tokens: int, seed: int = 0) -> pd.DataFrame:
    """``sequences`` distinct requests submitted together, each growing to ``prompt_tokens + output_tokens``; one
    timing row each with the engine's count of its preemptions."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from kvlab.prompts import distinct_prompts
    from kvlab.timing import timing_table

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in distinct_prompts(llm.get_tokenizer(), prompt_tokens, sequences, seed=seed)]
    params = SamplingParams(temperature=0.0, max_tokens=output_tokens, ignore_eos=True)
    llm.reset_prefix_cache()
    return timing_table(llm.generate(prompts, params, use_tqdm=False), sequences=sequences)


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
