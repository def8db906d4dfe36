"""Prompts of an exact token length, cut from real text shipped in ``data/text/`` (never one word repeated).

Prompts are token-id lists (vLLM's ``TokensPrompt``), so their length is exact for the model's own tokenizer.
Different offsets into the text give different prompts of the same length, so no two requests share a prefix
unless we build them to (``shared_prefix_prompts``, for the prefix-caching lessons).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from kvlab.runtime.config import REPO_ROOT
from kvlab.runtime.errors import KVLabError

TEXT_FILE = REPO_ROOT / "data" / "text" / "python_reference.txt"


def corpus_text() -> str:
    """The prompt material: prose paragraphs (header comment lines removed)."""
    lines = TEXT_FILE.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if not line.startswith("#")).strip()


@lru_cache(maxsize=8)
def _corpus_ids(tokenizer_key: str, tokenizer: Any) -> tuple[int, ...]:
    return tuple(tokenizer.encode(corpus_text(), add_special_tokens=False))


def corpus_tokens(tokenizer: Any) -> tuple[int, ...]:
    """The whole text as token ids for this tokenizer (computed once per tokenizer)."""
    key = getattr(tokenizer, "name_or_path", "") + str(len(tokenizer))
    return _corpus_ids(key, tokenizer)


def prompt_of_length(tokenizer: Any, n_tokens: int, offset: int = 0) -> list[int]:
    """Exactly ``n_tokens`` token ids of real text starting ``offset`` tokens in (wrapping around the text)."""
    if not isinstance(n_tokens, int) or n_tokens < 1:
        raise KVLabError(f"n_tokens must be a positive whole number of tokens, got {n_tokens!r}.")
    ids = corpus_tokens(tokenizer)
    start = offset % len(ids)
    out: list[int] = []
    while len(out) < n_tokens:
        out.extend(ids[start : start + n_tokens - len(out)])
        start = 0
    return out


def distinct_prompts(tokenizer: Any, n_tokens: int, count: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of ``n_tokens`` tokens each, cut from different places so they share no prefix."""
    total = len(corpus_tokens(tokenizer))
    step = max(total // max(count, 1), 1)
    return [prompt_of_length(tokenizer, n_tokens, offset=(seed * 7919 + i * step) % total) for i in range(count)]


def shared_prefix_prompts(tokenizer: Any, prefix_tokens: int, suffix_tokens: int, count: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts that share the same first ``prefix_tokens`` tokens and differ in the rest."""
    prefix = prompt_of_length(tokenizer, prefix_tokens, offset=0) if prefix_tokens else []
    suffixes = distinct_prompts(tokenizer, suffix_tokens, count, seed=seed + 1) if suffix_tokens else [[] for _ in range(count)]
    return [prefix + s for s in suffixes]


def check_fits(prompt_tokens: int, output_tokens: int, max_model_len: int) -> None:
    """Refuse a request longer than the engine's context with one sentence saying how to fix it."""
    if prompt_tokens + output_tokens > max_model_len:
        raise KVLabError(
            f"A prompt of {prompt_tokens:,} tokens plus {output_tokens:,} output tokens exceeds the engine's context of "
            f"{max_model_len:,} tokens; use a shorter prompt or fewer output tokens, or start the engine with a larger max_model_len."
        )
