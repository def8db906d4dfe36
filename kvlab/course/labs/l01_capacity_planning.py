"""Lab L01 · capacity planning: how many sequences fit on a card, from the model's config alone (no engine)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from kvlab.course.exercises import Question, Tables
from kvlab.course.labs import Lab, Param, output_param
from kvlab.sizing import DTYPE_BYTES

NAME = "L01_capacity_planning"


def most_sequences(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    row = r[(r.memory_gib == r.memory_gib.max()) & (r.context == r.context.max())].iloc[0]
    return int(row.max_sequences), (f"{row.memory_gib:g} GiB at {int(row.context):,} tokens: {int(row.kv_tokens):,} KV tokens "
                                    f"÷ {int(row.context):,} per sequence → {int(row.max_sequences)} sequences")


def superlinear(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    ctx = r.context.min()
    small = r[(r.context == ctx) & (r.memory_gib == r.memory_gib.min())].iloc[0]
    big = r[(r.context == ctx) & (r.memory_gib == r.memory_gib.max())].iloc[0]
    mem_ratio = big.memory_gib / small.memory_gib
    seq_ratio = big.max_sequences / small.max_sequences if small.max_sequences else math.inf
    return ("yes" if seq_ratio > mem_ratio else "no"), (
        f"memory ×{mem_ratio:.2f}, sequences ×{seq_ratio:.2f} ({int(small.max_sequences)} → {int(big.max_sequences)}) at "
        f"{int(ctx):,} tokens: the weights take the same GiB on both cards, so all the extra memory goes to the KV cache")


def compare(t: pd.DataFrame) -> Any:
    """Sequences that fit vs context, one line per run and card."""
    import plotly.express as px

    t = t.assign(run=t.run + " · " + t.memory_gib.astype(str) + " GiB")
    return px.line(t, x="context", y="max_sequences", color="run", markers=True, log_x=True, log_y=True,
                   title="L01 · sequences that fit vs context",
                   labels={"context": "context (tokens, log)", "max_sequences": "sequences (log)"})


LAB = Lab(
    name=NAME,
    title="Capacity planning",
    about="how many sequences fit on a card, from the model's config alone (no engine)",
    params=(
        Param("model", "Llama-3.1-8B", "preset name in data/models/, or a path to a config.json or a model folder"),
        Param("memory_gib", [80.0, 141.0], "accelerator memory per card, GiB", positive=True),
        Param("utilization", 0.92, "fraction of memory the engine may use (vLLM's gpu_memory_utilization; 0.92 is vLLM's default), 0-1",
              between=(0.01, 1.0)),
        Param("overhead_gib", 1.5, "memory a running engine needs besides weights and KV (activations, CUDA graphs), GiB",
              between=(0.0, 1024.0)),
        Param("context_lengths", [4096, 8192, 32768, 131072], "tokens per sequence", positive=True),
        Param("kv_dtype", "bf16", "KV cache element type: fp32, fp16, bf16 or fp8", choices=tuple(DTYPE_BYTES)),
        Param("weight_dtype", "bf16", "weight element type: fp32, fp16, bf16, fp8 or int4", choices=tuple(DTYPE_BYTES)),
        Param("block_size", 16, "tokens per KV block (vLLM: 16 on GPU, 128 on CPU)", positive=True),
        Param("target_sequences", 16, "concurrent sequences to find the largest context for", positive=True),
        output_param(NAME),
    ),
    questions=(
        Question("L01.1", "How many sequences fit on the largest card at the longest context?", most_sequences),
        Question("L01.2", "From the smallest to the largest card (shortest context), do the sequences that fit grow by more "
                          "than the memory does? (yes/no)", superlinear, ("yes", "no")),
    ),
    compare=compare,
)
