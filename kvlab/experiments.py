"""Experiments: run requests on an engine the honest way (warm-up first, repeats, cold cache)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvlab import outliers
from kvlab.engine import chat
from kvlab.timing import PRECISION, relative_ci, request_timing, timing_table


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


def capacity_check(model: str | None = None, kv_cache_gib: float = 1.0, dtype: str | None = None,
                   kv_cache_dtype: str = "auto", keep: bool = False, **engine_args: Any) -> tuple[dict[str, Any], Any]:
    """Start an engine with a fixed KV budget and compare its reported capacity with the hand formula.

    ``dtype`` defaults to the machine's (``engine.model_dtype``: on a GPU the model's own, which vLLM turns into float16
    where bf16 is unsupported, ``vllm/config/model.py`` ``_resolve_auto_dtype``; on a CPU without native bf16,
    float32); the hand formula uses the dtype the engine reports, not the one asked for.
    Returns one tidy row — hand vs engine bytes/token, blocks, tokens and (for sliding-window layers, where vLLM
    reserves more than the window) sequences of ``max_model_len`` that fit, as ``sizing.vllm_kv_plan`` computes
    them — and the engine if ``keep`` (else it is closed). Eager mode: this measures memory, not speed.
    """
    from kvlab import sizing
    from kvlab.engine import close_engine, kv_capacity, make_engine
    from kvlab.model import resolve_model
    from kvlab.roofline import engine_dtype

    path = resolve_model(model)
    arch = sizing.load_arch(path)
    asked = {"dtype": dtype} if dtype else {}
    llm = make_engine(path, kv_cache_gib=kv_cache_gib, kv_cache_dtype=kv_cache_dtype,
                      **({"enforce_eager": True, "max_model_len": 2048} | asked | engine_args))
    cap = kv_capacity(llm)
    vcfg = llm.llm_engine.vllm_config
    model_dtype = engine_dtype(llm)
    kv_dtype = model_dtype if kv_cache_dtype == "auto" else kv_cache_dtype
    per_token = sizing.bytes_per_token(arch, kv_dtype)
    budget = kv_cache_gib * sizing.GiB
    step_tokens = int(vcfg.scheduler_config.max_num_batched_tokens)
    plan = sizing.vllm_kv_plan(arch, budget, cap.max_model_len, kv_dtype, cap.block_size, step_tokens,
                               vcfg.max_concurrent_batches)
    engine_blocks_per_request = cap.num_blocks / cap.max_concurrency
    row = {"model": arch.name, "attention": arch.attention, "kv_heads": arch.kv_heads, "model_dtype": model_dtype,
           "kv_dtype": kv_dtype,
           "sliding_layers": arch.sliding_layers, "sliding_window": arch.sliding_window or 0,
           "max_model_len": cap.max_model_len, "max_num_batched_tokens": step_tokens,
           "hand_bytes_per_token": per_token, "engine_bytes_per_token": cap.bytes_per_token,
           "hand_blocks": plan.num_blocks, "engine_blocks": cap.num_blocks, "block_size": cap.block_size,
           "hand_tokens": plan.num_blocks * cap.block_size, "engine_tokens": cap.num_blocks * cap.block_size,
           "difference_blocks": cap.num_blocks - plan.num_blocks,
           "hand_blocks_per_request": plan.blocks_per_request, "engine_blocks_per_request": engine_blocks_per_request,
           "ideal_blocks_per_request": plan.ideal_blocks_per_request,
           "hand_max_concurrency": plan.max_concurrency, "engine_max_concurrency": cap.max_concurrency,
           "ideal_max_concurrency": plan.num_blocks / plan.ideal_blocks_per_request}
    if keep:
        return row, llm
    close_engine(llm)
    return row, None


def generate_batch(llm: Any, prompts: list[list[int]], max_tokens: int, **sampling: Any) -> list[Any]:
    """Requests from token ids submitted together, exactly ``max_tokens`` out each, greedy unless ``sampling`` says
    otherwise (any ``SamplingParams`` field); returns vLLM's RequestOutputs, in order (``timing.timing_table`` reads them)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(**({"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True} | sampling))
    return llm.generate([TokensPrompt(prompt_token_ids=list(ids)) for ids in prompts], params, use_tqdm=False)


