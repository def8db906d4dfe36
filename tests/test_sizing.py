"""KV sizing formulas against figures computed by hand in this file (not by the code under test)."""

import pytest

from kvlab import sizing
from kvlab.runtime.errors import KVLabError

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
    qwen = sizing.load_arch("Qwen2.5-7B-Instruct")  # sliding_window in its config, but use_sliding_window is false
    assert qwen.sliding_layers == 0 and sizing.kv_bytes(qwen, 32768, "bf16") == 32768 * 2 * 28 * 4 * 128 * 2


def test_gemma3_five_local_to_one_global_at_8k_from_a_config_that_omits_its_head_counts():
    """google/gemma-3-4b-it's text_config omits num_attention_heads (8), num_key_value_heads (4), head_dim (256) and
    the 5:1 pattern: transformers' Gemma3TextConfig defaults fill them. 34 layers: layers 6, 12, … 30 are global."""
    arch = sizing.load_arch("Gemma-3-4B")
    assert (arch.query_heads, arch.kv_heads, arch.head_dim, arch.layers) == (8, 4, 256, 34)
    assert (arch.sliding_layers, arch.sliding_window) == (29, 1024)
    per_layer_token = 2 * 4 * 256 * 2  # K and V, 4 KV heads, head_dim 256, bf16: 4,096 B
    expected = 5 * 8192 * per_layer_token + 29 * 1024 * per_layer_token  # 167,772,160 + 121,634,816
    assert expected == 289_406_976
    assert sizing.kv_bytes(arch, 8192, "bf16") == expected
    assert sizing.kv_bytes(arch, 8192, "bf16") > 2 * 34 * 1024 * per_layer_token  # not "all 34 layers slide"


def test_a_config_with_omitted_fields_takes_the_model_class_defaults():
    # LlamaConfig's defaults: 32 layers, 32 heads, hidden 4,096 → head_dim 128, no num_key_value_heads → MHA
    arch = sizing.KVArch.from_config({"model_type": "llama", "vocab_size": 32000})
    assert (arch.layers, arch.query_heads, arch.kv_heads, arch.head_dim, arch.attention) == (32, 32, 32, 128, "MHA")
    assert sizing.bytes_per_token(arch, "bf16") == 2 * 32 * 32 * 128 * 2  # 524,288 B


def test_vllm_reserves_more_than_the_window_for_a_sliding_layer():
    # cdiv(min(window − 1 + max_num_batched_tokens × batches, max_model_len), block) + 1
    assert sizing.sliding_window_blocks(4096, 32768, 16, 8192) == 768 + 1  # 4,095 + 8,192 = 12,287 tokens → 768 blocks
    assert sizing.sliding_window_blocks(4096, 32768, 16, 8192, concurrent_batches=2) == 1280 + 1  # 20,479 → 1,280
    assert sizing.sliding_window_blocks(4096, 8192, 16, 8192) == 512 + 1  # capped by max_model_len
    assert sizing.sliding_window_blocks(256, 8192, 128, 512) == 6 + 1  # 255 + 512 = 767 tokens → 6 blocks of 128


def test_vllm_plan_groups_layers_like_the_engine():
    arch = sizing.load_arch("Gemma-3-4B")  # 5 full + 29 sliding: groups of 5 → 1 full group, 6 sliding (one padded)
    plan = sizing.vllm_kv_plan(arch, 10 * GiB, max_model_len=8192, dtype="bf16", block_size=16, max_num_batched_tokens=8192)
    assert (plan.group_size, plan.groups_full, plan.groups_sliding) == (5, 1, 6)
    assert plan.num_blocks == 10 * GiB // (5 * 16 * 4096)  # a block holds 16 tokens of 5 layers: 327,680 B → 32,768
    assert plan.blocks_per_request == 512 + 6 * (512 + 1)  # min(1,023 + 8,192, 8,192) = 8,192 tokens per sliding group
    assert plan.ideal_blocks_per_request == 512 + 6 * (64 + 1)  # if a sliding group held only its 1,024-token window
    assert plan.max_concurrency == pytest.approx(32768 / 3590)
    small_steps = sizing.vllm_kv_plan(arch, 10 * GiB, 8192, "bf16", 16, max_num_batched_tokens=512)
    assert small_steps.blocks_per_request == 512 + 6 * (96 + 1)  # 1,023 + 512 = 1,535 tokens → 96 blocks
    dense = sizing.vllm_kv_plan(sizing.load_arch("Llama-3.1-8B"), 16 * GiB, 8192, "fp16", 16)
    assert (dense.groups_full, dense.groups_sliding, dense.num_blocks, dense.blocks_per_request) == (1, 0, 8192, 512)
    assert dense.max_concurrency == 16 and dense.tokens == 16 * 8192


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


