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
