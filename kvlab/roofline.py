"""The machine's limits and the lower bounds they put on prefill and decode.

- **Peak matmul FLOP/s** and **peak memory bandwidth** are measured here with torch, in the engine's dtype and
  thread count, keeping the best of several tries (a bound must never be too slow, or it would not be a bound).
- **Prefill** cannot beat its arithmetic *or* its memory traffic: 2 FLOPs per weight of every matmul per prompt
  token, the LM head for the last token only (the embedding lookup is not a matmul), plus causal attention, which
  grows with the square of the prompt (≈ 2 × 2 × heads × head_dim × N(N+1)/2 per layer); and it must read every
  weight it uses once and write the prompt's KV cache. Its bound is the larger of the two times: a short prompt is
  bound by reading the weights (on an H100 an 8B model's 16-token prompt needs ~0.24 ms of compute but ~4.5 ms of
  weight reads), a long one by compute. The prompt length where they cross follows from the machine's **ridge point**
  (peak FLOP/s ÷ bandwidth, in FLOP per byte): about ridge × bytes per weight ÷ 2 tokens.
- **Decode** cannot beat its memory traffic: each step reads every weight it uses once (LM head included; a
  mixture-of-experts model only its routed experts) and the KV cache of the whole context so far.
Weights are counted from the architecture for any model transformers knows (``kvlab.sizing.parameter_counts``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from kvlab.runtime.engine import kv_capacity
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.hardware import resolved_dtype
from kvlab.runtime.model import load_config
from kvlab.sizing import KVArch, parameter_counts


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


CPU_SHAPES = ((2048, 2048, 2048), (2048, 1024, 4096), (2048, 4096, 1024))
GPU_SHAPES = ((8192, 8192, 8192), (8192, 4096, 14336), (8192, 14336, 4096))


def model_shapes(model: str | None = None, tokens: int = 2048) -> list[tuple[int, int, int]]:
    """The matmul shapes a prefill of ``tokens`` tokens runs through the chosen model's MLP (tokens × hidden ×
    intermediate and back), read from its config; none when it cannot be read."""

    try:
        cfg = load_config(model).get_text_config()
        hidden, inner = int(cfg.hidden_size), int(getattr(cfg, "intermediate_size", 0) or 4 * cfg.hidden_size)
    except Exception:  # noqa: BLE001 - an unreadable config only means fewer shapes to try
        return []
    return [(tokens, hidden, inner), (tokens, inner, hidden)]


def _measure_here(dtype: str, quick: bool, extra_shapes: tuple[tuple[int, int, int], ...] = (),
                  matmul: bool = True) -> MachineLimits:
    """The measurement itself, in this process (see ``measure_limits``)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tdtype = getattr(torch, dtype)
    # (M, K, N): square and the tall-skinny shapes prefill runs (many tokens × a layer's weight); the best one wins
    shapes = ((CPU_SHAPES if device == "cpu" else GPU_SHAPES) + tuple(extra_shapes)) if matmul else ()
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