def generate_timed(llm: Any, prompt_ids: list[int], max_tokens: int, **sampling: Any) -> Any:
    """One request from token ids with exactly ``max_tokens`` output tokens (greedy unless ``sampling`` says
    otherwise); returns vLLM's RequestOutput."""
    return generate_batch(llm, [prompt_ids], max_tokens, **sampling)[0]


def sweep(llm: Any, prompt_lengths: list[int], output_lengths: list[int], repeats: int, warmup: int = 1,
          desc: str = "sweep", sampling: dict[str, Any] | None = None, min_repeats: int | None = None,
          reuse: pd.DataFrame | None = None, **settings: Any) -> pd.DataFrame:
    """Time prompt lengths × output lengths × repeats, one request at a time, each cold (greedy unless ``sampling``
    gives other ``SamplingParams`` fields). With ``min_repeats``, ``repeats`` is a ceiling: after ``min_repeats``
    a point is repeated only while its median TTFT or TPOT is known to worse than ``timing.PRECISION``
    (``timing.relative_ci``), so quiet points cost few requests and noisy ones get more.

    Warm-up first (untimed, every prompt length); every timed request gets a prompt cut from a different place
    in the text and the prefix cache is emptied before it, so nothing is reused. Repeats are the outer loop, so
    slow moments of a shared machine spread over all points. A request far slower than its point (a stall,
    ``kvlab.outliers``) is flagged and its point measured again; the sentence saying how many is printed.
    ``settings`` become columns of every row. ``reuse``: rows of an earlier sweep on the same engine and settings;
    the (prompt, output) points it already timed are taken from it, not timed again.
    """
    import time

    from tqdm.auto import tqdm

    from kvlab.errors import KVLabError
    from kvlab.prompts import check_fits, distinct_prompts

    if repeats < 1 or not prompt_lengths or not output_lengths:
        raise KVLabError("sweep needs at least one prompt length, one output length and repeats ≥ 1.")
    tok = llm.get_tokenizer()
    max_len = llm.llm_engine.vllm_config.model_config.max_model_len
    for p in prompt_lengths:
        check_fits(p, max(output_lengths), max_len)
    prompts = {p: distinct_prompts(tok, p, repeats + warmup, seed=p) for p in prompt_lengths}
    for p in prompt_lengths:
        for w in range(warmup):
            generate_timed(llm, prompts[p][repeats + w], min(output_lengths), **(sampling or {}))

    def timed(p: int, n: int, r: int) -> dict[str, Any]:
        llm.reset_prefix_cache()
        start = time.perf_counter()
        out = generate_timed(llm, prompts[p][r], n, **(sampling or {}))
        wall = time.perf_counter() - start  # what `vllm bench latency` times: the whole generate call
        return request_timing(out) | {"repeat": r, "generate_wall_s": wall} | settings

    def settled(p: int, n: int) -> bool:
        mine = [row for row in rows if row["point"] == (p, n)]
        return all(relative_ci([row[c] for row in mine]) <= PRECISION for c in ("ttft_s", "tpot_s") if n > 1 or c == "ttft_s")

    points = [(p, n) for p in prompt_lengths for n in output_lengths]
    kept = pd.DataFrame()
    if reuse is not None:
        kept = reuse[[pt in points for pt in zip(reuse.prompt_tokens, reuse.output_tokens, strict=True)]]
        have = set(zip(kept.prompt_tokens, kept.output_tokens, strict=True))
        points = [pt for pt in points if pt not in have]
    rows: list[dict[str, Any]] = []
    with tqdm(total=repeats * len(points), desc=desc, unit="req") as bar:
        for r in range(repeats):
            for p, n in points:
                if min_repeats is None or r < min_repeats or not settled(p, n):
                    rows.append(timed(p, n, r) | {"point": (p, n)})
                bar.update()
    if not rows:
        return kept.reset_index(drop=True)
    df = outliers.remeasure(pd.DataFrame(rows).drop(columns="point"), ["prompt_tokens", "output_tokens"], ["ttft_s", "tpot_s"],
                            lambda row: timed(int(row.prompt_tokens), int(row.output_tokens), int(row["repeat"])))
    print(outliers.report(df, ["ttft_s", "tpot_s"]))
    df = pd.concat([kept, df], ignore_index=True) if len(kept) else df
    if min_repeats is not None:
        counts = pd.Series([row["point"] for row in rows]).value_counts()
        print(f"timed requests per point: {counts.min()}–{counts.max()} (at least {min_repeats}, at most {repeats}: "
              f"a point stops once its median TTFT and TPOT are known to ±{PRECISION:.0%}, 95 % confidence).")
    return df


