"""The engine factory: one function that builds a vLLM ``LLM`` with the right settings for the platform.

CPU (the tested path): in-process engine, the dtype the CPU runs fastest (``hardware.model_dtype``: bf16 where the CPU has
native bf16 and it measures faster, else float32), an explicit KV budget (reproducible capacity),
stats on (per-request timestamps exist), eager in quick mode. GPU: vLLM's defaults, plus stats on.
vLLM's own log lines go to a file under the build folder, never into a learner's notebook.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from kvlab.runtime import config, hardware
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.model import resolve_model
from kvlab.runtime.quiet import log_path, quiet
from kvlab.runtime.templates import chat_template

if TYPE_CHECKING:
    import pandas as pd
    from vllm import LLM


def numba_threads_for(env: dict[str, str] | os._Environ) -> str | None:
    """Numba's thread count to match the OpenMP threads the engine is given (``OMP_NUM_THREADS``, else the length of
    ``VLLM_CPU_OMP_THREADS_BIND``'s core list), or None when neither is set. The n-gram proposer restores numba's
    count after each draft, and numba shares the process's OpenMP runtime: with numba at the machine's core count, an
    in-process speculation engine raised every engine's torch threads from 1 to 2 (measured, docs/engine-notes.md).
    The core list is read here, not with vLLM's own parser, because this runs before vLLM may be imported."""
    if env.get("OMP_NUM_THREADS", "").strip().isdigit():
        return env["OMP_NUM_THREADS"].strip()
    bind = env.get("VLLM_CPU_OMP_THREADS_BIND", "").strip()
    if not bind or bind in ("auto", "nobind") or "|" in bind:
        return None
    count = 0
    for part in bind.split(","):
        lo, _, hi = part.partition("-")
        if not lo.strip().isdigit() or (hi and not hi.strip().isdigit()):
            return None
        count += int(hi) - int(lo) + 1 if hi else 1
    return str(count)


def _prepare_vllm_import() -> None:
    """Environment that must be set before vLLM is imported: in-process engine on CPU, our logging."""
    if "vllm" in sys.modules:
        return
    if not hardware.on_gpu():
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        numba_threads = numba_threads_for(os.environ)
        if numba_threads:
            os.environ.setdefault("NUMBA_NUM_THREADS", numba_threads)
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


def engine_defaults(quick: bool | None = None) -> dict[str, Any]:
    """The engine arguments KV Lab sets for this platform (anything passed to make_engine wins)."""
    quick = config.quick() if quick is None else quick
    defaults: dict[str, Any] = {"disable_log_stats": False, "seed": 0, "use_tqdm_on_load": False}
    dtype = hardware.model_dtype()[0]
    if dtype != "auto":
        defaults["dtype"] = dtype
    if not hardware.on_gpu():
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
    if not hardware.on_gpu() and not args.get("enforce_eager") and "16" in str(llm.llm_engine.vllm_config.model_config.dtype):
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
    blocks; bytes_per_token: K+V bytes one token costs over all layers; bytes_per_block: the memory one block takes
    (every group's layers' pages: block size × bytes per token for one group, less when several groups share the
    blocks); bytes: total KV bytes;
    kv_dtype: element type of the cache; max_model_len: context limit; max_concurrency: sequences
    of full max_model_len length that fit at once.
    """

    num_blocks: int
    block_size: int
    tokens: int
    bytes_per_token: int
    bytes_per_block: int
    bytes: int
    kv_dtype: str
    max_model_len: int
    max_concurrency: float

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, for tables and run metadata."""
        return asdict(self)

    def __str__(self) -> str:
        slots = self.num_blocks * self.block_size
        if self.tokens != slots:  # several KV cache groups (sliding-window and full layers) share the blocks
            return (
                f"{self.num_blocks:,} blocks × {self.block_size} tokens = {slots:,} block slots, shared by the model's KV "
                f"cache groups (vLLM stores each block once per group, and sliding-window groups keep only their window): "
                f"vLLM counts {self.tokens:,} tokens of KV ({self.bytes / 2**30:.2f} GiB, {self.bytes_per_block:,} B per "
                f"block, {self.kv_dtype}); "
                f"{self.max_concurrency:.2f} sequences of {self.max_model_len:,} tokens fit at once"
            )
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
    per_block = bytes_per_block(vcfg, specs)
    dtypes = sorted({str(getattr(s, "dtype", "?")).replace("torch.", "") for s in specs.values()})
    block_size = int(cache.block_size)
    num_blocks = int(cache.num_gpu_blocks)
    tokens = int(cache.kv_cache_size_tokens or num_blocks * block_size)
    return KVCapacity(
        num_blocks=num_blocks,
        block_size=block_size,
        tokens=tokens,
        bytes_per_token=int(bytes_per_token),
        bytes_per_block=per_block,
        bytes=int(num_blocks * per_block),
        kv_dtype=str(cache.cache_dtype) if str(cache.cache_dtype) != "auto" else "/".join(dtypes),
        max_model_len=int(vcfg.model_config.max_model_len),
        max_concurrency=float(cache.kv_cache_max_concurrency or tokens / vcfg.model_config.max_model_len),
    )


