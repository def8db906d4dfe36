"""KV cache sizing by hand: bytes per token, per sequence and in total, what vLLM reserves, and a capacity planner.

The seed formula, made exact:  KV bytes = 2 (K and V) × layers × kv_heads × head_dim × tokens × bytes/element
- use the model's **KV heads**, not its query heads (GQA/MQA share one K/V head among several query heads);
- configs are read the way transformers reads them (``AutoConfig``), so fields a config.json omits take the model
  class's defaults (Gemma-3's text config omits its head counts), and each layer's kind comes from the layer list
  transformers computes (``layer_types``: Gemma-2/3's local:global pattern, gpt-oss, Qwen2's windowed layers);
- a sliding-window layer only *needs* the last ``window`` tokens (the ideal), but vLLM 0.32 reserves more: per
  request ``min(window − 1 + tokens in flight, max_model_len)`` tokens plus one block, where tokens in flight are
  ``max_num_batched_tokens`` × concurrent batches (``vllm/v1/kv_cache_interface.py``: ``SlidingWindowSpec.
  max_admission_blocks_per_request``; ``vllm/config/vllm.py``: ``max_in_flight_tokens``). ``vllm_kv_plan`` gives
  the engine's own arithmetic, layer groups included (``vllm/v1/core/kv_cache_utils.py``);
- MLA (DeepSeek-V2/V3) caches one compressed latent of ``kv_lora_rank + qk_rope_head_dim`` per token and layer,
  not separate K and V;
- an engine allocates whole blocks, so a sequence's tokens round up to the block size.
Parameters are counted exactly for any architecture transformers knows, by building the model on the meta device (no
weights); mixture-of-experts models also get their *active* parameters per token.
This is a sketch to check against the engine's own report (``kvlab.kv_capacity``), not a substitute for it.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from kvlab.runtime.config import REPO_ROOT
from kvlab.runtime.engine import close_engine, engine_dtype, kv_capacity, make_engine
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.model import load_config, resolve_model

GiB = 2**30
GB = 10**9

#: Bytes per element of each cache/weight dtype (names as vLLM and torch spell them).
DTYPE_BYTES = {"fp32": 4, "float32": 4, "float": 4, "fp16": 2, "float16": 2, "half": 2, "bf16": 2, "bfloat16": 2,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1, "int4": 0.5}

#: vLLM 0.32's default share of accelerator memory it may use (``gpu_memory_utilization``, vllm/config/cache.py).
VLLM_MEMORY_UTILIZATION = 0.92

#: Memory a running engine needs besides weights and KV cache, per device, in GiB: activations of one step of
#: ``max_num_batched_tokens`` tokens, CUDA graphs and non-torch allocations (NCCL, cuBLAS workspaces). A rough
#: default for planning; the engine measures its own at start-up (its log: "Available KV cache memory").
DEFAULT_OVERHEAD_GIB = {"gpu": 1.5, "cpu": 0.0}

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


def hf_config(cfg: Any) -> Any:
    """A transformers config with the model class's defaults filled in, from a config dict (``model_type`` picks the
    class; without one, or for a type this transformers does not know, the dict is read as it is) or a config."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(cfg, PretrainedConfig):
        return cfg
    cfg = dict(cfg)
    model_type = cfg.pop("model_type", None)
    if model_type:
        try:
            return AutoConfig.for_model(model_type, **cfg)
        except (KeyError, ValueError):
            pass
    return PretrainedConfig(**cfg)


def _text(cfg: Any) -> Any:
    """The language model's config (multimodal configs nest it as ``text_config``)."""
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


#: transformers' layer kinds (``layer_types``) by what a layer keeps per sequence: a K and V entry per token, only the
#: last ``sliding_window`` tokens' entries, a fixed-size state (linear attention, Mamba), both (Falcon-H1's parallel
#: attention + Mamba layers), or nothing (Nemotron-H's MLP and MoE layers).
LAYER_KINDS = {"full_attention": "full", "attention": "full", "sliding_attention": "sliding", "chunked_attention": "sliding",
               "linear_attention": "state", "mamba": "state", "hybrid": "hybrid", "mlp": "none", "moe": "none"}


