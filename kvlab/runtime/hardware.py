"""This machine's hardware facts the engine depends on: accelerator or CPU, vector/matrix flags, the dtype to run in."""

from __future__ import annotations

import contextlib
import functools
import json
import platform
import time
from pathlib import Path

from kvlab.runtime import config
from kvlab.runtime.model import load_config

#: The CPU flags that matter to vLLM's CPU kernels and to the dtype choice.
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_model_and_flags() -> tuple[str, list[str]]:
    """This CPU's model name and which of ``CPU_FLAGS`` it has (from ``/proc/cpuinfo``)."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        if line.startswith("model name") and ":" in line:
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags") and ":" in line:
            have = set(line.split(":", 1)[1].split())
            flags = [f for f in CPU_FLAGS if f in have]
            break
    return model, flags


def cpu_flags() -> set[str]:
    """The vector/matrix flags of this CPU that matter to the engine (from ``/proc/cpuinfo``; empty where unreadable)."""
    return set(cpu_model_and_flags()[1])


def on_gpu() -> bool:
    """True when a CUDA device is visible: the engine then keeps vLLM's GPU defaults."""
    import torch

    return torch.cuda.is_available()


#: CPU flags that mean native bf16 arithmetic (AVX-512 BF16 dot products, AMX tiles).
NATIVE_BF16 = ("avx512_bf16", "amx_bf16")


#: vLLM 0.32 runs bf16 attention on CPUs with AMX tiles through its AMX kernel (``vllm/v1/attention/backends/cpu_attn.py``,
#: ``_get_attn_isa``: "amx" for bf16 whenever the block size is a multiple of 32, which the CPU backend requires). On an
#: Intel Xeon with AMX (2026-12-03) that path answered the course model's check question with gibberish in eager mode,
#: and correctly with the vector kernel forced or in float32: so AMX machines run float32 until a vLLM fixes it.
AMX_BF16_ATTENTION_OK = False
#: bf16 is chosen only where a bf16 matrix multiply also measures at least this much faster than float32 here.
BF16_MIN_SPEEDUP = 1.1


@functools.lru_cache(maxsize=1)
def bf16_gemm_speedup() -> float:
    """float32 time ÷ bf16 time of one prefill-shaped matrix multiply (512×1024 by 1024×2048) on this CPU: whether
    the flags' bf16 is fast here, measured (~0.5 s, once per machine: cached in the model cache by CPU and torch, not
    by thread count, so processes pinned to fewer cores (``kvlab.pools``) read the same answer, not a new one)."""
    import torch

    key = f"{cpu_model_and_flags()} torch {torch.__version__}"
    path = config.cache_dir() / "bf16-gemm.json"
    with contextlib.suppress(OSError, ValueError):
        known = json.loads(path.read_text())
        if known.get("key") == key:
            return float(known["speedup"])

    def median_s(dtype: torch.dtype) -> float:
        x, w = torch.randn(512, 1024).to(dtype), torch.randn(2048, 1024).to(dtype)
        torch.nn.functional.linear(x, w)  # warm-up
        times = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(4):
                torch.nn.functional.linear(x, w)
            times.append(time.perf_counter() - start)
        return sorted(times)[2]

    speedup = median_s(torch.float32) / median_s(torch.bfloat16)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key, "speedup": speedup}))
    return speedup


def model_dtype(flags: set[str] | None = None, speedup: float | None = None) -> tuple[str, str]:
    """The dtype the engine runs the model in on this machine, and why. On a GPU: the model's own (vLLM's "auto").
    On a CPU with native bf16 flags whose bf16 matrix multiply also measures faster (``bf16_gemm_speedup``):
    bfloat16 (measured faster than float32: TTFT 898 vs 1,365 ms at 1,024 tokens, TPOT 24.7 vs 43.0 ms); without
    native bf16 it is emulated and 3-4x slower than float32; with AMX, float32 (``AMX_BF16_ATTENTION_OK``: vLLM's AMX
    bf16 attention answers wrongly). ``KVLAB_DTYPE`` overrides."""
    asked = config.dtype_choice()
    if asked != "auto":
        return asked, "set by KVLAB_DTYPE"
    if on_gpu():
        return "auto", "GPU: the model's own dtype (vLLM's default)"
    flags = cpu_flags() if flags is None else flags
    have = sorted(set(NATIVE_BF16) & flags)
    if "amx_tile" in flags and not AMX_BF16_ATTENTION_OK:
        return "float32", ("this CPU has AMX, and vLLM 0.32's AMX bf16 attention kernel answered wrongly here (measured: "
                           "gibberish for 'What is the capital of France?', Paris with its vector kernel or in float32)")
    if not have:
        return "float32", "this CPU has no native bf16 (no avx512_bf16/amx_bf16): float32 is 3-4x faster than emulated bf16"
    speedup = bf16_gemm_speedup() if speedup is None else speedup
    if speedup < BF16_MIN_SPEEDUP:
        return "float32", (f"this CPU has native bf16 ({', '.join(have)}) but a bf16 matrix multiply measured only "
                           f"{speedup:.2f}x float32's speed here")
    return "bfloat16", f"this CPU has native bf16 ({', '.join(have)}): a bf16 matrix multiply measured {speedup:.1f}x float32's speed here"


def resolved_dtype(model: str | None = None, config_dtype: str | None = None, bf16_supported: bool | None = None) -> str:
    """The dtype (torch name) the engine will run ``model`` in here, before any engine starts: KV Lab's choice where it
    sets one (CPU, ``KVLAB_DTYPE``); on a GPU what vLLM's "auto" makes of the config's dtype — float32 (or none) becomes
    bfloat16, or float16 on a GPU without bf16 (T4, V100), and bfloat16 becomes float16 there
    (``vllm/config/model.py``, ``_resolve_auto_dtype``). Machine limits are measured in it (``roofline.measure_limits``)."""
    chosen = model_dtype()[0]
    if chosen != "auto":
        return chosen
    if config_dtype is None:
        cfg = load_config(model)
        config_dtype = str(getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None) or "float32")
    config_dtype = config_dtype.replace("torch.", "")
    if bf16_supported is None:
        import torch

        bf16_supported = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if config_dtype in ("float32", "float", "bfloat16"):
        return "bfloat16" if bf16_supported else "float16"
    return config_dtype


def fp8_kv_unsupported(head_dim: int, flags: set[str] | None = None) -> str | None:
    """Why this vLLM cannot keep an fp8 KV cache for a model with ``head_dim`` here, in one sentence, or None if it
    can. On a CPU its attention stores fp8 only with AVX-512 or AMX, and only for head sizes divisible by 32 among
    those divisible by 16 (``vllm/v1/attention/backends/cpu_attn.py``, ``_get_attn_isa``); on a GPU vLLM decides."""
    if on_gpu():
        return None
    if head_dim % 32 != 0 and head_dim % 16 == 0:
        return (f"vLLM's CPU attention keeps an fp8 KV cache only for head sizes divisible by 32, and this model's "
                f"head_dim is {head_dim}")
    if not {"avx512f", "amx_tile"} & (cpu_flags() if flags is None else flags):
        return "vLLM's CPU attention keeps an fp8 KV cache only on x86 CPUs with AVX-512 or AMX, and this CPU has neither"
    return None