def crossover(medians: pd.DataFrame, output_tokens: int) -> float | None:
    """Prompt length where prefill time equals decode time for ``output_tokens`` tokens (interpolated), or None.

    ``medians`` has one row per prompt length with median ``prefill_s`` and ``tpot_s``.
    """
    m = medians.sort_values("prompt_tokens")
    diff = (m.prefill_s - (output_tokens - 1) * m.tpot_s).to_list()
    p = m.prompt_tokens.to_list()
    for i in range(len(p) - 1):
        if diff[i] == 0:
            return float(p[i])
        if diff[i] < 0 < diff[i + 1]:
            return float(p[i] + (p[i + 1] - p[i]) * (-diff[i]) / (diff[i + 1] - diff[i]))
    return None


def batch_sweep(llm: Any, batch_sizes: list[int], prompt_tokens: int, output_tokens: int, repeats: int) -> pd.DataFrame:
    """Offline batches: B distinct prompts submitted together, each B ``repeats`` times (after one warm-up batch).

    One row per request (engine timestamps) with ``batch_size``, ``repeat`` and the batch's wall time.
    """
    import time

    from tqdm.auto import tqdm

    from kvlab.prompts import distinct_prompts

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
    from kvlab.timing import summarize

    s = summarize(df, ["ttft_s", "tpot_s"], by=["batch_size"])
    per_batch = df.groupby(["batch_size", "repeat"]).agg(tokens=("output_tokens", "sum"), wall=("batch_wall_s", "first")).reset_index()
    wall = per_batch.groupby("batch_size").agg(tokens=("tokens", "median"), wall=("wall", "median"))
    s["decode_tok_s"] = s.batch_size / s.tpot_s_p50
    s["output_tok_s"] = s.batch_size.map(wall.tokens / wall.wall)
    s["preemptions"] = s.batch_size.map(df.groupby("batch_size").preemptions.sum())
    return s


def decode_by_width(factors: list[float], prompt_tokens: int = 128, output_tokens: int = 32, repeats: int = 3,
                    base: str | None = None, min_repeats: int | None = None) -> pd.DataFrame:
    """TPOT of the chosen (or ``base``) model made wider (``model.prepare_width_variant``: same layers, random weights):
    one engine per width (eager on CPU, fast to start), one cold request at a time. One row per request, with the
    width, the weight bytes and the bytes one decode step reads (weights + the KV of the average context)."""
    from tqdm.auto import tqdm

    from kvlab import roofline
    from kvlab.engine import close_engine, make_engine
    from kvlab.model import prepare_width_variant

    tables = []
    for factor in tqdm(factors, desc="model widths", unit="model"):
        path = prepare_width_variant(factor, base)
        llm = make_engine(str(path), enable_prefix_caching=False, kv_cache_gib=0.25,
                          max_model_len=max(1024, prompt_tokens + output_tokens))
        try:
            cost = roofline.engine_cost(llm)
            hidden = llm.llm_engine.vllm_config.model_config.hf_config.get_text_config().hidden_size
            df = sweep(llm, [prompt_tokens], [output_tokens], repeats, min_repeats=min_repeats, desc=f"hidden {hidden}")
        finally:
            close_engine(llm)
        tables.append(df.assign(width_factor=factor, hidden_size=hidden, weight_bytes=cost.weights_read(1),
                                step_bytes=cost.decode_step_bytes(prompt_tokens + output_tokens / 2)))
    return pd.concat(tables, ignore_index=True)