def layer_kinds(cfg: Any) -> list[str]:
    """Each layer's kind: "full", "sliding" (keeps its window), "state" (a fixed-size state per sequence: linear
    attention, Mamba), "hybrid" (attention and a state) or "none" — transformers' own ``layer_types`` where the config
    has them (Gemma-2/3, gpt-oss, Qwen2, Qwen3-Next, Jamba, Granite-4, Falcon-H1, Nemotron-H…), else every layer slides
    when a window is set and in use (Mistral v0.1)."""
    tc = _text(hf_config(cfg))
    layers = int(getattr(tc, "num_hidden_layers", 0) or getattr(tc, "n_layer", 0) or 0)
    window = getattr(tc, "sliding_window", None)
    types = getattr(tc, "layer_types", None)
    if types:
        kinds = [LAYER_KINDS.get(t, "full") for t in types[:layers]]
        return [k if k != "sliding" or window else "full" for k in kinds]
    if window and getattr(tc, "use_sliding_window", True) is not False:
        return ["sliding"] * layers
    return ["full"] * layers


def state_elements(cfg: Any) -> int:
    """Elements one state layer keeps per sequence, whatever its length, as vLLM 0.32 allocates them
    (``vllm/model_executor/layers/mamba/mamba_utils.py``, ``MambaStateShapeCalculator``): a convolution state of
    ``conv kernel − 1`` positions plus a recurrent state — Gated DeltaNet (Qwen3-Next): ``v_heads × v_dim × k_dim``;
    Mamba-2 (Granite-4, Falcon-H1, Nemotron-H): ``heads × head_dim × d_state``; Mamba-1 (Jamba):
    ``intermediate × d_state``. 0 for a model without such layers."""
    tc = _text(hf_config(cfg))

    def get(*names: str) -> Any:
        return next((getattr(tc, n) for n in names if getattr(tc, n, None) is not None), None)

    if get("linear_num_value_heads"):  # Gated DeltaNet
        nk, nv = tc.linear_num_key_heads, tc.linear_num_value_heads
        dk, dv, kernel = tc.linear_key_head_dim, tc.linear_value_head_dim, tc.linear_conv_kernel_dim
        return (kernel - 1) * (2 * nk * dk + nv * dv) + nv * dv * dk
    heads = get("mamba_n_heads", "mamba_num_heads")
    d_state, d_conv = get("mamba_d_state", "ssm_state_size"), get("mamba_d_conv", "conv_kernel")
    if heads:  # Mamba-2
        head_dim = get("mamba_d_head", "mamba_head_dim")
        inner = get("mamba_d_ssm") or (heads * head_dim if get("mamba_num_heads") else int(tc.mamba_expand * tc.hidden_size))
        groups = get("mamba_n_groups", "n_groups") or 1
        return (d_conv - 1) * (inner + 2 * groups * d_state) + heads * head_dim * d_state
    if d_state and get("mamba_expand"):  # Mamba-1
        inner = int(tc.mamba_expand * tc.hidden_size)
        return (d_conv - 1) * inner + inner * d_state
    return 0


