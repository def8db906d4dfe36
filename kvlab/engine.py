"""The engine factory: one function that builds a vLLM ``LLM`` with the right settings for the platform.

CPU (the tested path): in-process engine, the dtype the CPU runs fastest (``model_dtype``: bf16 where the CPU has
native bf16 and it measures faster, else float32), an explicit KV budget (reproducible capacity),
stats on (per-request timestamps exist), eager in quick mode. GPU: vLLM's defaults, plus stats on.
vLLM's own log lines go to a file under the build folder, never into a learner's notebook.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from kvlab import config
from kvlab.errors import KVLabError
from kvlab.model import resolve_model
from kvlab.quiet import log_path, quiet

if TYPE_CHECKING:
    from vllm import LLM


def on_gpu() -> bool:
    """True when a CUDA device is visible: the engine then keeps vLLM's GPU defaults."""
    import torch

    return torch.cuda.is_available()


def _prepare_vllm_import() -> None:
    """Environment that must be set before vLLM is imported: in-process engine on CPU, our logging."""
    if "vllm" in sys.modules:
        return
    if not on_gpu():
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    vllm_logger = logging.getLogger("vllm")
    if not vllm_logger.handlers:
        handler = logging.FileHandler(log_path())
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        vllm_logger.addHandler(handler)
        vllm_logger.setLevel(logging.INFO)
        vllm_logger.propagate = False


def import_vllm():  # noqa: ANN201 - returns the vllm module
    """Import vLLM quietly, with the course's environment in place."""
    _prepare_vllm_import()
    with quiet():
        import vllm
    _tolerant_kernel_scan()
    return vllm


def _tolerant_kernel_scan() -> None:
    """Work around a vLLM 0.32 start-up failure. Each engine start scans every loaded module for Triton kernels to
    override (``vllm/triton_utils/dispatcher.py``: ``vars(value).get("kernel")`` on every module attribute). Once the
    n-gram proposer has loaded numba, llvmlite's ffi wrappers answer ``vars()`` with an object that has no ``get``, so a
    second speculative engine in one process fails with "'_lib_fn_wrapper' object has no attribute 'get'" (measured).
    The scan's ``vars`` becomes one that treats such objects as having no attributes; nothing else changes."""
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:  # another vLLM version: nothing to work around
        return

    def tolerant_vars(value: Any) -> dict[str, Any]:
        found = vars(value)
        return found if isinstance(found, dict) else {}

    dispatcher.vars = tolerant_vars


#: CPU flags that mean native bf16 arithmetic (AVX-512 BF16 dot products, AMX tiles).
NATIVE_BF16 = ("avx512_bf16", "amx_bf16")
#: bf16 is chosen only where a bf16 matrix multiply also measures at least this much faster than float32 here.
BF16_MIN_SPEEDUP = 1.1