def test_non_gated_mlps_gpt2_and_phi2():
    # GPT-2 small: tied embeddings, learned positions, 4h GELU MLP, biases everywhere, LayerNorm with bias
    V, P, h, L = 50257, 1024, 768, 12
    per_layer = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * h + (h * 4 * h + 4 * h) + (4 * h * h + h)
    gpt2 = V * h + P * h + L * per_layer + 2 * h
    assert gpt2 == 124_439_808
    counts = sizing.parameter_counts({"model_type": "gpt2", "vocab_size": V, "n_positions": P, "n_embd": h, "n_layer": L, "n_head": 12})
    assert counts.total == counts.active == gpt2 and counts.embedding == P * h  # wte is the LM head (tied)
    # Phi-2: parallel attention + MLP after one LayerNorm, fc1/fc2 with biases, untied LM head with a bias
    V, h, ffn, L = 51200, 2560, 10240, 32
    per_layer = 4 * (h * h + h) + (h * ffn + ffn) + (ffn * h + h) + 2 * h
    phi2 = V * h + L * per_layer + 2 * h + (h * V + V)
    assert phi2 == 2_779_683_840  # the published total
    cfg = {"model_type": "phi", "vocab_size": V, "hidden_size": h, "intermediate_size": ffn, "num_hidden_layers": L,
           "num_attention_heads": 32, "partial_rotary_factor": 0.4, "tie_word_embeddings": False}
    assert sizing.count_parameters(cfg) == phi2


def test_mixture_of_experts_total_and_active_parameters():
    # Mixtral-8x7B: 8 experts of a gated MLP (14,336 wide) per layer, 2 per token; GQA 32:8; untied LM head
    V, h, ffn, L, E, k = 32000, 4096, 14336, 32, 8, 2
    attn = h * h + 2 * h * 1024 + h * h
    expert = 3 * h * ffn
    per_layer_total = attn + h * E + E * expert + 2 * h  # attention, router, experts, two RMSNorms
    per_layer_active = attn + h * E + k * expert + 2 * h
    total = 2 * V * h + L * per_layer_total + h
    active = 2 * V * h + L * per_layer_active + h
    assert (total, active) == (46_702_792_704, 12_879_925_248)  # the published 46.7B and 12.9B
    cfg = {"model_type": "mixtral", "vocab_size": V, "hidden_size": h, "intermediate_size": ffn, "num_hidden_layers": L,
           "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": E, "num_experts_per_tok": k}
    counts = sizing.parameter_counts(cfg)
    assert (counts.total, counts.active) == (total, active)
    assert counts.experts == L * E * expert and counts.lm_head == V * h and counts.embedding == V * h
    assert counts.matmul_active == L * (attn + h * E + k * expert)  # what one token multiplies through (norms excluded)


def test_capacity_plan_llama_8b_on_80_gib():
    arch = sizing.load_arch("Llama-3.1-8B")
    plan = sizing.plan_kv_capacity(arch, memory_gib=80, context=8192, utilization=0.9, target_sequences=16, overhead_gib=0)
    budget = 80 * GiB * 0.9 - 8_030_261_248 * 2  # 61,248,888,832 B of KV
    assert plan.kv_budget_gib * GiB == pytest.approx(budget)
    assert plan.max_sequences == 57  # budget / 1 GiB per 8k sequence = 57.04
    assert plan.kv_tokens == 467_291  # budget / 131,072 B = 467,291.9
    assert plan.largest_context_for_target == 29_200  # budget / 16 / 131,072 = 29,205.9 → whole blocks of 16
    assert plan.weights_fit


def test_weights_that_do_not_fit_leave_no_kv():
    plan = sizing.plan_kv_capacity(sizing.load_arch("Llama-3.1-70B"), memory_gib=80, context=8192, target_sequences=1)
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
        sizing.plan_kv_capacity(sizing.load_arch("Llama-3.1-8B"), **args)


