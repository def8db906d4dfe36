"""Speculative decoding on the live engine: n-gram (prompt lookup) proposals, the engine's acceptance counters, tasks
whose output copies the input against open chat, and what verifying k + 1 tokens in one pass costs.

vLLM 0.32 (``vllm/config/speculative.py``): ``speculative_config={"method": "ngram", "num_speculative_tokens": k,
"prompt_lookup_min": a, "prompt_lookup_max": b}`` matches the **longest** suffix of the sequence (prompt and output so
far) of a…b tokens that occurred earlier, takes the **earliest** earlier occurrence of it, and proposes the tokens
that followed there — k of them, or fewer where the sequence ends sooner, and none when no suffix matches
(``vllm/v1/spec_decode/ngram_proposer.py``, ``_find_longest_matched_ngram_and_propose_tokens``; ``ngram_proposal``
here is the same rule in plain Python). The target model verifies them in one forward pass and keeps the longest
agreeing run plus one token of its own. vLLM counts acceptance only over steps that had a draft
(``Scheduler.make_spec_decoding_stats``): ``coverage`` says how many steps did. Counters (``vllm/v1/spec_decode/metrics.py``, ``SpecDecodingProm``):
``vllm:spec_decode_num_drafts``, ``…_num_draft_tokens``, ``…_num_accepted_tokens`` and
``…_num_accepted_tokens_per_pos``; acceptance rate = accepted ÷ draft tokens; mean acceptance length = 1 + accepted ÷
drafts (the 1 is the token the target model adds itself).
"""

from __future__ import annotations

import importlib
import inspect
import random
from typing import Any

import pandas as pd

from kvlab.prompts import corpus_text, prompt_of_length
from kvlab.runtime.engine import close_engine, kv_capacity, make_engine
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.templates import chat_template_ids
from kvlab.timing import generate_batch, generate_timed, p95, request_timing, stream_timing, timing_table

#: The tasks of lesson 09 and lab L09: two whose answer copies much of the prompt, one that does not.
TASKS = ("edit", "code", "chat")

#: Real code for the "code" task: functions of Python's own standard library (present wherever Python is).
CODE_SOURCES = ("textwrap.dedent", "textwrap.indent", "string.capwords", "shlex.quote", "fnmatch.translate",
                "posixpath.normpath", "difflib.get_close_matches", "json.dumps")

#: Open questions for the "chat" task: nothing in the prompt to copy.
CHAT_QUESTIONS = ("Write a short story about a lighthouse keeper who finds a message in a bottle.",
                  "Tell me about your favourite season and why you like it.",
                  "Describe a day in the life of a bee.",
                  "What would you pack for a week-long hiking trip, and why?",
                  "Invent a new board game and explain its rules.",
                  "Write a letter from a cat to its owner.",
                  "Explain why the sky changes colour at sunset, as a story for children.",
                  "Plan a dinner party for six friends.")


def ngram_config(k: int, lookup_min: int = 2, lookup_max: int = 4) -> dict[str, Any]:
    """The engine argument for n-gram speculation with ``k`` proposed tokens (empty for k = 0: speculation off)."""
    if k < 0 or not 1 <= lookup_min <= lookup_max:
        raise KVLabError(f"Speculation needs k ≥ 0 and 1 ≤ prompt_lookup_min ≤ prompt_lookup_max, got k={k}, "
                         f"lookup {lookup_min}-{lookup_max}.")
    if k == 0:
        return {}
    return {"speculative_config": {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lookup_min,
                                   "prompt_lookup_max": lookup_max}}


def counters(llm: Any) -> dict[str, Any]:
    """The engine's speculative-decoding counters so far (zeros when speculation is off): drafts, draft tokens,
    accepted tokens, accepted tokens per position."""
    out: dict[str, Any] = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_position": []}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
    for m in llm.get_metrics():
        if m.name in names:
            out[names[m.name]] += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["accepted_per_position"] = [int(v) for v in m.values]
    return out


