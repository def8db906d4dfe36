"""KV cache sizing by hand: bytes per token, per sequence and in total, and a capacity planner.

The seed formula, made exact:  KV bytes = 2 (K and V) × layers × kv_heads × head_dim × tokens × bytes/element
- use the model's **KV heads**, not its query heads (GQA/MQA share one K/V head among several query heads);
- sliding-window layers (Mistral, Gemma-2's local layers) never hold more than ``window`` tokens;
- MLA (DeepSeek-V2/V3) caches one compressed latent of ``kv_lora_rank + qk_rope_head_dim`` per token and layer,
  not separate K and V;
- an engine allocates whole blocks, so a sequence's tokens round up to the block size.
This is a sketch to check against the engine's own report (``kvlab.kv_capacity``), not a substitute for it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvlab.config import REPO_ROOT
from kvlab.errors import KVLabError

GiB = 2**30
GB = 10**9

#: Bytes per element of each cache/weight dtype (names as vLLM and torch spell them).
DTYPE_BYTES = {"fp32": 4, "float32": 4, "float": 4, "fp16": 2, "float16": 2, "half": 2, "bf16": 2, "bfloat16": 2,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1, "int4": 0.5}

PRESET_DIR = REPO_ROOT / "data" / "models"


def dtype_bytes(dtype: str) -> float:
    """Bytes per element for a dtype name; unknown names are refused with the list of known ones."""
    key = str(dtype).lower().replace("torch.", "")
    if key not in DTYPE_BYTES:
        raise KVLabError(f"Unknown dtype {dtype!r}; use one of: {', '.join(sorted(DTYPE_BYTES))}.")
    return DTYPE_BYTES[key]


def _positive(name: str, value: float, allow_zero: bool = False) -> None:
    """Refuse zero or negative sizes, naming the parameter."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 or (value == 0 and not allow_zero):
        raise KVLabError(f"{name} must be a positive number, got {value!r}.")