def test_bad_utilization_and_dtype():
    arch = sizing.load_arch("Llama-3.1-8B")
    with pytest.raises(KVLabError, match="utilization must be a fraction"):
        sizing.plan_kv_capacity(arch, memory_gib=80, context=8192, utilization=1.5)
    with pytest.raises(KVLabError, match="Unknown dtype 'fp7'.*bf16"):
        sizing.bytes_per_token(arch, "fp7")


def test_config_path_and_folder(tmp_path):
    import json

    cfg = sizing.load_preset("Llama-3.1-8B")["config"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    arch = sizing.load_arch(str(tmp_path))
    assert arch.kv_heads == 8 and arch.params == 8_030_261_248


def test_qwen3_next_counts_its_attention_layers_only_and_a_state_per_sequence():
    """Qwen3-Next-80B-A3B (transformers' Qwen3NextConfig defaults): 48 layers, one in four full attention (2 KV heads of
    256), the rest Gated DeltaNet with a fixed-size state per sequence (``vllm/.../mamba_utils.py``)."""
    arch = sizing.KVArch.from_config({"model_type": "qwen3_next"})
    assert (arch.total_layers, arch.layers, arch.state_layers) == (48, 12, 36)
    assert sizing.bytes_per_token(arch, "bf16") == 12 * 2 * 2 * 256 * 2 == 24_576  # not 48 layers' 98,304
    conv = (4 - 1) * (2 * 16 * 128 + 32 * 128)  # kernel − 1 positions of the q, k and v channels
    recurrent = 32 * 128 * 128  # value heads × value dim × key dim
    assert arch.state_elements == conv + recurrent
    per_sequence = 36 * (conv + recurrent) * 2
    assert sizing.state_bytes(arch, "bf16") == per_sequence
    assert sizing.kv_bytes(arch, 1000, "bf16", sequences=3) == 3 * (1000 * 24_576 + per_sequence)


def test_jamba_and_granite_4_style_hybrids_by_hand():
    jamba = sizing.KVArch.from_config({"model_type": "jamba"})  # Mamba-1 layers, attention every 8th from the 5th
    assert (jamba.layers, jamba.state_layers) == (32 // 8, 32 - 32 // 8)
    assert sizing.bytes_per_token(jamba, "bf16") == 2 * 4 * 8 * 128 * 2
    inner = 2 * 4096  # expand × hidden
    assert jamba.state_elements == (4 - 1) * inner + inner * 16
    kinds = ["mamba"] * 3 + ["attention"] + ["mamba"] * 3 + ["attention"]
    granite = sizing.KVArch.from_config({"model_type": "granitemoehybrid", "num_hidden_layers": 8, "layers_block_type": kinds,
                                        "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 4,
                                        "mamba_n_heads": 32, "mamba_d_head": 64, "mamba_d_state": 128,
                                        "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 2})
    assert (granite.layers, granite.state_layers) == (2, 6)
    assert sizing.bytes_per_token(granite, "bf16") == 2 * 2 * 4 * (1024 // 16) * 2
    assert granite.state_elements == (4 - 1) * (2 * 1024 + 2 * 1 * 128) + 32 * 64 * 128  # Mamba-2: conv + heads × dim × state


def test_vllm_pads_a_hybrid_model_s_pages_to_one_size():
    """vLLM raises the attention block until one layer's page holds one layer's state (Qwen3-Next: 544 tokens from 16,
    the size vLLM logs for it), pads the state to that page, and a request holds two pages per state group with
    prefix caching on (``mamba_cache_mode="align"``), one without."""
    arch = sizing.KVArch.from_config({"model_type": "qwen3_next"})
    state_page = arch.state_elements * 2
    plan = sizing.vllm_kv_plan(arch, 8 * 2**30, 8192, "bf16", block_size=16)
    assert plan.block_size == 16 * -(-state_page // (16 * 2 * 2 * 256 * 2)) == 544
    assert (plan.groups_full, plan.groups_state, plan.group_size) == (1, 3, 12)
    page = 544 * 2 * 2 * 256 * 2
    assert plan.num_blocks == 8 * 2**30 // (12 * page)
    assert plan.blocks_per_request == -(-8192 // 544) + 3 * 2
    assert sizing.vllm_kv_plan(arch, 8 * 2**30, 8192, "bf16", 16, prefix_caching=False).blocks_per_request == -(-8192 // 544) + 3
