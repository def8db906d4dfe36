"""Variants of the chosen model for the lessons' engine checks: random-weight copies with fewer KV heads, a sliding
window or another MLP width (same tokenizer and layers; only the named config fields differ)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from kvlab.runtime import config
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.gguf import STAMP
from kvlab.runtime.model import load_config, resolve_model
from kvlab.runtime.randomweights import save_random_model
from kvlab.sizing import parameter_counts


def prepare_variant(label: str, base: str | None = None, **overrides: object) -> Path:
    """A random-weight copy of a model (the chosen one by default) with some config fields changed — KV heads, a
    sliding window —, made once and cached. Same layers, widths and tokenizer: only what ``overrides`` names differs,
    so the engine's KV arithmetic can be checked on layouts the model itself does not have. Its text is gibberish; its
    shapes and timings are real."""
    base_path = resolve_model(base)
    key = hashlib.sha256(json.dumps([base_path, overrides], sort_keys=True, default=str).encode()).hexdigest()[:8]
    target = config.cache_dir() / "models" / f"{Path(base_path).name}-{label}-{key}-random"
    if (target / STAMP).is_file():
        return target

    def make_config() -> Any:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(base_path)
        for name, value in overrides.items():
            setattr(cfg.get_text_config(), name, value)
        return cfg

    return save_random_model(target, make_config, base_path, {"base": base_path, "overrides": overrides})


def prepare_kv_variant(kv_heads: int, base: str | None = None) -> Path:
    """The chosen (or ``base``) model with ``kv_heads`` KV heads — its query-head count for MHA, 1 for MQA."""
    cfg = load_config(base)
    heads = cfg.get_text_config().num_attention_heads
    if not isinstance(kv_heads, int) or isinstance(kv_heads, bool) or kv_heads < 1 or heads % kv_heads:
        raise KVLabError(f"kv_heads={kv_heads!r} must divide the {heads} query heads (e.g. {heads} for MHA, 1 for MQA).")
    if not kv_heads_configurable(base):
        raise KVLabError(f"{(cfg.architectures or [cfg.model_type])[0]} has no setting for fewer KV heads (one K and V "
                         "head per query head in every layer), so a copy with other KV heads cannot be built from it.")
    return prepare_variant(f"kv{kv_heads}", base, num_key_value_heads=kv_heads)


def prepare_sliding_variant(window: int, base: str | None = None) -> Path:
    """The chosen (or ``base``) model with every layer a sliding-window layer of ``window`` tokens (Mistral-style).
    Set through the fields vLLM reads: ``layer_types`` (Llama-family models), ``sliding_window`` with
    ``use_sliding_window`` and ``max_window_layers`` (Qwen2-family models)."""
    if not isinstance(window, int) or isinstance(window, bool) or window < 2:
        raise KVLabError(f"window={window!r} must be a whole number of tokens, at least 2.")
    layers = load_config(base).get_text_config().num_hidden_layers
    return prepare_variant(f"sw{window}", base, sliding_window=window, use_sliding_window=True, max_window_layers=0,
                           layer_types=["sliding_attention"] * layers)


#: Config fields that set the MLP's width, by family: Llama/Qwen/Mistral/Gemma, OPT, GPT-2/GPT-J (None there means
#: 4 × hidden, which follows the hidden size by itself), Falcon.
MLP_WIDTH_FIELDS = ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")


#: Fields that must stay equal to the hidden size when it changes (OPT projects embeddings of another width in and out).
HIDDEN_TWIN_FIELDS = ("word_embed_proj_dim",)


def width_overrides(factor: float, base: str | None = None) -> dict[str, int]:
    """Config fields that make the chosen (or ``base``) model about ``factor`` × as wide: hidden size, query and KV heads
    (head size and the query-to-KV ratio kept) and MLP width scaled alike, layers unchanged. Widths are whole multiples
    of one KV group (head_dim × query heads per KV head) — of one query head for a model with one KV head (MQA stays
    MQA: its only group would not scale); ``factor`` 1 gives the model's own widths. Every MLP width
    field the config has is scaled (``MLP_WIDTH_FIELDS``); an MLP set as a ratio of the width (GPT-2's ``n_inner``
    None, MPT's ``expansion_ratio``) follows by itself. What a copy reads per step is counted from the copy built
    (``roofline.engine_cost``), never assumed from ``factor``."""
    cfg = load_config(base).get_text_config()
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0:
        raise KVLabError(f"width factor {factor!r} must be a positive number (1 = the model's own width).")
    if kv == 1:  # one KV head: widen by query heads
        groups, query = 1, max(1, round(heads * factor))
    else:
        groups = max(1, round(kv * factor))  # KV heads; each carries heads // kv query heads
        query = groups * (heads // kv)
    scale = query / heads
    hidden = query * head_dim if heads * head_dim == cfg.hidden_size else round(cfg.hidden_size * scale)
    fields = {"hidden_size": hidden, "num_attention_heads": query, "num_key_value_heads": groups, "head_dim": head_dim}
    mlp = {name: round(getattr(cfg, name) * scale) for name in MLP_WIDTH_FIELDS if isinstance(getattr(cfg, name, None), int)}
    twins = {name: hidden for name in HIDDEN_TWIN_FIELDS if getattr(cfg, name, None) == cfg.hidden_size}
    return fields | mlp | twins


def kv_heads_configurable(base: str | None = None) -> bool:
    """Whether the chosen (or ``base``) model's architecture reads ``num_key_value_heads``: its K and V projections
    shrink when the field is 1 (counted on the meta device, ``sizing.parameter_counts``). MHA-only designs (OPT,
    GPT-2, GPT-NeoX) ignore the field, so copies with other KV heads cannot be built from them."""
    cfg = load_config(base)
    counts = []
    for kv_heads in (cfg.get_text_config().num_attention_heads, 1):
        variant = cfg.to_dict()
        (variant.get("text_config") or variant)["num_key_value_heads"] = kv_heads
        counts.append(parameter_counts(variant).total)
    return counts[0] != counts[1]


def prepare_width_variant(factor: float, base: str | None = None) -> Path:
    """The chosen (or ``base``) model made about ``factor`` × as wide (``width_overrides``): random weights, same layer
    count, so a decode step's fixed costs stay and only the bytes it reads change. ``factor`` 1 is the model itself."""
    fields = width_overrides(factor, base)
    if factor == 1:
        return Path(resolve_model(base))
    return prepare_variant(f"w{fields['hidden_size']}", base, **fields)