@dataclass(frozen=True)
class KVArch:
    """The architecture facts that size a KV cache (and the weights), from a Hugging Face ``config.json``.

    attention: "MHA" (kv_heads == query heads), "GQA" (fewer), "MQA" (one) or "MLA" (latent).
    sliding_window / sliding_layers: how many layers keep only the last ``sliding_window`` tokens.
    mla_dim: elements cached per token and layer under MLA (kv_lora_rank + qk_rope_head_dim).
    """

    name: str
    layers: int
    query_heads: int
    kv_heads: int
    head_dim: int
    attention: str
    max_context: int | None = None
    sliding_window: int | None = None
    sliding_layers: int = 0
    mla_dim: int | None = None
    params: int | None = None

    @classmethod
    def from_config(cls, cfg: dict[str, Any], name: str | None = None, params: int | None = None) -> KVArch:
        """Read a config.json dict: missing head_dim → hidden/heads; missing num_key_value_heads → MHA; MQA flags."""
        cfg = cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg and "n_layer" not in cfg else cfg
        name = name or cfg.get("_name_or_path") or (cfg.get("architectures") or [cfg.get("model_type", "model")])[0]
        layers = cfg.get("num_hidden_layers", cfg.get("n_layer"))
        heads = cfg.get("num_attention_heads", cfg.get("n_head"))
        hidden = cfg.get("hidden_size", cfg.get("n_embd"))
        missing = [k for k, v in {"num_hidden_layers": layers, "num_attention_heads": heads}.items() if not v]
        if missing:
            raise KVLabError(f"Config {name!r} lacks {', '.join(missing)}, needed to size the KV cache.")
        if cfg.get("kv_lora_rank"):  # MLA: one latent (plus the decoupled RoPE key) per token and layer
            mla_dim = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim", 0))
            return cls(name, int(layers), int(heads), 1, mla_dim, "MLA", cfg.get("max_position_embeddings"),
                       mla_dim=mla_dim, params=params)
        head_dim = cfg.get("head_dim") or (hidden // heads if hidden else None)
        if not head_dim:
            raise KVLabError(f"Config {name!r} lacks head_dim and hidden_size, needed to size the KV cache.")
        if cfg.get("multi_query") and not cfg.get("new_decoder_architecture"):
            kv_heads = 1  # Falcon-7B style multi-query attention
        else:
            kv_heads = cfg.get("num_key_value_heads") or cfg.get("num_kv_heads") or heads
        kv_heads = int(kv_heads)
        attention = "MHA" if kv_heads == heads else ("MQA" if kv_heads == 1 else "GQA")
        window, sliding = _sliding_layers(cfg, int(layers))
        return cls(name, int(layers), int(heads), kv_heads, int(head_dim), attention,
                   cfg.get("max_position_embeddings") or cfg.get("seq_length"), window, sliding, params=params)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, for tables."""
        return asdict(self)


def _sliding_layers(cfg: dict[str, Any], layers: int) -> tuple[int | None, int]:
    """(window, number of sliding-window layers) from the config's own fields."""
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:
        return None, 0
    if cfg.get("layer_types"):
        return int(window), sum(t == "sliding_attention" for t in cfg["layer_types"])
    if cfg.get("model_type") == "gemma2":  # local and global attention alternate: even layers are local
        return int(window), (layers + 1) // 2
    return int(window), layers


def bytes_per_token(arch: KVArch, dtype: str = "bf16", use_query_heads: bool = False) -> float:
    """KV bytes one token costs across all layers while every layer still holds it (short contexts).

    ``use_query_heads=True`` reproduces the common mistake of sizing with query heads instead of KV heads.
    """
    per_elem = dtype_bytes(dtype)
    if arch.attention == "MLA":
        return arch.layers * arch.mla_dim * per_elem  # one latent vector, not K and V
    heads = arch.query_heads if use_query_heads else arch.kv_heads
    return 2 * arch.layers * heads * arch.head_dim * per_elem


def blocks_needed(tokens: int, block_size: int) -> int:
    """Blocks an engine allocates for ``tokens`` tokens: whole blocks only, rounded up."""
    _positive("block_size", block_size)
    _positive("tokens", tokens, allow_zero=True)
    return math.ceil(tokens / block_size)


def kv_bytes(arch: KVArch, tokens: int, dtype: str = "bf16", sequences: int = 1, block_size: int | None = None,
             use_query_heads: bool = False) -> float:
    """KV bytes for ``sequences`` sequences of ``tokens`` tokens each (windows and block rounding applied)."""
    _positive("tokens", tokens)
    _positive("sequences", sequences)
    per_layer_token = bytes_per_token(arch, dtype, use_query_heads) / arch.layers

    def rounded(n: int) -> int:
        return blocks_needed(n, block_size) * block_size if block_size else n

    full_layers = arch.layers - arch.sliding_layers
    held_full = rounded(tokens)
    held_window = rounded(min(tokens, arch.sliding_window)) if arch.sliding_layers else 0
    per_seq = per_layer_token * (full_layers * held_full + arch.sliding_layers * held_window)
    return per_seq * sequences


def weight_bytes(params: int, dtype: str = "bf16") -> float:
    """Bytes of model weights: parameters × bytes per element."""
    _positive("params", params)
    return params * dtype_bytes(dtype)


def count_parameters(cfg: dict[str, Any]) -> int:
    """Parameters of a dense decoder (Llama, Mistral, Qwen2, Gemma-2, Falcon) from its config.json.

    Embeddings (+ an untied LM head), per layer attention and MLP matrices, biases and norms.
    Mixture-of-experts configs are refused: take their count from the model card instead.
    """
    if cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts"):
        raise KVLabError("count_parameters covers dense models only; use the parameter count from the model card for MoE.")
    arch = KVArch.from_config(cfg)
    h, v, n = cfg["hidden_size"], cfg["vocab_size"], arch.layers
    q, kv = arch.query_heads * arch.head_dim, arch.kv_heads * arch.head_dim
    embed = v * h * (1 if cfg.get("tie_word_embeddings", cfg.get("model_type") in {"falcon", "gemma2"}) else 2)
    if cfg.get("model_type") == "falcon":  # fused QKV, 4h GELU MLP, LayerNorm with bias, parallel attention
        ffn = cfg.get("ffn_hidden_size") or 4 * h
        per_layer = h * (q + 2 * kv) + q * h + 2 * h * ffn + 2 * h
        return int(embed + n * per_layer + 2 * h)
    ffn = cfg["intermediate_size"]
    attn = h * q + 2 * h * kv + q * h
    if cfg.get("attention_bias") or cfg.get("model_type") == "qwen2":
        attn += q + 2 * kv  # Qwen2 has biases on q, k and v
    norms = (4 if cfg.get("model_type") == "gemma2" else 2) * h
    per_layer = attn + 3 * h * ffn + norms  # gated MLP: gate, up, down
    return int(embed + n * per_layer + h)


# ---- presets -------------------------------------------------------------------------------------------


def list_presets() -> list[str]:
    """Names of the model presets in ``data/models/``."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def load_preset(name: str) -> dict[str, Any]:
    """A preset file: ``{"name", "source", "params", "params_source", "config": {...}}``."""
    path = PRESET_DIR / f"{name}.json"
    if not path.is_file():
        raise KVLabError(f"Unknown model preset {name!r}; the presets are: {', '.join(list_presets())}.")
    return json.loads(path.read_text())


def load_arch(model: str | dict[str, Any]) -> KVArch:
    """A KVArch from a preset name, a path to a config.json (or a model folder), or a config dict."""
    if isinstance(model, dict):
        return KVArch.from_config(model)
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" and path.is_file():
        cfg = json.loads(path.read_text())
        params = count_parameters(cfg) if not cfg.get("n_routed_experts") and "hidden_size" in cfg and "vocab_size" in cfg else None
        return KVArch.from_config(cfg, name=path.parent.name, params=params)
    preset = load_preset(model)
    return KVArch.from_config(preset["config"], name=preset["name"], params=preset.get("params"))


# ---- capacity planning --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CapacityPlan:
    """How a card's memory splits between weights and KV cache, and what that KV budget holds."""

    model: str
    memory_gib: float
    utilization: float
    weight_gib: float
    kv_budget_gib: float
    kv_dtype: str
    weight_dtype: str
    block_size: int
    context: int
    bytes_per_token: float
    kv_tokens: int
    max_sequences: int
    target_sequences: int | None
    largest_context_for_target: int | None
    weights_fit: bool

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, one tidy row."""
        return asdict(self)


def plan_capacity(arch: KVArch, memory_gib: float, context: int, utilization: float = 0.9, kv_dtype: str = "bf16",
                  weight_dtype: str = "bf16", params: int | None = None, block_size: int = 16,
                  target_sequences: int | None = None, overhead_gib: float = 0.0) -> CapacityPlan:
    """Plan one card: KV budget = memory × utilization − weights − overhead; then sequences and context.

    max_sequences: full-``context`` sequences that fit at once. largest_context_for_target: the longest
    context that still lets ``target_sequences`` run together (block-rounded, capped by the model's own).
    """
    _positive("memory_gib", memory_gib)
    _positive("context", context)
    _positive("block_size", block_size)
    _positive("overhead_gib", overhead_gib, allow_zero=True)
    if not 0 < utilization <= 1:
        raise KVLabError(f"utilization must be a fraction in (0, 1], got {utilization!r}.")
    if target_sequences is not None:
        _positive("target_sequences", target_sequences)
    params = params or arch.params
    if not params:
        raise KVLabError(f"No parameter count for {arch.name!r}; pass params=... (from the model card).")
    weights = weight_bytes(params, weight_dtype)
    budget = memory_gib * GiB * utilization - weights - overhead_gib * GiB
    fits = budget > 0
    budget = max(budget, 0.0)
    per_seq = kv_bytes(arch, context, kv_dtype, block_size=block_size)
    per_token = bytes_per_token(arch, kv_dtype)
    largest = None
    if target_sequences:
        largest = largest_context(arch, budget, target_sequences, kv_dtype, block_size) if fits else 0
    return CapacityPlan(arch.name, memory_gib, utilization, weights / GiB, budget / GiB, kv_dtype, weight_dtype, block_size, context,
                        per_token, int(budget // per_token),
                        int(budget // per_seq) if fits else 0, target_sequences, largest, fits)


def largest_context(arch: KVArch, budget_bytes: float, sequences: int, kv_dtype: str = "bf16", block_size: int = 16) -> int:
    """Longest block-rounded context such that ``sequences`` sequences fit in ``budget_bytes`` (capped by the model)."""
    _positive("sequences", sequences)
    cap = arch.max_context or 10**7
    lo, hi = 0, cap // block_size  # search over whole blocks: kv_bytes grows with context
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if kv_bytes(arch, mid * block_size, kv_dtype, sequences, block_size) <= budget_bytes:
            lo = mid
        else:
            hi = mid - 1
    return min(lo * block_size, cap)


# ---- tables across models -------------------------------------------------------------------------------


def preset_table(dtype: str = "bf16", context: int = 8192) -> Any:
    """One row per preset: attention type, heads, KV bytes per token and per ``context``-token sequence, weights."""
    import pandas as pd

    rows = []
    for name in list_presets():
        arch = load_arch(name)
        rows.append({"model": name, "attention": arch.attention, "layers": arch.layers, "query_heads": arch.query_heads,
                     "kv_heads": arch.kv_heads, "head_dim": arch.head_dim,
                     "kv_bytes_per_token": bytes_per_token(arch, dtype),
                     f"kv_gib_per_{context // 1024}k_sequence": kv_bytes(arch, context, dtype) / GiB,
                     "weights_gib": weight_bytes(arch.params, dtype) / GiB, "max_context": arch.max_context})
    return pd.DataFrame(rows).sort_values("kv_bytes_per_token").reset_index(drop=True)


def capacity_grid(models: list[str], memories_gib: list[float], contexts: list[int], utilization: float = 0.9,
                  kv_dtype: str = "bf16", weight_dtype: str = "bf16", block_size: int = 16,
                  target_sequences: int | None = None) -> Any:
    """Tidy table of capacity plans: one row per (model, card memory, context)."""
    import pandas as pd

    rows = []
    for model in models:
        arch = load_arch(model)
        for mem in memories_gib:
            for ctx in contexts:
                plan = plan_capacity(arch, mem, ctx, utilization, kv_dtype, weight_dtype, block_size=block_size,
                                     target_sequences=target_sequences)
                beyond = bool(arch.max_context and ctx > arch.max_context)
                rows.append(plan.as_dict() | {"model": model, "attention": arch.attention, "beyond_model_context": beyond})
    return pd.DataFrame(rows)