def measure_limits(dtype: str | None = None, quick: bool = False, model: str | None = None,
                   matmul: bool = True) -> MachineLimits:
    """Measure peak matmul FLOP/s and memory bandwidth with torch, in a fresh process; a few seconds
    (``matmul=False``: the bandwidth alone, FLOP/s reported as 0 — for a bandwidth peak measured beside a decode run).

    A fresh process, because a CPU engine pins its threads to cores in the process that runs it, after which
    torch's own matmuls there run slower and the "peak" would be too low (the bound too slow). Best of several
    tries per shape, over square shapes and the chosen model's own MLP shapes (``model``: default the chosen one).
    ``dtype`` defaults to the one the engine will run the model in here (``hardware.resolved_dtype``: on a GPU without
    bf16, float16 — a bf16 "peak" there would be an emulated one, far too low, and the bound too slow).
    On a shared machine call it more than once and keep ``best_of`` the results.
    """
    import json
    import subprocess
    import sys

    if dtype is None:

        dtype = resolved_dtype(model)
    extra = tuple(model_shapes(model)) if matmul else ()
    code = (f"import json, kvlab.roofline as r; "
            f"print(json.dumps(r._measure_here({dtype!r}, {quick!r}, {extra!r}, {matmul!r}).as_dict()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
    return MachineLimits(**json.loads(out.stdout.strip().splitlines()[-1]))


def best_of(*measurements: MachineLimits) -> MachineLimits:
    """The highest FLOP/s and bandwidth seen across measurements (a peak is a maximum)."""
    first = measurements[0]
    return MachineLimits(max(m.matmul_flops for m in measurements), max(m.bandwidth for m in measurements),
                         first.dtype, first.device, first.threads)


#: One GPU's datasheet peaks, to set this machine's numbers against: NVIDIA H100 SXM, dense bf16 tensor-core FLOP/s
#: (989.4 TFLOP/s, no sparsity) and HBM3 bandwidth (3.35 TB/s).
H100_SXM_BF16 = MachineLimits(989.4e12, 3.35e12, "bfloat16", "NVIDIA H100 SXM (datasheet)", 0)
#: NVIDIA A100 40GB SXM: dense bf16 tensor-core FLOP/s (312 TFLOP/s) and HBM2 bandwidth (1.555 TB/s), datasheet.
A100_40GB_BF16 = MachineLimits(312e12, 1.555e12, "bfloat16", "NVIDIA A100 40GB SXM (datasheet)", 0)


def ridge_point(limits: MachineLimits) -> float:
    """FLOPs per byte at which a kernel turns from memory-bound to compute-bound on this machine."""
    return limits.matmul_flops / limits.bandwidth


@dataclass(frozen=True)
class ModelCost:
    """What one token costs a decoder: its matmul weights (active ones for mixture-of-experts), LM head, attention
    shape, KV bytes and element size."""

    linear_params: int  # matmul weights one token goes through, LM head excluded (MoE: shared + routed experts used)
    lm_head_params: int
    layers: int
    attn_width: int  # query heads × head_dim
    kv_bytes_per_token: int
    bytes_per_param: float
    expert_params: int = 0  # all routed experts' weights (0 for a dense model)
    experts_per_token: int = 0
    num_experts: int = 0

    @classmethod
    def from_config(cls, cfg: Any, bytes_per_param: float, kv_bytes_per_token: int) -> ModelCost:
        """From any config transformers knows: the weights counted on the meta device (``sizing.parameter_counts``)."""

        counts = parameter_counts(cfg)
        arch = KVArch.from_config(cfg)
        return cls(counts.matmul_active, counts.lm_head, arch.layers, arch.query_heads * arch.head_dim, kv_bytes_per_token,
                   bytes_per_param, counts.experts, counts.experts_per_token, counts.num_experts)

    def prefill_flops(self, prompt_tokens: int) -> float:
        """Minimum FLOPs to prefill ``prompt_tokens`` tokens and produce the first token."""
        n = prompt_tokens
        attention = 2 * 2 * self.attn_width * self.layers * n * (n + 1) / 2  # QKᵀ and AV over the causal triangle
        return 2 * self.linear_params * n + 2 * self.lm_head_params + attention

    def weights_read(self, tokens: int) -> float:
        """Weight bytes a forward pass over ``tokens`` tokens must read at least once: every dense weight, and of the
        routed experts the share that ``tokens`` × experts per token can touch."""
        if not self.expert_params:
            return (self.linear_params + self.lm_head_params) * self.bytes_per_param
        active_experts = self.expert_params * self.experts_per_token / self.num_experts
        dense = self.linear_params - active_experts
        touched = self.expert_params * min(1.0, tokens * self.experts_per_token / self.num_experts)
        return (dense + touched + self.lm_head_params) * self.bytes_per_param

    def prefill_bytes(self, prompt_tokens: int) -> float:
        """Minimum bytes prefill moves: the weights once, and the prompt's KV cache written."""
        return self.weights_read(prompt_tokens) + self.kv_bytes_per_token * prompt_tokens

    def ttft_bound_s(self, prompt_tokens: int, limits: MachineLimits) -> float:
        """Prefill's lower bound: the larger of its compute time and its memory time on this machine."""
        return max(self.prefill_flops(prompt_tokens) / limits.matmul_flops, self.prefill_bytes(prompt_tokens) / limits.bandwidth)

    def compute_bound_from(self, limits: MachineLimits) -> int:
        """The prompt length (tokens) from which prefill is compute-bound on this machine: its FLOPs take longer than
        its bytes (whole tokens, by bisection; the two times cross once)."""
        def compute_wins(n: int) -> bool:
            return self.prefill_flops(n) / limits.matmul_flops >= self.prefill_bytes(n) / limits.bandwidth

        lo, hi = 1, 1
        while not compute_wins(hi):
            lo, hi = hi, hi * 2
            if hi > 10**8:
                return hi
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if compute_wins(mid) else (mid + 1, hi)
        return lo

    def forward_flops(self, new_tokens: int, context_tokens: int) -> float:
        """FLOPs of one forward pass over ``new_tokens`` after ``context_tokens`` cached ones, with logits for every new
        token (what verifying speculated tokens needs; a decode step is ``new_tokens`` = 1)."""
        n, c = new_tokens, context_tokens
        attention = 2 * 2 * self.attn_width * self.layers * n * (c + (n + 1) / 2)
        return 2 * (self.linear_params + self.lm_head_params) * n + attention

    def forward_bound_s(self, new_tokens: int, context_tokens: int, limits: MachineLimits) -> float:
        """Lower bound of that pass on this machine: the larger of its compute time and the time to read the weights
        and the context's KV cache (and write the new tokens' KV)."""
        moved = self.weights_read(new_tokens) + self.kv_bytes_per_token * (context_tokens + new_tokens)
        return max(self.forward_flops(new_tokens, context_tokens) / limits.matmul_flops, moved / limits.bandwidth)

    def batch_decode_step_bytes(self, batch: int, context_tokens: float) -> float:
        """Minimum bytes one decode step of ``batch`` sequences reads: the weights once for all of them, and every
        sequence's own KV cache — batching shares the weight read, not the KV reads."""
        return self.weights_read(batch) + batch * self.kv_bytes_per_token * context_tokens

    def decode_step_bytes(self, context_tokens: float) -> float:
        """Minimum bytes one decode step reads: the weights it uses once, plus the KV cache of the context."""
        return self.weights_read(1) + self.kv_bytes_per_token * context_tokens


def add_bounds(df: pd.DataFrame, cost: ModelCost, limits: MachineLimits) -> pd.DataFrame:
    """Add each request's lower bounds and measured ÷ bound (≥ 1 when the bound is right), plus achieved rates."""
    out = df.copy()
    out["ttft_bound_s"] = [cost.ttft_bound_s(p, limits) for p in out.prompt_tokens]
    from_tokens = cost.compute_bound_from(limits)
    out["ttft_bound_kind"] = ["compute" if p >= from_tokens else "memory" for p in out.prompt_tokens]
    # decode steps run at contexts P+1 … P+N−1: on average P + N/2 tokens of KV are read per step
    out["tpot_bound_s"] = [cost.decode_step_bytes(p + n / 2) / limits.bandwidth for p, n in zip(out.prompt_tokens, out.output_tokens, strict=True)]
    out["ttft_over_bound"] = out.ttft_s / out.ttft_bound_s
    out["tpot_over_bound"] = out.tpot_s / out.tpot_bound_s
    out["prefill_flops_achieved"] = [cost.prefill_flops(p) for p in out.prompt_tokens] / out.prefill_s
    out["decode_bandwidth_achieved"] = [cost.decode_step_bytes(p + n / 2) for p, n in zip(out.prompt_tokens, out.output_tokens, strict=True)] / out.tpot_s
    return out


def engine_cost(llm: Any) -> ModelCost:
    """The ModelCost of the model inside a running engine (its config, dtype and KV bytes per token)."""

    mc = llm.llm_engine.vllm_config.model_config
    element = mc.dtype.itemsize if hasattr(mc.dtype, "itemsize") else 4
    return ModelCost.from_config(mc.hf_config, element, kv_capacity(llm).bytes_per_token)


@dataclass(frozen=True)
class DecodeFit:
    """TPOT = overhead + bytes per step ÷ bandwidth, fitted by least squares over models that differ only in width:
    the intercept is the engine's fixed cost per step (scheduling, sampling, Python, kernel launches), the slope's
    inverse the bandwidth the step achieved. Uncertainties are one standard error."""

    overhead_s: float
    overhead_se_s: float
    bandwidth: float  # bytes/s
    bandwidth_lo: float  # from slope + 1 SE
    bandwidth_hi: float  # from slope − 1 SE (inf when the slope's SE exceeds it)
    r2: float
    points: int

    def memory_share(self, step_bytes: float, bandwidth: float | None = None, overhead_s: float | None = None) -> float:
        """The share of a decode step that is memory traffic: (bytes ÷ bandwidth) ÷ (overhead + bytes ÷ bandwidth)."""
        bw = self.bandwidth if bandwidth is None else bandwidth
        memory = step_bytes / bw
        return memory / (memory + (self.overhead_s if overhead_s is None else overhead_s))


def fit_decode(step_bytes: list[float], tpot_s: list[float]) -> DecodeFit:
    """Fit TPOT = a + b × bytes (ordinary least squares; at least three widths, so the errors have a degree of freedom)."""
    import numpy as np


    x, y = np.asarray(step_bytes, float), np.asarray(tpot_s, float)
    if len(x) < 3 or len(set(x)) < 3:
        raise KVLabError(f"The decode fit needs at least three models of different size, got {len(set(x))}.")
    design = np.column_stack([np.ones_like(x), x])
    (a, b), res, *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ np.array([a, b])
    dof = len(x) - 2
    sigma2 = float(resid @ resid) / dof
    cov = sigma2 * np.linalg.inv(design.T @ design)
    se_a, se_b = float(np.sqrt(cov[0, 0])), float(np.sqrt(cov[1, 1]))
    r2 = 1 - float(resid @ resid) / float(((y - y.mean()) ** 2).sum()) if y.std() > 0 else float("nan")
    hi = 1 / (b - se_b) if b - se_b > 0 else float("inf")
    return DecodeFit(float(a), se_a, 1 / b if b > 0 else float("inf"), 1 / (b + se_b), hi, r2, len(x))
