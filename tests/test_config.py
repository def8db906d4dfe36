import pytest

from kvlab import config
from kvlab.errors import KVLabError


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), ("", False), ("0", False), ("no", False)])
def test_quick_mode_follows_env(monkeypatch, value, expected):
    monkeypatch.setenv("KVLAB_QUICK", value)
    assert config.quick() is expected
    assert config.pick("full", "quick") == ("quick" if expected else "full")


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