@dataclass(frozen=True)
class KVArch:
    """The architecture facts that size a KV cache (and the weights), from a Hugging Face config.

    attention: "MHA" (kv_heads == query heads), "GQA" (fewer), "MQA" (one) or "MLA" (latent).
    layers: the layers that keep K and V per token (all of them but in a hybrid model); total_layers: all of them.
    sliding_window / sliding_layers: how many layers keep only the last ``sliding_window`` tokens.
    state_layers / state_elements: layers that keep a fixed-size state per sequence instead (linear attention, Mamba:
    Qwen3-Next, Jamba, Granite-4, Falcon-H1, Nemotron-H), and the elements of one layer's state.
    mla_dim: elements cached per token and layer under MLA (kv_lora_rank + qk_rope_head_dim).
    params / active_params: all weights, and those one token uses (they differ for mixture-of-experts models).
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
    active_params: int | None = None
    state_layers: int = 0
    state_elements: int = 0
    total_layers: int | None = None

    @classmethod
    def from_config(cls, cfg: Any, name: str | None = None, params: int | None = None,
                    active_params: int | None = None) -> KVArch:
        """Read a config (a config.json dict or a transformers config), defaults filled the way transformers fills
        them: head_dim → hidden/heads; no KV head count → MHA; Falcon's multi_query → one KV head."""
        raw = cfg if isinstance(cfg, dict) else {}
        tc = _text(hf_config(cfg))
        name = name or raw.get("_name_or_path") or getattr(tc, "_name_or_path", "") or \
            (raw.get("architectures") or getattr(tc, "architectures", None) or [getattr(tc, "model_type", "") or "model"])[0]
        layers = getattr(tc, "num_hidden_layers", None) or getattr(tc, "n_layer", None)
        heads = getattr(tc, "num_attention_heads", None) or getattr(tc, "n_head", None)
        hidden = getattr(tc, "hidden_size", None) or getattr(tc, "n_embd", None)
        missing = [k for k, v in {"num_hidden_layers": layers, "num_attention_heads": heads}.items() if not v]
        if missing:
            raise KVLabError(f"Config {name!r} lacks {', '.join(missing)}, needed to size the KV cache.")
        max_context = getattr(tc, "max_position_embeddings", None) or getattr(tc, "seq_length", None)
        if getattr(tc, "kv_lora_rank", None):  # MLA: one latent (plus the decoupled RoPE key) per token and layer
            mla_dim = int(tc.kv_lora_rank) + int(getattr(tc, "qk_rope_head_dim", 0) or 0)
            return cls(name, int(layers), int(heads), 1, mla_dim, "MLA", max_context, mla_dim=mla_dim, params=params,
                       active_params=active_params)
        head_dim = getattr(tc, "head_dim", None) or (hidden // heads if hidden else None)
        if not head_dim:
            raise KVLabError(f"Config {name!r} lacks head_dim and hidden_size, needed to size the KV cache.")
        if getattr(tc, "multi_query", False) and not getattr(tc, "new_decoder_architecture", False):
            kv_heads = 1  # Falcon-7B style multi-query attention
        else:
            kv_heads = getattr(tc, "num_key_value_heads", None) or getattr(tc, "num_kv_heads", None) or heads
        kv_heads = int(kv_heads)
        attention = "MHA" if kv_heads == heads else ("MQA" if kv_heads == 1 else "GQA")
        kinds = layer_kinds(tc)
        sliding = kinds.count("sliding")
        window = int(tc.sliding_window) if sliding else None
        kv_layers = sum(k in ("full", "sliding", "hybrid") for k in kinds)
        state_layers = sum(k in ("state", "hybrid") for k in kinds)
        return cls(name, kv_layers, int(heads), kv_heads, int(head_dim), attention, max_context, window, sliding,
                   params=params, active_params=active_params, state_layers=state_layers,
                   state_elements=state_elements(tc) if state_layers else 0, total_layers=int(layers))

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, for tables."""
        return asdict(self)


def bytes_per_token(arch: KVArch, dtype: str = "bf16", use_query_heads: bool = False) -> float:
    """KV bytes one token costs across all layers while every layer still holds it (short contexts).

    ``use_query_heads=True`` reproduces the common mistake of sizing with query heads instead of KV heads.
    """
    per_elem = dtype_bytes(dtype)
    if arch.attention == "MLA":
        return arch.layers * arch.mla_dim * per_elem  # one latent vector, not K and V
    heads = arch.query_heads if use_query_heads else arch.kv_heads
    return 2 * arch.layers * heads * arch.head_dim * per_elem


def state_bytes(arch: KVArch, dtype: str = "bf16") -> float:
    """Bytes of fixed-size state one sequence keeps in a hybrid model's linear-attention or Mamba layers, whatever its
    length, all in ``dtype`` (vLLM's default ``mamba_cache_dtype``/``mamba_ssm_cache_dtype`` "auto": the model dtype;
    on a CPU with AVX-512 BF16, vLLM 0.32 keeps the recurrent state of Mamba layers in float32,
    ``vllm/platforms/cpu.py``)."""
    return arch.state_layers * arch.state_elements * dtype_bytes(dtype)


def blocks_needed(tokens: int, block_size: int) -> int:
    """Blocks an engine allocates for ``tokens`` tokens: whole blocks only, rounded up."""
    _positive("block_size", block_size)
    _positive("tokens", tokens, allow_zero=True)
    return math.ceil(tokens / block_size)


def sequences_that_fit(num_blocks: int, block_size: int, tokens_per_sequence: int) -> int:
    """Sequences of ``tokens_per_sequence`` tokens that fit in ``num_blocks`` blocks at once: each one rounds up to
    whole blocks (a 160-token sequence takes 256 tokens of KV with 128-token blocks)."""
    return int(num_blocks // blocks_needed(tokens_per_sequence, block_size))


def kv_bytes(arch: KVArch, tokens: int, dtype: str = "bf16", sequences: int = 1, block_size: int | None = None,
             use_query_heads: bool = False) -> float:
    """KV bytes for ``sequences`` sequences of ``tokens`` tokens each — the ideal: a sliding layer holds only its
    window (what vLLM actually reserves for one is ``vllm_reserved_tokens``), a state layer its fixed-size state
    (``state_bytes``); block rounding applied if given."""
    _positive("tokens", tokens)
    _positive("sequences", sequences)
    per_layer_token = bytes_per_token(arch, dtype, use_query_heads) / arch.layers if arch.layers else 0.0

    def rounded(n: int) -> int:
        return blocks_needed(n, block_size) * block_size if block_size else n

    full_layers = arch.layers - arch.sliding_layers
    held_full = rounded(tokens)
    held_window = rounded(min(tokens, arch.sliding_window)) if arch.sliding_layers else 0
    per_seq = per_layer_token * (full_layers * held_full + arch.sliding_layers * held_window)
    return (per_seq + state_bytes(arch, dtype)) * sequences


def sliding_window_blocks(window: int, max_model_len: int, block_size: int, max_num_batched_tokens: int,
                          concurrent_batches: int = 1) -> int:
    """Blocks vLLM 0.32 reserves per request for one sliding-window layer group:
    ``cdiv(min(window − 1 + in-flight tokens, max_model_len), block_size) + 1`` — the window's last ``window − 1``
    tokens, the tokens of the batches not yet settled (``max_num_batched_tokens`` × concurrent batches: 1 on CPU, 2
    with async scheduling on GPU), and one block because the window need not start on a block boundary."""
    for name, value in {"window": window, "max_model_len": max_model_len, "block_size": block_size,
                        "max_num_batched_tokens": max_num_batched_tokens, "concurrent_batches": concurrent_batches}.items():
        _positive(name, value)
    in_flight = max_num_batched_tokens * concurrent_batches
    return math.ceil(min(window - 1 + in_flight, max_model_len) / block_size) + 1


@dataclass(frozen=True)
class VLLMPlan:
    """vLLM's own arithmetic for a KV budget: layer groups, blocks, blocks one request at ``max_model_len`` takes,
    and the concurrency and token capacity it reports (``cache_config.num_gpu_blocks``, ``kv_cache_max_concurrency``,
    ``kv_cache_size_tokens``)."""

    groups_full: int
    groups_sliding: int
    group_size: int
    num_blocks: int
    blocks_per_request: int
    max_concurrency: float
    tokens: int
    ideal_blocks_per_request: int  # if a sliding layer held only its window (rounded to blocks, +1 for alignment)
    groups_state: int = 0  # groups of linear-attention / Mamba layers (hybrid models)
    block_size: int = 16  # tokens per block: the one asked for, raised for a hybrid model (see ``vllm_kv_plan``)
    state_page_bytes: int = 0  # one state layer's state, before vLLM pads it to a whole page

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def vllm_kv_plan(arch: KVArch, budget_bytes: float, max_model_len: int, dtype: str = "bf16", block_size: int = 16,
                 max_num_batched_tokens: int = 8192, concurrent_batches: int = 1, prefix_caching: bool = True) -> VLLMPlan:
    """The KV plan vLLM 0.32 makes for ``budget_bytes`` (vllm/v1/core/kv_cache_utils.py): layers of one kind are split
    into groups of equal size (the size of the smallest kind, or of the largest when that is < 1.5× the smallest;
    the last group padded), one block holds ``block_size`` tokens of every layer of a group, so
    ``num_blocks = budget ÷ (group size × per-layer page)``; a request at ``max_model_len`` takes ``cdiv(max_model_len,
    block_size)`` blocks per full-attention group and ``sliding_window_blocks`` per sliding group; max concurrency =
    blocks ÷ blocks per request; capacity in tokens = concurrency × ``max_model_len``.
    Hybrid models (linear-attention or Mamba layers): every layer gets one page size. vLLM raises the attention block
    size to the smallest multiple of ``block_size`` whose one-layer page holds one layer's state, and pads the state
    to that page (``vllm/platforms/interface.py``, ``_align_hybrid_block_size``); a request then takes one page per
    state group, two with prefix caching on (``mamba_cache_mode="align"``, ``MambaSpec.max_memory_usage_bytes``)."""
    _positive("budget_bytes", budget_bytes)
    _positive("max_model_len", max_model_len)
    per_layer_token = bytes_per_token(arch, dtype) / arch.layers if arch.layers else 0.0
    state_page = int(arch.state_elements * dtype_bytes(dtype)) if arch.state_layers else 0
    if state_page and per_layer_token:
        block_size *= math.ceil(state_page / (block_size * per_layer_token))
    page = per_layer_token * block_size or state_page  # one layer, one block (a state layer's page is padded to it)
    full_layers = arch.layers - arch.sliding_layers
    counts = [n for n in (full_layers, arch.sliding_layers, arch.state_layers) if n]
    group_size = min(counts)
    if max(counts) < 1.5 * min(counts):
        group_size = max(counts)
    full_groups = math.ceil(full_layers / group_size) if full_layers else 0
    sliding_groups = math.ceil(arch.sliding_layers / group_size) if arch.sliding_layers else 0
    state_groups = math.ceil(arch.state_layers / group_size) if arch.state_layers else 0
    num_blocks = int(budget_bytes // (group_size * page))
    full_blocks = math.ceil(max_model_len / block_size)
    per_request = full_groups * full_blocks + state_groups * (2 if prefix_caching else 1)
    ideal = full_groups * full_blocks + state_groups
    if sliding_groups:
        window_blocks = sliding_window_blocks(arch.sliding_window, max_model_len, block_size, max_num_batched_tokens,
                                              concurrent_batches)
        per_request += sliding_groups * window_blocks
        ideal += sliding_groups * (math.ceil(min(arch.sliding_window, max_model_len) / block_size) + 1)
    concurrency = num_blocks / per_request
    return VLLMPlan(full_groups, sliding_groups, group_size, num_blocks, per_request, concurrency,
                    int(concurrency * max_model_len), ideal, state_groups, block_size, state_page)


def weight_bytes(params: int, dtype: str = "bf16") -> float:
    """Bytes of model weights: parameters × bytes per element."""
    _positive("params", params)
    return params * dtype_bytes(dtype)


@dataclass(frozen=True)
class ParamCount:
    """A model's parameters, counted from its architecture: all of them, the ones one token uses (mixture-of-experts:
    routed experts × experts per token ÷ experts), and the parts a FLOP count needs."""

    total: int
    active: int
    embedding: int  # lookup tables (token, position embeddings) not shared with the LM head: no matmul
    lm_head: int  # the output projection (a matmul, for the last prompt token and every decoded one)
    matmul_active: int  # weights of the matrix multiplications one token goes through, LM head excluded
    experts: int  # routed-expert parameters (all experts)
    experts_per_token: int
    num_experts: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_EXPERT = re.compile(r"(^|\.)experts\.")


@functools.lru_cache(maxsize=64)
def _count(config_json: str) -> ParamCount:
    import torch
    from transformers import AutoModelForCausalLM

    cfg = _text(hf_config(json.loads(config_json)))
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    except Exception as exc:  # noqa: BLE001 - any architecture transformers cannot build
        raise KVLabError(f"transformers cannot build {getattr(cfg, 'model_type', 'this model')!r} to count its parameters "
                         f"({type(exc).__name__}); pass params=... from the model card.") from None
    from torch import nn

    out = model.get_output_embeddings()
    head = {id(out.weight)} if out is not None else set()
    total = embedding = experts = matmul = 0
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:  # tied: counted once
                continue
            seen.add(id(param))
            n = param.numel()
            total += n
            if _EXPERT.search(f"{module_name}.{name}"):
                experts += n
            elif id(param) in head:
                continue
            elif isinstance(module, nn.Embedding):
                embedding += n  # a lookup, not a matmul
            elif param.dim() >= 2:  # Linear, GPT-2's Conv1D, a router's weight: a matrix every token multiplies
                matmul += n
    lm_head = out.weight.numel() if out is not None else 0
    num_experts = int(getattr(cfg, "n_routed_experts", None) or getattr(cfg, "num_local_experts", None)
                      or getattr(cfg, "num_experts", None) or 0)
    per_token = int(getattr(cfg, "num_experts_per_tok", None) or 0) if experts else 0
    active_experts = experts * per_token // num_experts if experts and num_experts else experts
    return ParamCount(total, total - experts + active_experts, embedding, lm_head, matmul + active_experts, experts,
                      per_token, num_experts if experts else 0)


def parameter_counts(cfg: Any) -> ParamCount:
    """Count a model's parameters exactly from its config, for any architecture transformers knows: the model is built
    on the meta device (shapes only, no memory, no weights loaded). Vision towers of multimodal configs are left out:
    the language model is what the KV cache serves."""
    raw = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    return _count(json.dumps(raw, sort_keys=True, default=str))


def count_parameters(cfg: Any) -> int:
    """All parameters of a model from its config (``parameter_counts(cfg).total``)."""
    return parameter_counts(cfg).total


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
    """A KVArch from a preset name, a path to a config.json (or a model folder), or a config dict. A preset carries
    its published parameter count; for a config, parameters are counted from the architecture (``parameter_counts``)."""
    if isinstance(model, dict):
        return KVArch.from_config(model)
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" and path.is_file():
        cfg = json.loads(path.read_text())
        try:
            counts = parameter_counts(cfg)
        except KVLabError:
            counts = None
        return KVArch.from_config(cfg, name=path.parent.name, params=counts.total if counts else None,
                                  active_params=counts.active if counts else None)
    preset = load_preset(model)
    return KVArch.from_config(preset["config"], name=preset["name"], params=preset.get("params"),
                              active_params=preset.get("active_params", preset.get("params")))


# ---- capacity planning --------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVCapacityPlan:
    """How a card's memory splits between weights, overhead and KV cache, and what that KV budget holds — an upper
    bound from arithmetic until the engine reports its own numbers (``kvlab.kv_capacity``)."""

    model: str
    memory_gib: float
    utilization: float
    overhead_gib: float
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
    estimate: str = "upper bound: planned from the config, not reported by an engine"

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, one tidy row."""
        return asdict(self)


