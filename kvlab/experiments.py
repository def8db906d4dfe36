"""Experiments: run requests on an engine the honest way (warm-up first, repeats, cold cache)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvlab.engine import chat
from kvlab.timing import timing_table


def repeat_chat(llm: Any, question: str, repeats: int, max_tokens: int, warmup: int = 1, cold: bool = True) -> tuple[pd.DataFrame, list[Any]]:
    """Ask one chat question ``repeats`` times after ``warmup`` untimed runs; exactly ``max_tokens`` out each.

    ``cold=True`` empties the prefix cache before each timed run, so no run reuses another's KV.
    Returns the tidy timing table and the raw vLLM outputs.
    """
    if repeats < 1 or max_tokens < 1:
        from kvlab.errors import KVLabError

        raise KVLabError(f"repeats={repeats} and max_tokens={max_tokens} must both be at least 1.")
    for _ in range(warmup):
        chat(llm, question, max_tokens=max_tokens, ignore_eos=True)
    outputs = []
    for _ in range(repeats):
        if cold:
            llm.reset_prefix_cache()
        outputs.append(chat(llm, question, max_tokens=max_tokens, ignore_eos=True))
    return timing_table(outputs, max_tokens=max_tokens, cold=cold), outputs


def capacity_check(model: str | None = None, kv_cache_gib: float = 1.0, dtype: str = "bfloat16",
                   kv_cache_dtype: str = "auto", keep: bool = False, **engine_args: Any) -> tuple[dict[str, Any], Any]:
    """Start an engine with a fixed KV budget and compare its reported capacity with the hand formula.

    Returns one tidy row (hand vs engine bytes/token and tokens, difference in blocks) and the engine
    if ``keep`` (else it is closed). Eager mode: this measures memory, not speed, so no compile wait.
    """
    from kvlab import sizing
    from kvlab.engine import close_engine, kv_capacity, make_engine
    from kvlab.model import resolve_model

    path = resolve_model(model)
    arch = sizing.load_arch(path)
    llm = make_engine(path, kv_cache_gib=kv_cache_gib, dtype=dtype, kv_cache_dtype=kv_cache_dtype,
                      **({"enforce_eager": True, "max_model_len": 2048} | engine_args))
    cap = kv_capacity(llm)
    kv_dtype = dtype if kv_cache_dtype == "auto" else kv_cache_dtype
    per_token = sizing.bytes_per_token(arch, kv_dtype)
    budget = kv_cache_gib * sizing.GiB
    hand_tokens = int(budget // (per_token * cap.block_size)) * cap.block_size  # whole blocks only
    row = {"model": arch.name, "attention": arch.attention, "kv_heads": arch.kv_heads, "kv_dtype": kv_dtype,
           "hand_bytes_per_token": per_token, "engine_bytes_per_token": cap.bytes_per_token,
           "hand_tokens": hand_tokens, "engine_tokens": cap.tokens, "engine_blocks": cap.num_blocks,
           "block_size": cap.block_size, "difference_blocks": (cap.tokens - hand_tokens) / cap.block_size}
    if keep:
        return row, llm
    close_engine(llm)
    return row, None