def bytes_per_block(vcfg: Any, specs: dict[str, Any]) -> int:
    """The memory one KV block takes, as vLLM divides the KV budget by it (``num_blocks = memory // bytes_per_block``,
    ``vllm/v1/core/kv_cache_utils.py``): one page per layer of a group, the groups sharing each block's tensors — so
    a model with several groups (sliding-window and full layers) pays for one group's layers per block, not all."""
    from vllm.v1.core import kv_cache_utils

    groups = kv_cache_utils.get_kv_cache_groups(vcfg, specs)
    try:
        layout = vcfg.cache_config.get_resolved_kv_cache_layout()
        return int(kv_cache_utils._get_kv_cache_bytes_per_block(groups, layout))
    except (AttributeError, TypeError):  # another vLLM: equal groups, each layer one page per block
        return int(sum(s.page_size_bytes for s in specs.values()) // max(len(groups), 1))


def kv_groups(llm: Any) -> pd.DataFrame:
    """The engine's KV cache groups, as vLLM forms them from its layers' specs (``vllm/v1/core/kv_cache_utils.py``,
    ``get_kv_cache_groups``): one row per group with its kind (full attention, sliding window of W tokens, …) and
    layers. An attention-only model has one group; sliding-window and full layers make several, and vLLM stores each
    block once per group (``BlockStored.group_idx``)."""
    import pandas as pd
    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups

    specs: dict[str, Any] = {}
    for worker_specs in llm.collective_rpc("get_kv_cache_spec"):
        specs.update(worker_specs)
    rows = []
    for i, group in enumerate(get_kv_cache_groups(llm.llm_engine.vllm_config, specs)):
        spec = group.kv_cache_spec
        window = getattr(spec, "sliding_window", None)
        kind = f"sliding window of {window} tokens" if window else type(spec).__name__.removesuffix("Spec")
        rows.append({"group": i, "kind": kind, "full_attention": type(spec).__name__ == "FullAttentionSpec",
                     "layers": len(group.layer_names), "block_size": spec.block_size})
    return pd.DataFrame(rows)


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


    params = SamplingParams(**({"temperature": 0.0, "max_tokens": max_tokens} | sampling))
    template = chat_template(llm.get_tokenizer())  # None: the model's own
    return llm.chat([{"role": "user", "content": question}], params, use_tqdm=False, chat_template=template)[0]


def engine_dtype(llm: Any) -> str:
    """The engine's model dtype as a torch name ("float32", "bfloat16"...), to measure limits in the same dtype."""
    return str(llm.llm_engine.vllm_config.model_config.dtype).replace("torch.", "")
