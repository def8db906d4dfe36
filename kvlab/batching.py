"""Batching (lesson 05): batches of equal requests on one engine, what each batch size gives in latency and throughput."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvlab.prompts import distinct_prompts
from kvlab.timing import generate_batch, request_timing, summarize


def batch_sweep(llm: Any, batch_sizes: list[int], prompt_tokens: int, output_tokens: int, repeats: int) -> pd.DataFrame:
    """Offline batches: B distinct prompts submitted together, each B ``repeats`` times (after one warm-up batch).

    One row per request (engine timestamps) with ``batch_size``, ``repeat`` and the batch's wall time.
    """
    import time

    from tqdm.auto import tqdm


    tok = llm.get_tokenizer()
    pool = distinct_prompts(tok, prompt_tokens, max(batch_sizes) * (repeats + 1), seed=11)
    generate_batch(llm, pool[: min(batch_sizes)], output_tokens)  # warm-up
    rows = []
    with tqdm(total=len(batch_sizes) * repeats, desc="batches", unit="batch") as bar:
        for r in range(repeats):
            for b in batch_sizes:
                llm.reset_prefix_cache()
                start = time.perf_counter()
                outs = generate_batch(llm, pool[r * max(batch_sizes): r * max(batch_sizes) + b], output_tokens)
                wall = time.perf_counter() - start
                rows += [request_timing(o) | {"batch_size": b, "repeat": r, "batch_wall_s": wall} for o in outs]
                bar.update()
    return pd.DataFrame(rows)


def batch_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per batch size: TTFT and TPOT (median, p95) and throughput.

    decode throughput = batch size ÷ median TPOT (tokens per second while all sequences decode together);
    output throughput = output tokens of the batch ÷ its median wall time (prefill included).
    """

    s = summarize(df, ["ttft_s", "tpot_s"], by=["batch_size"])
    per_batch = df.groupby(["batch_size", "repeat"]).agg(tokens=("output_tokens", "sum"), wall=("batch_wall_s", "first")).reset_index()
    wall = per_batch.groupby("batch_size").agg(tokens=("tokens", "median"), wall=("wall", "median"))
    s["decode_tok_s"] = s.batch_size / s.tpot_s_p50
    s["output_tok_s"] = s.batch_size.map(wall.tokens / wall.wall)
    s["preemptions"] = s.batch_size.map(df.groupby("batch_size").preemptions.sum())
    return s
