import pytest

from kvlab.runtime import config
from kvlab.runtime.errors import KVLabError


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), ("", False), ("0", False), ("no", False)])
def test_quick_mode_follows_env(monkeypatch, value, expected):
    monkeypatch.setenv("KVLAB_QUICK", value)
    assert config.quick() is expected
    assert config.pick("full", "quick") == ("quick" if expected else "full")


def test_sizes_fit_the_time_a_slower_machine_has_and_never_drop_below_the_least():
    def seconds(repeats: int) -> float:
        return repeats * 10.0

    assert config.fit_to_time([5, 4, 3], seconds, 60) == 5  # a fast machine runs the full sweep
    assert config.fit_to_time([5, 4, 3], seconds, 45) == 4
    assert config.fit_to_time([5, 4, 3], seconds, 5) == 3  # too slow for any: the least a median needs, not fewer


def test_model_name_defaults_and_overrides(monkeypatch):
    monkeypatch.delenv("KVLAB_MODEL", raising=False)
    assert config.model_name() == "SmolLM2-135M-Instruct"
    monkeypatch.setenv("KVLAB_MODEL", "org/other-model")
    assert config.model_name() == "org/other-model"


def test_cache_dir_override(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path))
    assert config.cache_dir() == tmp_path


@pytest.mark.parametrize("raw", ["0", "-1", "lots"])
def test_bad_kv_budget_is_one_clear_sentence(monkeypatch, raw):
    monkeypatch.setenv("KVLAB_KV_CACHE_GIB", raw)
    with pytest.raises(KVLabError, match="KVLAB_KV_CACHE_GIB.*positive"):
        config.kv_cache_gib()


def test_kv_budget_default_and_value(monkeypatch):
    monkeypatch.delenv("KVLAB_KV_CACHE_GIB", raising=False)
    assert config.kv_cache_gib() == 1.0
    monkeypatch.setenv("KVLAB_KV_CACHE_GIB", "2.5")
    assert config.kv_cache_gib() == 2.5


def test_dtype_follows_the_cpus_bf16_flags_and_the_override(monkeypatch):
    from kvlab.runtime import engine, hardware

    monkeypatch.delenv("KVLAB_DTYPE", raising=False)
    monkeypatch.setattr(hardware, "on_gpu", lambda: False)
    assert hardware.model_dtype({"avx512f", "avx512_bf16"}, speedup=2.3)[0] == "bfloat16"
    dtype, why = hardware.model_dtype({"avx512_bf16", "amx_bf16", "amx_tile"}, speedup=5.0)
    assert dtype == "float32" and "AMX bf16 attention kernel answered wrongly" in why  # vLLM 0.32's AMX kernel
    monkeypatch.setattr(hardware, "AMX_BF16_ATTENTION_OK", True)  # a vLLM that fixes it: bf16 again
    assert hardware.model_dtype({"amx_bf16", "amx_tile"}, speedup=5.0)[0] == "bfloat16"
    dtype, why = hardware.model_dtype({"avx512_bf16"}, speedup=0.4)  # flags say bf16, its multiply is slow: float32
    assert dtype == "float32" and "measured only 0.40x" in why
    dtype, why = hardware.model_dtype({"avx2", "avx512f", "avx512_vnni"})
    assert dtype == "float32" and "no native bf16" in why
    monkeypatch.setenv("KVLAB_DTYPE", "float32")
    assert hardware.model_dtype({"avx512_bf16"}) == ("float32", "set by KVLAB_DTYPE")
    assert engine.engine_defaults()["dtype"] == "float32"
    monkeypatch.setenv("KVLAB_DTYPE", "fp33")
    with pytest.raises(KVLabError, match="is not one of auto, float32"):
        hardware.model_dtype()


def test_the_dtype_limits_are_measured_in_is_the_one_the_engine_will_run(monkeypatch):
    """On a GPU, vLLM's "auto" (config/model.py _resolve_auto_dtype): float32 configs run in the first supported
    16-bit type, bf16 configs fall back to float16 where bf16 is unsupported; float16 stays. Set dtypes win."""
    from kvlab.runtime import hardware

    monkeypatch.delenv("KVLAB_DTYPE", raising=False)
    monkeypatch.setattr(hardware, "on_gpu", lambda: True)
    assert hardware.resolved_dtype(config_dtype="torch.bfloat16", bf16_supported=True) == "bfloat16"
    assert hardware.resolved_dtype(config_dtype="bfloat16", bf16_supported=False) == "float16"  # a T4 or V100
    assert hardware.resolved_dtype(config_dtype="float32", bf16_supported=True) == "bfloat16"
    assert hardware.resolved_dtype(config_dtype="float32", bf16_supported=False) == "float16"
    assert hardware.resolved_dtype(config_dtype="float16", bf16_supported=True) == "float16"
    monkeypatch.setenv("KVLAB_DTYPE", "float32")
    assert hardware.resolved_dtype(config_dtype="bfloat16", bf16_supported=True) == "float32"


def test_fp8_kv_support_follows_vllms_cpu_attention_rules(monkeypatch):
    """vLLM 0.32's CPU attention (cpu_attn.py, _get_attn_isa): fp8 KV needs AVX-512 or AMX, and a head size that is
    a multiple of 32 when it is one of 16 (80, 112, 160 are refused; 64, 128, 72 pass)."""
    from kvlab.runtime import hardware

    monkeypatch.setattr(hardware, "on_gpu", lambda: False)
    assert hardware.fp8_kv_unsupported(64, {"avx2", "avx512f"}) is None
    assert hardware.fp8_kv_unsupported(128, {"amx_tile", "amx_bf16"}) is None
    assert hardware.fp8_kv_unsupported(72, {"avx512f"}) is None
    assert "head_dim is 80" in hardware.fp8_kv_unsupported(80, {"avx512f"})
    assert "head_dim is 112" in hardware.fp8_kv_unsupported(112, {"amx_tile"})
    assert "AVX-512 or AMX" in hardware.fp8_kv_unsupported(64, {"avx2"})
    monkeypatch.setattr(hardware, "on_gpu", lambda: True)
    assert hardware.fp8_kv_unsupported(80, set()) is None  # on a GPU vLLM decides


def test_bf16_speed_is_measured_once_per_machine_and_cached(monkeypatch, tmp_path):
    import json

    from kvlab.runtime import hardware

    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path))
    hardware.bf16_gemm_speedup.cache_clear()
    measured = hardware.bf16_gemm_speedup()
    saved = json.loads((tmp_path / "bf16-gemm.json").read_text())
    assert measured > 0 and saved["speedup"] == measured and "torch" in saved["key"]
    (tmp_path / "bf16-gemm.json").write_text(json.dumps(saved | {"speedup": 0.5}))  # a later process reads the file
    hardware.bf16_gemm_speedup.cache_clear()
    assert hardware.bf16_gemm_speedup() == 0.5
    hardware.bf16_gemm_speedup.cache_clear()


def test_the_heap_is_frozen_at_exit_after_later_handlers_and_before_earlier_ones():
    """kvlab's exit hook (gc.freeze, which skips the interpreter's last collection) runs after the handlers registered
    after `import kvlab` and before those registered before it, so every shutdown handler still runs."""
    import subprocess
    import sys

    code = ("import atexit, gc\n"
            "atexit.register(lambda: print('earlier', gc.get_freeze_count() > 0))\n"
            "import kvlab\n"
            "atexit.register(lambda: print('later', gc.get_freeze_count() > 0))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["later False", "earlier True"], out