def plan_kv_capacity(arch: KVArch, memory_gib: float, context: int, utilization: float = VLLM_MEMORY_UTILIZATION,
                     kv_dtype: str = "bf16", weight_dtype: str = "bf16", params: int | None = None, block_size: int = 16,
                     target_sequences: int | None = None, overhead_gib: float | None = None, device: str = "gpu") -> KVCapacityPlan:
    """Plan one card: KV budget = memory × utilization − weights − overhead; then sequences and context.

    ``utilization`` defaults to vLLM's own (0.92); ``overhead_gib`` (activations, CUDA graphs, non-torch memory)
    defaults to ``DEFAULT_OVERHEAD_GIB[device]``. max_sequences: full-``context`` sequences that fit at once.
    largest_context_for_target: the longest context that still lets ``target_sequences`` run together
    (block-rounded, capped by the model's own). Sliding-window layers are counted at their window (the ideal; what
    vLLM reserves for them is ``vllm_kv_plan``).
    """
    _positive("memory_gib", memory_gib)
    _positive("context", context)
    _positive("block_size", block_size)
    if device not in DEFAULT_OVERHEAD_GIB:
        raise KVLabError(f"device must be one of {', '.join(DEFAULT_OVERHEAD_GIB)}, got {device!r}.")
    overhead_gib = DEFAULT_OVERHEAD_GIB[device] if overhead_gib is None else overhead_gib
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
    return KVCapacityPlan(arch.name, memory_gib, utilization, overhead_gib, weights / GiB, budget / GiB, kv_dtype, weight_dtype,
                        block_size, context, per_token, int(budget // per_token),
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


def kv_capacity_grid(models: list[str], memories_gib: list[float], contexts: list[int],
                     utilization: float = VLLM_MEMORY_UTILIZATION, kv_dtype: str = "bf16", weight_dtype: str = "bf16",
                     block_size: int = 16, target_sequences: int | None = None, overhead_gib: float | None = None) -> Any:
    """Tidy table of capacity plans: one row per (model, card memory, context)."""
    import pandas as pd

    rows = []
    for model in models:
        arch = load_arch(model)
        for mem in memories_gib:
            for ctx in contexts:
                plan = plan_kv_capacity(arch, mem, ctx, utilization, kv_dtype, weight_dtype, block_size=block_size,
                                     target_sequences=target_sequences, overhead_gib=overhead_gib)
                beyond = bool(arch.max_context and ctx > arch.max_context)
                rows.append(plan.as_dict() | {"model": model, "attention": arch.attention, "beyond_model_context": beyond})
    return pd.DataFrame(rows)


def model_facts(model: str) -> dict[str, object]:
    """Architecture facts that size the KV cache, read from the model's config the way transformers fills it in (a
    multimodal model's language part, e.g. Gemma-3's ``text_config``; MLA; sliding-window layers counted)."""
    cfg = load_config(model)
    text = cfg.get_text_config()
    arch = KVArch.from_config(cfg, name=Path(model).name)
    facts: dict[str, object] = {
        "architecture": (cfg.architectures or [cfg.model_type])[0],
        "layers": arch.layers,
        "hidden size": getattr(text, "hidden_size", None),
        "query heads": arch.query_heads,
        "KV heads": arch.kv_heads,
        "head dim": arch.head_dim,
        "attention": arch.attention,
        "vocabulary": getattr(text, "vocab_size", None),
        "max context (tokens)": arch.max_context,
    }
    if arch.sliding_layers:
        facts["sliding-window layers"] = f"{arch.sliding_layers} of {arch.layers}, window {arch.sliding_window:,} tokens"
    return facts


def kv_capacity_check(model: str | None = None, kv_cache_gib: float = 1.0, dtype: str | None = None,
                      kv_cache_dtype: str = "auto", keep: bool = False, **engine_args: Any) -> tuple[dict[str, Any], Any]:
    """Start an engine with a fixed KV budget and compare its reported capacity with the hand formula.

    ``dtype`` defaults to the machine's (``hardware.model_dtype``: on a GPU the model's own, which vLLM turns into float16
    where bf16 is unsupported, ``vllm/config/model.py`` ``_resolve_auto_dtype``; on a CPU without native bf16,
    float32); the hand formula uses the dtype the engine reports, not the one asked for.
    Returns one tidy row — hand vs engine bytes/token, blocks, tokens and (for sliding-window layers, where vLLM
    reserves more than the window) sequences of ``max_model_len`` that fit, as ``vllm_kv_plan`` computes
    them — and the engine if ``keep`` (else it is closed). Eager mode: this measures memory, not speed.
    """

    path = resolve_model(model)
    arch = load_arch(path)
    asked = {"dtype": dtype} if dtype else {}
    llm = make_engine(path, kv_cache_gib=kv_cache_gib, kv_cache_dtype=kv_cache_dtype,
                      **({"enforce_eager": True, "max_model_len": 2048} | asked | engine_args))
    cap = kv_capacity(llm)
    vcfg = llm.llm_engine.vllm_config
    model_dtype = engine_dtype(llm)
    kv_dtype = model_dtype if kv_cache_dtype == "auto" else kv_cache_dtype
    per_token = bytes_per_token(arch, kv_dtype)
    budget = kv_cache_gib * GiB
    step_tokens = int(vcfg.scheduler_config.max_num_batched_tokens)
    plan = vllm_kv_plan(arch, budget, cap.max_model_len, kv_dtype, cap.block_size, step_tokens,
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


def memory_split(model: str, weight_gib: float, kv_gib: float, usable_gib: float, sequences: int, context: int,
                 plan: object) -> go.Figure:
    """One card's usable memory as a stacked bar: weights, the KV cache asked for, what is left (GiB)."""
    free = usable_gib - weight_gib - kv_gib
    fig = go.Figure()
    fig.add_bar(y=["memory"], x=[weight_gib], name="weights", orientation="h", marker_color="#6c757d")
    fig.add_bar(y=["memory"], x=[kv_gib], name=f"KV: {sequences} × {context:,} tokens", orientation="h",
                marker_color="#e4572e" if free < 0 else "#4c8bf5")
    if free > 0:
        fig.add_bar(y=["memory"], x=[free], name="headroom", orientation="h", marker_color="#d9ead3")
    fig.add_vline(x=usable_gib, line_dash="dash", annotation_text=f"usable {usable_gib:.0f} GiB")
    verdict = "fits" if free >= 0 else f"does NOT fit ({-free:.1f} GiB short)"
    fig.update_layout(barmode="stack", height=260, xaxis_title="GiB",
                      title=f"{model}: {sequences} sequences × {context:,} tokens {verdict} — at most "
                            f"{plan.max_sequences} sequences at this context, {plan.largest_context_for_target or 0:,} tokens max for {sequences}",
                      title_font_size=13, yaxis_visible=False, margin={"t": 70})
    return fig


def bytes_per_token_bar(table: pd.DataFrame, dtype: str) -> go.Figure:
    """KV bytes per token for each model preset, coloured by attention type."""
    fig = go.Figure()
    colors = {"MHA": "#e4572e", "GQA": "#4c8bf5", "MQA": "#2ca02c", "MLA": "#9467bd"}
    for att, part in table.groupby("attention", sort=False):
        fig.add_bar(x=part.model, y=part.kv_bytes_per_token / 1024, name=att, marker_color=colors.get(att))
    fig.update_xaxes(categoryorder="array", categoryarray=list(table.model))
    fig.update_layout(title=f"KV cache per token ({dtype}), all layers, K and V", yaxis_title="KiB per token",
                      xaxis_title="model", legend_title="attention", height=420)
    return fig


def kv_capacity_lines(results: pd.DataFrame) -> go.Figure:
    """Sequences that fit vs context length, one line per card memory (log-log)."""
    fig = go.Figure()
    for mem, part in results.groupby("memory_gib"):
        fig.add_scatter(x=part.context, y=part.max_sequences.clip(lower=0.5), mode="lines+markers", name=f"{mem:g} GiB")
    model = results.model.iloc[0]
    fig.update_layout(title=f"{model}: concurrent full-context sequences that fit ({results.kv_dtype.iloc[0]} KV)",
                      xaxis_title="context length (tokens)", yaxis_title="sequences (log)", xaxis_type="log", yaxis_type="log",
                      legend_title="card memory", height=420)
    return fig


def sequences_that_fit_figure(grid: pd.DataFrame) -> go.Figure:
    """Concurrent full-context sequences per model, context and card (log scale); hatched = beyond the model's context."""
    from plotly.subplots import make_subplots

    cards = sorted(grid.memory_gib.unique())
    models = list(dict.fromkeys(grid.model))
    fig = make_subplots(rows=len(cards), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[f"{m:g} GiB card" for m in cards])
    colors = ["#4c8bf5", "#e4572e", "#2ca02c", "#9467bd", "#8c564b"]
    for row, mem in enumerate(cards, start=1):
        for i, ctx in enumerate(sorted(grid.context.unique())):
            part = grid[(grid.memory_gib == mem) & (grid.context == ctx)].set_index("model").loc[models]
            fig.add_bar(x=models, y=part.max_sequences.clip(lower=0.5), name=f"{ctx // 1024}k tokens", legendgroup=str(ctx),
                        showlegend=row == 1, marker_color=colors[i % len(colors)],
                        marker_pattern_shape=["/" if b else "" for b in part.beyond_model_context],
                        text=[str(v) if v else "0" for v in part.max_sequences], textposition="outside", textfont_size=9,
                        hovertemplate="%{x}: %{text} sequences<extra>" + f"{ctx:,} tokens" + "</extra>", row=row, col=1)
        fig.update_yaxes(type="log", dtick=1, title_text="sequences (log)", row=row, col=1)
    fig.update_layout(barmode="group", height=300 * len(cards) + 120, legend_title="context",
                      title="Sequences that fit at once (KV = 90 % of memory − bf16 weights); hatched: beyond the model's own context")
    return fig
