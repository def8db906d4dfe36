"""Which model runs: a name turned into what vLLM loads (the course models made locally, a folder or a Hugging Face
id, set by ``KVLAB_MODEL``), its config, and the context a lesson can start it with."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kvlab.runtime import config
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.gguf import prepare_default_model
from kvlab.runtime.randomweights import (
    BASE_MODEL,
    HYBRID_MODEL,
    SECOND_MODEL,
    prepare_base_model,
    prepare_hybrid_model,
    prepare_second_model,
)

_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model(name: str | None = None) -> str:
    """Turn a model name into what vLLM loads: the prepared default folder, a local folder or an HF id."""
    name = (name or config.model_name()).strip()
    if name.lower() in {config.DEFAULT_MODEL.lower(), "default"}:
        return str(prepare_default_model())
    if name.lower() == SECOND_MODEL.lower():
        return str(prepare_second_model())
    if name.lower() == BASE_MODEL.lower():
        return str(prepare_base_model())
    if name.lower() == HYBRID_MODEL.lower():
        return str(prepare_hybrid_model())
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise KVLabError(f"Model folder {path} has no config.json; point KVLAB_MODEL at a Hugging Face model folder.")
        return str(path.resolve())
    if _HF_ID.match(name):
        return name
    raise KVLabError(
        f"Unknown model {name!r}: it is not one of the course's models ({config.DEFAULT_MODEL}, {SECOND_MODEL}, "
        f"{BASE_MODEL}, {HYBRID_MODEL}), not an existing folder and not a Hugging Face id like 'org/name'; set "
        "KVLAB_MODEL (or pass model=...) to one of those."
    )


def load_config(model: str | None = None) -> Any:
    """The transformers config of a model (default: the chosen one), resolved the way the engine resolves it."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(resolve_model(model))


def max_context(model: str | None = None) -> int | None:
    """The model's context length (tokens) from its config, before any engine starts; None when it does not say."""
    cfg = load_config(model)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return getattr(text, "max_position_embeddings", None) or getattr(text, "seq_length", None)


def fit_context(wanted: int, model: str | None = None) -> int:
    """The context (tokens) to start an engine with when a lesson wants ``wanted``: that, or the chosen model's own
    context where it is shorter (GPT-2: 1,024; OPT: 2,048), so the lesson sizes its prompts to fit instead of failing."""
    limit = max_context(model)
    return min(wanted, int(limit)) if limit else wanted
