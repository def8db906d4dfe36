"""KV sizing formulas against figures computed by hand in this file (not by the code under test)."""

import pytest

from kvlab import sizing
from kvlab.errors import KVLabError

GiB = 2**30


@pytest.mark.parametrize("preset, dtype, expected", [
    ("Llama-3.1-8B", "fp16", 2 * 32 * 8 * 128 * 2),        # 131,072 B: the seed's worked example
    ("Llama-2-7B", "fp16", 2 * 32 * 32 * 128 * 2),         # MHA: 524,288 B
    ("Llama-3.1-70B", "bf16", 2 * 80 * 8 * 128 * 2),       # 327,680 B
    ("Falcon-7B", "bf16", 2 * 32 * 1 * 64 * 2),            # MQA: 8,192 B
    ("Qwen2.5-7B-Instruct", "bf16", 2 * 28 * 4 * 128 * 2),  # 57,344 B
    ("SmolLM2-135M", "fp32", 2 * 30 * 3 * 64 * 4),         # 46,080 B: the engine test's figure
    ("DeepSeek-V3", "bf16", 61 * (512 + 64) * 2),          # MLA latent, not K and V: 70,272 B
    ("Llama-3.1-8B", "fp8", 2 * 32 * 8 * 128 * 1),         # fp8 halves 16-bit
])
def test_bytes_per_token_matches_hand_figures(preset, dtype, expected):
    assert sizing.bytes_per_token(sizing.load_arch(preset), dtype) == expected


def test_seed_worked_example_and_the_query_head_mistake():
    arch = sizing.load_arch("Llama-3.1-8B")  # 32 layers, 8 KV heads, head_dim 128
    total = sizing.kv_bytes(arch, 8192, "fp16", sequences=16)
    assert total == 16 * GiB  # 2·32·8·128·2 B × 8,192 tokens = 1 GiB per sequence
    wrong = sizing.kv_bytes(arch, 8192, "fp16", sequences=16, use_query_heads=True)
    assert wrong == 64 * GiB  # 32 query heads instead of 8 KV heads: 4× too much


def test_sliding_window_layers_hold_only_the_window():
    gemma = sizing.load_arch("Gemma-2-9B")  # 21 local layers (window 4,096) + 21 global
    per_layer_token = 2 * 8 * 256 * 2
    assert sizing.kv_bytes(gemma, 8192, "bf16") == per_layer_token * (21 * 8192 + 21 * 4096)
    mistral = sizing.load_arch("Mistral-7B-v0.1")  # every layer slides over 4,096 tokens
    assert sizing.kv_bytes(mistral, 32768, "bf16") == 32 * 4096 * (2 * 8 * 128 * 2)
    assert sizing.kv_bytes(mistral, 1000, "bf16") == 1000 * 131072  # short contexts are not affected


def test_block_rounding_counts_whole_blocks():
    arch = sizing.load_arch("Llama-3.1-8B")
    assert sizing.blocks_needed(100, 16) == 7 and sizing.blocks_needed(112, 16) == 7 and sizing.blocks_needed(113, 16) == 8
    assert sizing.kv_bytes(arch, 100, "bf16", block_size=16) == 112 * 131072


def test_parameter_counts_match_published_totals():
    published = {"Llama-2-7B": 6_738_415_616, "Llama-3.1-8B": 8_030_261_248, "Llama-3.1-70B": 70_553_706_496,
                 "Mistral-7B-v0.1": 7_241_732_096, "Qwen2.5-7B-Instruct": 7_615_616_512, "Gemma-2-9B": 9_241_705_984,
                 "Falcon-7B": 6_921_720_704, "SmolLM2-135M": 134_515_008}
    for name, total in published.items():
        assert sizing.count_parameters(sizing.load_preset(name)["config"]) == total, name


def test_capacity_plan_llama_8b_on_80_gib():
    arch = sizing.load_arch("Llama-3.1-8B")
    plan = sizing.plan_capacity(arch, memory_gib=80, context=8192, utilization=0.9, target_sequences=16)
    budget = 80 * GiB * 0.9 - 8_030_261_248 * 2  # 61,248,888,832 B of KV
    assert plan.kv_budget_gib * GiB == pytest.approx(budget)
    assert plan.max_sequences == 57  # budget / 1 GiB per 8k sequence = 57.04
    assert plan.kv_tokens == 467_291  # budget / 131,072 B = 467,291.9
    assert plan.largest_context_for_target == 29_200  # budget / 16 / 131,072 = 29,205.9 → whole blocks of 16
    assert plan.weights_fit


def test_weights_that_do_not_fit_leave_no_kv():
    plan = sizing.plan_capacity(sizing.load_arch("Llama-3.1-70B"), memory_gib=80, context=8192, target_sequences=1)
    assert not plan.weights_fit and plan.max_sequences == 0 and plan.kv_tokens == 0 and plan.largest_context_for_target == 0


def test_config_defaults_head_dim_mha_and_mqa_flags():
    base = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256}
    mha = sizing.KVArch.from_config(base)
    assert (mha.head_dim, mha.kv_heads, mha.attention) == (64, 4, "MHA")
    mqa = sizing.KVArch.from_config(base | {"multi_query": True})
    assert (mqa.kv_heads, mqa.attention) == (1, "MQA")
    gqa = sizing.KVArch.from_config(base | {"num_key_value_heads": 2, "head_dim": 32})
    assert (gqa.head_dim, gqa.kv_heads, gqa.attention) == (32, 2, "GQA")


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(KVLabError, match=r"Unknown model preset 'Llama-9'.*Llama-3\.1-8B.*SmolLM2-135M"):
        sizing.load_arch("Llama-9")


def test_config_missing_fields_names_them():
    with pytest.raises(KVLabError, match="lacks num_hidden_layers"):
        sizing.KVArch.from_config({"num_attention_heads": 8, "hidden_size": 512})
    with pytest.raises(KVLabError, match="lacks head_dim and hidden_size"):
        sizing.KVArch.from_config({"num_hidden_layers": 2, "num_attention_heads": 8})


@pytest.mark.parametrize("kwargs, name", [({"memory_gib": 0}, "memory_gib"), ({"context": -5}, "context"),
                                          ({"block_size": 0}, "block_size"), ({"target_sequences": 0}, "target_sequences")])
def test_zero_or_negative_sizes_name_the_parameter(kwargs, name):
    args = {"memory_gib": 80, "context": 8192} | kwargs
    with pytest.raises(KVLabError, match=rf"^{name} must be a positive number"):
        sizing.plan_capacity(sizing.load_arch("Llama-3.1-8B"), **args)


def test_bad_utilization_and_dtype():
    arch = sizing.load_arch("Llama-3.1-8B")
    with pytest.raises(KVLabError, match="utilization must be a fraction"):
        sizing.plan_capacity(arch, memory_gib=80, context=8192, utilization=1.5)
    with pytest.raises(KVLabError, match="Unknown dtype 'fp7'.*bf16"):
        sizing.bytes_per_token(arch, "fp7")


def test_config_path_and_folder(tmp_path):
    import json

    cfg = sizing.load_preset("Llama-3.1-8B")["config"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    arch = sizing.load_arch(str(tmp_path))
    assert arch.kv_heads == 8 and arch.params == 8_030_261_248
