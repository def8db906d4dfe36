"""The machine's limits and the lower bounds they put on prefill and decode.

- **Peak matmul FLOP/s** and **peak memory bandwidth** are measured here with torch, in the engine's dtype and
  thread count, keeping the best of several tries (a bound must never be too slow, or it would not be a bound).
- **Prefill** cannot beat its arithmetic: 2 FLOPs per weight of every linear layer per prompt token, the LM head
  for the last token only (the embedding lookup is not a matmul), plus causal attention, which grows with the
  square of the prompt: ≈ 2 × 2 × heads × head_dim × N(N+1)/2 per layer.
- **Decode** cannot beat its memory traffic: each step reads every weight once (LM head included) and the
  KV cache of the whole context so far.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd


@dataclass(frozen=True)
class MachineLimits:
    """Measured peaks: matmul FLOP/s and memory bandwidth (bytes/s), for one dtype, device and thread count."""

    matmul_flops: float
    bandwidth: float
    dtype: str
    device: str
    threads: int

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, for metadata."""
        return asdict(self)


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _best_seconds(fn: Any, repeats: int, device: str) -> float:
    fn()  # warm-up
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


CPU_SHAPES = ((2048, 2048, 2048), (2048, 1024, 4096), (2048, 4096, 1024), (2048, 576, 1536), (2048, 1536, 576))
GPU_SHAPES = ((8192, 8192, 8192), (8192, 4096, 14336), (8192, 14336, 4096))


def _measure_here(dtype: str, quick: bool) -> MachineLimits:
    """The measurement itself, in this process (see ``measure_limits``)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tdtype = getattr(torch, dtype)
    # (M, K, N): square and the tall-skinny shapes prefill runs (many tokens × a layer's weight); the best one wins
    shapes = CPU_SHAPES if device == "cpu" else GPU_SHAPES
    repeats = 8  # quick mode too: a peak measured low makes every bound wrong
    flops = 0.0
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device).to(tdtype)
        b = torch.randn(k, n, device=device).to(tdtype)
        flops = max(flops, 2 * m * k * n / _best_seconds(lambda a=a, b=b: torch.mm(a, b), repeats, device))
    n_bytes = (256 if device == "cpu" else 2048) * 2**20
    src = torch.ones(n_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy_bw = 2 * n_bytes / _best_seconds(lambda: dst.copy_(src), repeats, device)  # read + write
    read_bw = n_bytes / _best_seconds(lambda: src.sum(), repeats, device)
    return MachineLimits(flops, max(copy_bw, read_bw), dtype, device, torch.get_num_threads())


def measure_limits(dtype: str | None = None, quick: bool = False) -> MachineLimits:
    """Measure peak matmul FLOP/s and memory bandwidth with torch, in a fresh process; a few seconds.

    A fresh process, because a CPU engine pins its threads to cores in the process that runs it, after which
    torch's own matmuls there run slower and the "peak" would be too low (the bound too slow). Best of several
    tries per shape. ``dtype`` defaults to the one ``make_engine`` uses here (float32 on CPU, bfloat16 on GPU).
    On a shared machine call it more than once and keep ``best_of`` the results.
    """
    import json
    import subprocess
    import sys

    if dtype is None:
        from kvlab.engine import engine_defaults

        dtype = engine_defaults().get("dtype", "bfloat16")
    code = f"import json, kvlab.roofline as r; print(json.dumps(r._measure_here({dtype!r}, {quick!r}).as_dict()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
    return MachineLimits(**json.loads(out.stdout.strip().splitlines()[-1]))


def best_of(*measurements: MachineLimits) -> MachineLimits:
    """The highest FLOP/s and bandwidth seen across measurements (a peak is a maximum)."""
    first = measurements[0]
    return MachineLimits(max(m.matmul_flops for m in measurements), max(m.bandwidth for m in measurements),
                         first.dtype, first.device, first.threads)


@dataclass(frozen=True)
class ModelCost:
    """What one token costs a dense decoder: linear weights, LM head, attention shape, KV bytes, element size."""

    linear_params: int
    lm_head_params: int
    layers: int
    attn_width: int  # query heads × head_dim
    kv_bytes_per_token: int
    bytes_per_param: int

    @classmethod
    def from_config(cls, cfg: dict[str, Any], bytes_per_param: int, kv_bytes_per_token: int) -> ModelCost:
        """From a Llama-style config.json: per-layer q, k, v, o and gated-MLP matrices."""
        from kvlab.sizing import KVArch

        arch = KVArch.from_config(cfg)
        h, ffn = cfg["hidden_size"], cfg["intermediate_size"]
        q, kv = arch.query_heads * arch.head_dim, arch.kv_heads * arch.head_dim
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * ffn
        return cls(arch.layers * per_layer, cfg["vocab_size"] * h, arch.layers, q, kv_bytes_per_token, bytes_per_param)

    def prefill_flops(self, prompt_tokens: int) -> float:
        """Minimum FLOPs to prefill ``prompt_tokens`` tokens and produce the first token."""
        n = prompt_tokens
        attention = 2 * 2 * self.attn_width * self.layers * n * (n + 1) / 2  # QKᵀ and AV over the causal triangle
        return 2 * self.linear_params * n + 2 * self.lm_head_params + attention

    def decode_step_bytes(self, context_tokens: float) -> float:
        """Minimum bytes one decode step reads: all weights once, plus the KV cache of the context."""
        return (self.linear_params + self.lm_head_params) * self.bytes_per_param + self.kv_bytes_per_token * context_tokens


def add_bounds(df: pd.DataFrame, cost: ModelCost, limits: MachineLimits) -> pd.DataFrame:
    """Add each request's lower bounds and measured ÷ bound (≥ 1 when the bound is right), plus achieved rates."""
    out = df.copy()
    out["ttft_bound_s"] = [cost.prefill_flops(p) / limits.matmul_flops for p in out.prompt_tokens]
    # decode steps run at contexts P+1 … P+N−1: on average P + N/2 tokens of KV are read per step
    out["tpot_bound_s"] = [cost.decode_step_bytes(p + n / 2) / limits.bandwidth for p, n in zip(out.prompt_tokens, out.output_tokens, strict=True)]
    out["ttft_over_bound"] = out.ttft_s / out.ttft_bound_s
    out["tpot_over_bound"] = out.tpot_s / out.tpot_bound_s
    out["prefill_flops_achieved"] = [cost.prefill_flops(p) for p in out.prompt_tokens] / out.prefill_s
    out["decode_bandwidth_achieved"] = [cost.decode_step_bytes(p + n / 2) for p, n in zip(out.prompt_tokens, out.output_tokens, strict=True)] / out.tpot_s
    return out


def engine_cost(llm: Any) -> ModelCost:
    """The ModelCost of the model inside a running engine (its config, dtype and KV bytes per token)."""
    from kvlab.engine import kv_capacity

    mc = llm.llm_engine.vllm_config.model_config
    element = mc.dtype.itemsize if hasattr(mc.dtype, "itemsize") else 4
    return ModelCost.from_config(mc.hf_config.to_dict(), element, kv_capacity(llm).bytes_per_token)


def engine_dtype(llm: Any) -> str:
    """The engine's model dtype as a torch name ("float32", "bfloat16"...), to measure limits in the same dtype."""
    return str(llm.llm_engine.vllm_config.model_config.dtype).replace("torch.", "")