@functools.lru_cache(maxsize=1)
def bf16_gemm_speedup() -> float:
    """float32 time ÷ bf16 time of one prefill-shaped matrix multiply (512×1024 by 1024×2048) on this CPU: whether
    the flags' bf16 is fast here, measured (~0.5 s, once per machine: cached in the model cache by CPU and torch, not
    by thread count, so processes pinned to fewer cores (``kvlab.pools``) read the same answer, not a new one)."""
    import json

    import torch

    from kvlab.envinfo import _cpu_model_and_flags

    key = f"{_cpu_model_and_flags()} torch {torch.__version__}"
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
    native bf16 it is emulated and 3-4x slower than float32. ``KVLAB_DTYPE`` overrides."""
    asked = config.dtype_choice()
    if asked != "auto":
        return asked, "set by KVLAB_DTYPE"
    if on_gpu():
        return "auto", "GPU: the model's own dtype (vLLM's default)"
    from kvlab.envinfo import cpu_flags

    have = sorted(set(NATIVE_BF16) & (cpu_flags() if flags is None else flags))
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
        from kvlab.model import load_config

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
    from kvlab.envinfo import cpu_flags

    if not {"avx512f", "amx_tile"} & (cpu_flags() if flags is None else flags):
        return "vLLM's CPU attention keeps an fp8 KV cache only on x86 CPUs with AVX-512 or AMX, and this CPU has neither"
    return None


def engine_defaults(quick: bool | None = None) -> dict[str, Any]:
    """The engine arguments KV Lab sets for this platform (anything passed to make_engine wins)."""
    quick = config.quick() if quick is None else quick
    defaults: dict[str, Any] = {"disable_log_stats": False, "seed": 0, "use_tqdm_on_load": False}
    dtype = model_dtype()[0]
    if dtype != "auto":
        defaults["dtype"] = dtype
    if not on_gpu():
        defaults |= {
            "kv_cache_memory_bytes": int(config.kv_cache_gib() * 2**30),
            # eager: a compiled engine starts in 60-120 s per configuration (measured), and compiled bf16 on this vLLM CPU
            # build answered "What is the capital of France?" with gibberish where eager bf16 and compiled fp32 say Paris
            "enforce_eager": True,
        }
    return defaults


def engine_arguments(**engine_args: Any) -> dict[str, Any]:
    """The platform defaults overridden by ``engine_args``, with ``kv_cache_gib=`` turned into
    ``kv_cache_memory_bytes``: what ``make_engine`` and ``serving.Server`` both start vLLM with."""
    if "kv_cache_gib" in engine_args:
        gib = engine_args.pop("kv_cache_gib")
        if not isinstance(gib, (int, float)) or isinstance(gib, bool) or gib <= 0:
            raise KVLabError(f"kv_cache_gib={gib!r} must be a positive number of GiB.")
        engine_args["kv_cache_memory_bytes"] = int(gib * 2**30)
    return engine_defaults() | engine_args


def make_engine(model: str | None = None, **engine_args: Any) -> LLM:
    """Build a vLLM ``LLM`` for ``model`` (default: ``KVLAB_MODEL`` or SmolLM2-135M-Instruct).

    Any vLLM engine argument passes through (``max_model_len=``, ``enable_prefix_caching=``,
    ``kv_cache_dtype=``...). ``kv_cache_gib=`` is a shorthand for ``kv_cache_memory_bytes``.
    Start-up failures become a one-sentence :class:`KVLabError`; the full log is in ``log_path()``.
    """
    target = resolve_model(model)
    args = engine_arguments(**engine_args)
    vllm = import_vllm()
    t0 = time.perf_counter()
    # vLLM collects garbage three times while it starts, then freezes its heap (vllm/utils/gc_utils.py freeze_gc_heap);
    # with this process's heap frozen first, those collections skip the objects already here: 2.6 -> 1.2 s per start,
    # measured. vLLM's shutdown unfreezes everything again (vllm/v1/engine/core.py shutdown), so nothing stays frozen.
    gc.freeze()
    try:
        with quiet():
            llm = vllm.LLM(target, **args)
    except KVLabError:
        gc.unfreeze()  # no engine, so no shutdown to unfreeze the heap
        raise
    except Exception as exc:  # noqa: BLE001 - translated into one sentence, original kept in the log
        gc.unfreeze()
        raise _explain_start_failure(exc, target, args) from None
    llm.kvlab_settings = {"model": target, **{k: str(v) for k, v in args.items()}}
    config.note_startup("engine", time.perf_counter() - t0)
    if not on_gpu() and not args.get("enforce_eager") and "16" in str(llm.llm_engine.vllm_config.model_config.dtype):
        print("Note: a compiled 16-bit engine on this vLLM CPU build has answered with wrong text (measured, bf16); its "
              "timings are real, its outputs are not to be trusted. enforce_eager=True (the default) or float32 avoids it.")
    return llm


_FITS = re.compile(r"maximum model length is (\d+)")
_WANTED = re.compile(r"max seq len \((\d+)\)")
_MODEL_MISSING = ("repo id", "repository not found", "does not appear to have", "couldn't connect", "is not a local folder",
                  "not a valid model identifier", "hfvalidationerror", "localentrynotfound", "cached snapshot", "no such file")


_TOO_LONG = re.compile(r"max_model_len \((\d+)\) is greater than the derived max_model_len \((\w+)=(\d+)")


def explain_context_too_long(text: str) -> str | None:
    """One sentence for vLLM's refusal of a ``max_model_len`` beyond the model's own context (``vllm/config/model.py``,
    ``_get_and_verify_max_len``), or None when ``text`` is not that refusal."""
    found = _TOO_LONG.search(text)
    if not found:
        return None
    asked, field, limit = int(found.group(1)), found.group(2), int(float(found.group(3)))
    return (f"max_model_len={asked:,} is longer than this model's context of {limit:,} tokens ({field} in its "
            f"config.json); ask for at most {limit:,} (kvlab.model.fit_context does), or choose a model with a longer context.")


def _explain_start_failure(exc: Exception, model: str, args: dict[str, Any]) -> KVLabError:
    """Turn an exception from deep inside vLLM into one sentence a learner can act on."""
    text = f"{type(exc).__name__}: {exc}"
    logging.getLogger("vllm").error("engine start failed: %s", text)
    too_long = explain_context_too_long(text)
    if too_long:
        return KVLabError(too_long)
    low = text.lower()
    if "kv cache" in low and ("max_model_len" in low or "max model len" in low or "larger than" in low):
        fit, want = _FITS.search(text), _WANTED.search(text)
        want_txt = want.group(1) if want else args.get("max_model_len", "the model's maximum")
        where = f"the largest context that fits is {int(fit.group(1)):,} tokens" if fit else "not even one sequence fits"
        return KVLabError(
            f"The KV cache budget is too small for a context of {want_txt} tokens: {where}; "
            "either raise the budget (kv_cache_gib=... or KVLAB_KV_CACHE_GIB) or lower max_model_len."
        )
    if any(s in low for s in _MODEL_MISSING):
        return KVLabError(
            f"Could not find model {model!r} locally or on the Hugging Face Hub; check the name and your network, "
            "or set KVLAB_MODEL to a local Hugging Face folder (unset it for the default model)."
        )
    return KVLabError(f"vLLM could not start the engine for {model!r}: {str(exc).splitlines()[0][:300]} (full log: {log_path()}).")


@dataclass(frozen=True)
class KVCapacity:
    """The engine's own report of its KV cache (read from vLLM, not computed by hand).

    num_blocks: KV blocks allocated; block_size: tokens per block; tokens: token slots in all
    blocks; bytes_per_token: K+V bytes one token costs over all layers; bytes: total KV bytes;
    kv_dtype: element type of the cache; max_model_len: context limit; max_concurrency: sequences
    of full max_model_len length that fit at once.
    """

    num_blocks: int
    block_size: int
    tokens: int
    bytes_per_token: int
    bytes: int
    kv_dtype: str
    max_model_len: int
    max_concurrency: float

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, for tables and run metadata."""
        return asdict(self)

    def __str__(self) -> str:
        return (
            f"{self.num_blocks:,} blocks × {self.block_size} tokens = {self.tokens:,} tokens of KV "
            f"({self.bytes / 2**30:.2f} GiB, {self.bytes_per_token:,} B/token, {self.kv_dtype}); "
            f"{self.max_concurrency:.2f} sequences of {self.max_model_len:,} tokens fit at once"
        )


