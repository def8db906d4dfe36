"""Lab L04 · chunked prefill: decoders' stalls while a long prompt is prefilled, per token budget."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvlab.chunked_prefill import LONG_PROMPT_OUTPUT_TOKENS
from kvlab.course.exercises import Question, Tables
from kvlab.course.labs import Lab, Param, first, model_param, output_param

NAME = "L04_chunked_prefill"


def smallest_stall(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    best = r.loc[r.decoder_itl_max_ms.idxmin()]
    return str(best.config), ", ".join(f"{c}: {v:.0f} ms" for c, v in zip(r.config, r.decoder_itl_max_ms, strict=True))


def cost(t: Tables) -> tuple[Any, str]:
    r = t["results"].set_index("config")
    off = r.long_ttft_ms["chunked off"]
    chunked = r.drop(index="chunked off")
    smallest = chunked.max_num_batched_tokens.idxmin()
    ratio = chunked.long_ttft_ms[smallest] / off
    return ("yes" if ratio > 1.1 else "no"), (
        f"long prompt TTFT {off:.0f} ms with chunked prefill off vs {chunked.long_ttft_ms[smallest]:.0f} ms with {smallest} "
        f"(×{ratio:.2f})")


def compare(t: pd.DataFrame) -> Any:
    """Decoders' worst stall against the long prompt's TTFT, one point per run and configuration."""
    import plotly.express as px

    return px.scatter(t, x="decoder_itl_max_ms", y="long_ttft_ms", color="run", text="config",
                      title="L04 · decoders' worst stall vs the long prompt's TTFT",
                      labels={"decoder_itl_max_ms": "decoders' worst gap (ms)", "long_ttft_ms": "long prompt TTFT (ms)"})


LAB = Lab(
    name=NAME,
    title="Chunked prefill",
    about="decoders' stalls while a long prompt is prefilled, per token budget",
    params=(
        model_param(),
        Param("decoders", 3, "chat requests streaming from the start", positive=True),
        Param("decoder_prompt_tokens", 64, "prompt tokens of each decoder", positive=True),
        Param("decoder_output_tokens", 48, "output tokens of each decoder", positive=True),
        Param("long_prompt_tokens", 2048, "tokens of the long prompt", positive=True),
        Param("long_arrival_s", 0.5, "when the long prompt arrives, seconds after the start", between=(0.0, 3600.0)),
        Param("budgets", [256, 1024], "max_num_batched_tokens values to try with chunked prefill on (tokens per step)",
              positive=True, quick=first(2)),
        output_param(NAME),
    ),
    questions=(
        Question("L04.1", "Which configuration gave the decoders the smallest worst gap? (its name in the `config` column)",
                 smallest_stall),
        Question("L04.2", "Did the smallest chunk budget delay the long prompt's TTFT by more than 10 % against chunked "
                          "prefill off? (yes/no)", cost, ("yes", "no")),
    ),
    compare=compare,
    longest=lambda p: max((p["long_prompt_tokens"] + LONG_PROMPT_OUTPUT_TOKENS,
                           f"long_prompt_tokens + its {LONG_PROMPT_OUTPUT_TOKENS} output tokens"),
                          (p["decoder_prompt_tokens"] + p["decoder_output_tokens"], "decoder_prompt_tokens + decoder_output_tokens")),
)