def acceptance(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """What happened between two ``counters`` readings: acceptance rate (accepted ÷ draft tokens), mean acceptance
    length (1 + accepted ÷ drafts, vLLM's definition) and the per-position acceptance rates."""
    drafts = after["drafts"] - before["drafts"]
    drafted = after["draft_tokens"] - before["draft_tokens"]
    accepted = after["accepted_tokens"] - before["accepted_tokens"]
    per_pos = [a - b for a, b in zip(after["accepted_per_position"],
                                     before["accepted_per_position"] or [0] * len(after["accepted_per_position"]),
                                     strict=True)]
    return {"drafts": drafts, "draft_tokens": drafted, "accepted_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else float("nan"),
            "mean_acceptance_length": 1 + accepted / drafts if drafts else float("nan"),
            "acceptance_by_position": [a / drafts for a in per_pos] if drafts else []}


def coverage(drafts: int, decode_steps: int) -> float:
    """Proposal coverage: the share of decode steps that had a draft to verify. vLLM's acceptance rate counts only
    those steps (``Scheduler.make_spec_decoding_stats`` records nothing for a step without draft tokens), and the
    n-gram proposer drafts nothing when no suffix of the sequence occurred before — so acceptance alone overstates
    what speculation does for a request that rarely finds a match."""
    return drafts / decode_steps if decode_steps else float("nan")


def ngram_proposal(tokens: list[int], k: int, lookup_min: int = 2, lookup_max: int = 4) -> list[int]:
    """vLLM's n-gram rule in plain Python: the longest suffix of ``tokens`` of ``lookup_min``…``lookup_max`` tokens that
    occurred earlier, its **earliest** earlier occurrence, and the (at most) ``k`` tokens that followed it there; none
    when no suffix matches (``vllm/v1/spec_decode/ngram_proposer.py``, ``_find_longest_matched_ngram_and_propose_tokens``,
    which finds the same with a KMP scan; ``tests/test_speculative.py`` checks the two agree)."""
    total = len(tokens)
    for n in range(min(lookup_max, total - 1), lookup_min - 1, -1):
        suffix = tokens[total - n:]
        for start in range(total - n):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def _paragraphs(count: int, seed: int) -> list[str]:

    paragraphs = [p for p in corpus_text().split("\n\n") if 400 <= len(p) <= 900 and not p.startswith("#")]
    return random.Random(seed).sample(paragraphs, min(count, len(paragraphs)))


def _function_source(dotted: str) -> str:
    module, name = dotted.rsplit(".", 1)
    return inspect.getsource(getattr(importlib.import_module(module), name))


def task_messages(task: str, count: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """``count`` chat requests of a task: ``edit`` (return a paragraph with its typos fixed: the answer copies it),
    ``code`` (rename a variable in a standard-library function: the answer copies the code), ``chat`` (open questions)."""
    if task == "edit":
        texts = [f"Fix any typos in this paragraph and return the whole paragraph:\n\n{p}" for p in _paragraphs(count, seed)]
    elif task == "code":
        sources = random.Random(seed).sample(CODE_SOURCES, min(count, len(CODE_SOURCES)))
        texts = [f"Add type hints to this Python function and return the whole function:\n\n```python\n"
                 f"{_function_source(s)}```" for s in sources]
    elif task == "chat":
        texts = random.Random(seed).sample(CHAT_QUESTIONS, min(count, len(CHAT_QUESTIONS)))
    else:
        raise KVLabError(f"Unknown task {task!r}; use one of {', '.join(TASKS)}.")
    if len(texts) < count:
        raise KVLabError(f"Task {task!r} has {len(texts)} distinct requests; ask for at most {len(texts)}.")
    return [[{"role": "user", "content": t}] for t in texts]


def time_tasks(llm: Any, tasks: list[str], requests: int, max_tokens: int, repeats: int = 1, seed: int = 0,
               **settings: Any) -> pd.DataFrame:
    """Each task's requests one at a time, streamed (chunk times and sizes), greedy, stopping at end of text; per task
    the engine's acceptance counters, coverage, and tokens per decode step (1 + accepted ÷ decode steps: what one step
    yields). One row per request and repeat, ``settings`` attached (e.g. ``k=4``)."""
    from tqdm.auto import tqdm


    tok = llm.get_tokenizer()
    rows = []
    for task in tqdm(tasks, desc="tasks", leave=False):
        prompts = [chat_template_ids(tok, m) for m in task_messages(task, requests, seed)]
        for repeat in range(repeats):
            before = counters(llm)
            task_rows = [stream_timing(llm, ids, max_tokens, ignore_eos=False) | {"task": task, "request": i, "repeat": repeat}
                         for i, ids in enumerate(prompts)]
            acc = acceptance(before, counters(llm))
            steps = sum(len(r["chunk_tokens"]) - 1 for r in task_rows)  # decode steps: every chunk after the first
            rows += [r | {"task_acceptance_rate": acc["acceptance_rate"], "task_mean_acceptance_length":
                          acc["mean_acceptance_length"], "task_coverage": coverage(acc["drafts"], steps),
                          "task_tokens_per_step": 1 + acc["accepted_tokens"] / steps if steps else float("nan"),
                          **settings} for r in task_rows]
    return pd.DataFrame(rows)


def same_outputs(base: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """Token-for-token comparison of two runs' greedy outputs (matched on task, request, repeat): identical or not,
    and where they first differ (position and the two token ids)."""
    keys = ["task", "request", "repeat"]
    merged = base[keys + ["token_ids"]].merge(other[keys + ["token_ids"]], on=keys, suffixes=("_base", "_other"))
    rows = []
    for r in merged.itertuples():
        a, b = list(r.token_ids_base), list(r.token_ids_other)
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if first is None and len(a) != len(b):
            first = min(len(a), len(b))
        rows.append({"task": r.task, "request": r.request, "repeat": r.repeat, "identical": first is None,
                     "first_difference": first, "base_token": a[first] if first is not None and first < len(a) else None,
                     "other_token": b[first] if first is not None and first < len(b) else None})
    return pd.DataFrame(rows)


def identity_check(dtype: str, k: int, tasks: list[str], requests: int, max_tokens: int, model: str | None = None,
                   **engine_args: Any) -> pd.DataFrame:
    """The same greedy requests with speculation off and at ``k``, on two engines in ``dtype``: ``same_outputs`` with a
    ``dtype`` column. Speculation is exact only up to rounding (the verify pass sums in another order than single
    steps), so how often answers stay identical depends on the precision."""

    runs = []
    for spec in (0, k):
        extra = ngram_config(spec) if spec else {}
        llm = make_engine(model, dtype=dtype, enforce_eager=True, max_model_len=2048, **(engine_args | extra))
        try:
            runs.append(time_tasks(llm, tasks, requests, max_tokens))
        finally:
            close_engine(llm)
    return same_outputs(*runs).assign(dtype=dtype, k=k)


def verify_cost(llm: Any, max_new: int, repeats: int = 5, context_blocks: int = 2) -> pd.DataFrame:
    """What one forward pass over 1…``max_new`` new tokens costs after a cached context (what verifying k + 1 tokens
    costs): a prompt of ``context_blocks`` cached blocks plus n fresh tokens, one output token; the engine's prefill
    time is that pass. A **lower bound** of a real verify step, which computes logits at all n positions (prefill at
    one) and also runs the rejection sampler and the proposer. Needs prefix caching on. One row per n and repeat."""

    tok, block = llm.get_tokenizer(), kv_capacity(llm).block_size
    context = prompt_of_length(tok, context_blocks * block, offset=31_000)
    generate_timed(llm, context + prompt_of_length(tok, 1, offset=1), 1)  # caches the context's blocks
    rows = []
    for repeat in range(repeats + 1):  # the first round warms every shape up and is dropped
        for n in range(1, max_new + 1):
            fresh = prompt_of_length(tok, n, offset=40_000 + 97 * (repeat * max_new + n))
            row = request_timing(generate_timed(llm, context + fresh, 1))
            if row["cached_tokens"] != len(context):
                raise KVLabError(f"The context was not cached ({row['cached_tokens']} of {len(context)} tokens): "
                                 "start the engine with enable_prefix_caching=True.")
            if repeat:
                rows.append({"new_tokens": n, "context_tokens": len(context), "repeat": repeat, "pass_s": row["prefill_s"]})
    return pd.DataFrame(rows)


def batch_run(llm: Any, prompts: list[list[int]], batch_sizes: list[int], max_tokens: int, **settings: Any) -> pd.DataFrame:
    """The prompts in batches of each size, submitted together (greedy, exact ``max_tokens``): per-request TPOT from
    the engine's timestamps, and the batch's acceptance. Batch sizes above the prompt count reuse prompts."""

    frames = []
    for size in batch_sizes:
        batch = [prompts[i % len(prompts)] for i in range(size)]
        generate_batch(llm, batch[:1], max_tokens)  # warm this engine up
        before = counters(llm)
        outs = generate_batch(llm, batch, max_tokens)
        acc = acceptance(before, counters(llm))
        frames.append(timing_table(outs, batch_size=size, acceptance_rate=acc["acceptance_rate"], **settings))
    return pd.concat(frames, ignore_index=True)


def speedups(runs: pd.DataFrame, by: tuple[str, ...] = ("task",)) -> pd.DataFrame:
    """Per group and k: TPOT p50/p95, E2E p50, acceptance (and, from ``time_tasks``, coverage, acceptance × coverage
    and tokens per decode step), and the speed-up in TPOT p50 over k = 0 (> 1: faster)."""

    tpot = "client_tpot_s" if "client_tpot_s" in runs else "tpot_s"
    e2e = "client_e2e_s" if "client_e2e_s" in runs else "e2e_s"
    acc = "task_acceptance_rate" if "task_acceptance_rate" in runs else "acceptance_rate"
    keys = [*by, "k"]
    extra = {"coverage": ("task_coverage", "median")} if "task_coverage" in runs else {}
    if "task_tokens_per_step" in runs:
        extra["tokens_per_step"] = ("task_tokens_per_step", "median")
    table = runs.groupby(keys).agg(requests=(tpot, "size"), tpot_p50_ms=(tpot, lambda s: s.median() * 1e3),
                                   tpot_p95_ms=(tpot, lambda s: p95(s) * 1e3), e2e_p50_s=(e2e, "median"),
                                   acceptance_rate=(acc, "median"), **extra).reset_index()
    if "coverage" in table:
        table["acceptance_x_coverage"] = table.acceptance_rate * table.coverage
    base = table[table.k == 0].set_index(list(by)).tpot_p50_ms
    table["speedup"] = [base.get(tuple(r[list(by)]) if len(by) > 1 else r[by[0]], float("nan")) / r.tpot_p50_ms
                        for _, r in table.iterrows()]
    return table


def request_speedups(runs: pd.DataFrame) -> pd.DataFrame:
    """Per request and k > 0: its TPOT speed-up over the same request at k = 0 and the tokens its own decode steps
    yielded (each stream chunk after the first is one step of a request running alone) — a speed-up and its tokens
    per step from the same stream, where the task table's medians and pooled counts may pair different requests."""
    keys = ["task", "request", "repeat"]
    steps = runs.chunk_tokens.map(lambda c: len(c) - 1)
    rows = runs.assign(tokens_per_step=runs.chunk_tokens.map(lambda c: sum(c[1:])) / steps.where(steps > 0))
    off = rows[rows.k == 0].set_index(keys).client_tpot_s.rename("tpot_off_s")
    on = rows[rows.k > 0].join(off, on=keys)
    return on.assign(speedup=on.tpot_off_s / on.client_tpot_s)[[*keys, "k", "tokens_per_step", "speedup"]].reset_index(drop=True)


def tidy(runs: pd.DataFrame) -> pd.DataFrame:
    """Per-request rows without the per-chunk lists: chunks, mean tokens per chunk, ITL mean and p95 (per chunk, as
    vLLM bench records them) — what a results table keeps."""

    out = runs.drop(columns=[c for c in ("itl_s", "chunk_tokens", "token_ids") if c in runs])
    if "chunk_tokens" in runs:
        out["chunks"] = runs.chunk_tokens.map(len)
        out["tokens_per_chunk"] = runs.output_tokens / out.chunks
        out["itl_mean_s"] = runs.itl_s.map(lambda g: sum(g) / len(g) if len(g) else float("nan"))
        out["itl_p95_s"] = runs.itl_s.map(p95)
    return out