def kv_capacity(llm: LLM) -> KVCapacity:
    """Read the KV capacity the engine allocated: blocks, block size, tokens, bytes, dtype."""
    vcfg = llm.llm_engine.vllm_config
    cache = vcfg.cache_config
    specs: dict[str, Any] = {}
    for worker_specs in llm.collective_rpc("get_kv_cache_spec"):
        specs.update(worker_specs)
    bytes_per_token = sum(s.page_size_bytes // s.block_size for s in specs.values())
    dtypes = sorted({str(getattr(s, "dtype", "?")).replace("torch.", "") for s in specs.values()})
    block_size = int(cache.block_size)
    num_blocks = int(cache.num_gpu_blocks)
    tokens = int(cache.kv_cache_size_tokens or num_blocks * block_size)
    return KVCapacity(
        num_blocks=num_blocks,
        block_size=block_size,
        tokens=tokens,
        bytes_per_token=int(bytes_per_token),
        bytes=int(num_blocks * block_size * bytes_per_token),
        kv_dtype=str(cache.cache_dtype) if str(cache.cache_dtype) != "auto" else "/".join(dtypes),
        max_model_len=int(vcfg.model_config.max_model_len),
        max_concurrency=float(cache.kv_cache_max_concurrency or tokens / vcfg.model_config.max_model_len),
    )


def close_engine(llm: LLM | None) -> None:
    """Shut an engine down and give its memory back (before building another configuration). vLLM's shutdown already
    unfreezes its heap and collects garbage (``vllm/v1/engine/core.py`` ``shutdown`` → ``cleanup_dist_env_and_memory``);
    one more full collection here cost 0.44 s per engine and returned nothing more (measured over five engines)."""
    if llm is None:
        return
    with quiet(), contextlib.suppress(Exception):
        llm.llm_engine.engine_core.shutdown()


def chat(llm: LLM, question: str, max_tokens: int = 32, **sampling: Any):  # noqa: ANN201 - RequestOutput
    """Ask one chat question greedily (temperature 0 unless overridden) and return vLLM's RequestOutput."""
    from vllm import SamplingParams

    from kvlab.prompts import chat_template

    params = SamplingParams(**({"temperature": 0.0, "max_tokens": max_tokens} | sampling))
    template = chat_template(llm.get_tokenizer())  # None: the model's own
    return llm.chat([{"role": "user", "content": question}], params, use_tqdm=False, chat_template=template)[0]
