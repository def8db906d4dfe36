"""Lower bounds: FLOPs and bytes counted by hand for the course model (pure arithmetic)."""

import json

import pandas as pd
import pytest

from kvlab import prefill_decode, roofline
from kvlab.runtime.errors import KVLabError
from kvlab.sizing import load_preset

SMOL = load_preset("SmolLM2-135M")["config"]
# per layer: q and o 576×576, k and v 576×192, gate/up/down 576×1536
LINEAR = 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)  # 106,168,320
LM_HEAD = 49152 * 576  # 28,311,552 (tied to the embedding, read once per step)


def cost():
    return roofline.ModelCost.from_config(SMOL, bytes_per_param=4, kv_bytes_per_token=46080)


def test_linear_and_head_parameters():
    c = cost()
    assert c.linear_params == LINEAR == 106_168_320 and c.lm_head_params == LM_HEAD


def test_prefill_flops_counts_linear_head_and_causal_attention():
    n = 1024
    attention = 4 * (9 * 64) * 30 * n * (n + 1) / 2
    assert cost().prefill_flops(n) == pytest.approx(2 * LINEAR * n + 2 * LM_HEAD + attention)


def test_decode_step_reads_weights_and_kv():
    assert cost().decode_step_bytes(0) == (LINEAR + LM_HEAD) * 4 == 537_919_488
    assert cost().decode_step_bytes(1000) == 537_919_488 + 46_080_000


def test_ttft_bound_is_the_larger_of_compute_and_memory_time():
    limits = roofline.MachineLimits(matmul_flops=1e11, bandwidth=1e10, dtype="float32", device="cpu", threads=2)

    def flops(n):
        return 2 * LINEAR * n + 2 * LM_HEAD + 4 * (9 * 64) * 30 * n * (n + 1) / 2

    def moved(n):
        return (LINEAR + LM_HEAD) * 4 + 46080 * n  # every weight read once, the prompt's KV written

    for n in (1, 16, 100, 1000):
        assert cost().ttft_bound_s(n, limits) == pytest.approx(max(flops(n) / 1e11, moved(n) / 1e10))
    # ridge point 10 FLOP/byte: fp32 weights (4 B) give 2 FLOPs per weight per token → compute-bound from ~20 tokens,
    # a little later because writing each token's 46 kB of KV costs memory time too
    assert roofline.ridge_point(limits) == 10
    n_star = cost().compute_bound_from(limits)
    assert n_star == next(n for n in range(1, 1000) if flops(n) / 1e11 >= moved(n) / 1e10) == 26
    assert cost().ttft_bound_s(n_star, limits) == pytest.approx(cost().prefill_flops(n_star) / 1e11)
    assert cost().ttft_bound_s(n_star - 1, limits) > cost().prefill_flops(n_star - 1) / 1e11  # below it: memory-bound


def test_an_8b_model_on_an_h100_short_prompts_are_bound_by_weight_reads():
    """Llama-3.1-8B in bf16: a 16-token prompt needs ~0.24 ms of compute but ~4.5 ms to read 15 GB of weights."""
    h100 = roofline.H100_SXM_BF16
    llama = roofline.ModelCost.from_config(load_preset("Llama-3.1-8B")["config"], bytes_per_param=2,
                                          kv_bytes_per_token=2 * 32 * 8 * 128 * 2)
    weights = 8_030_261_248 - 128_256 * 4096  # all but the input embedding (a lookup; the LM head is untied)
    assert llama.linear_params + llama.lm_head_params == weights - 4096 * 65  # …and the 65 RMSNorm vectors
    compute, memory = 2 * weights * 16 / 989.4e12, weights * 2 / 3.35e12
    assert compute == pytest.approx(0.24e-3, rel=0.05) and memory == pytest.approx(4.5e-3, rel=0.05)
    assert llama.ttft_bound_s(16, h100) == pytest.approx(memory, rel=0.01)
    # ridge 295 FLOP/byte × 2 bytes per weight ÷ 2 FLOPs per weight per token ≈ 295 tokens
    assert roofline.ridge_point(h100) == pytest.approx(295.3, rel=0.01)
    assert llama.compute_bound_from(h100) == pytest.approx(295, rel=0.1)  # a little later: each token writes 128 KiB of KV


def test_mixture_of_experts_decode_reads_only_the_routed_experts():
    cfg = {"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2}
    moe = roofline.ModelCost.from_config(cfg, bytes_per_param=2, kv_bytes_per_token=0)
    expert = 3 * 4096 * 14336
    dense = 32 * (4096 * 4096 * 2 + 2 * 4096 * 1024 + 4096 * 8) + 32000 * 4096  # attention, routers, LM head
    assert moe.decode_step_bytes(0) == (dense + 32 * 2 * expert) * 2  # 2 of 8 experts per layer
    assert moe.weights_read(1000) == (dense + 32 * 8 * expert) * 2  # a long prompt touches all of them


def test_add_bounds_ratios():
    limits = roofline.MachineLimits(matmul_flops=1e11, bandwidth=1e10, dtype="float32", device="cpu", threads=2)
    df = pd.DataFrame({"prompt_tokens": [100], "output_tokens": [11], "ttft_s": [1.0], "tpot_s": [0.2], "prefill_s": [0.9]})
    out = roofline.add_bounds(df, cost(), limits)
    assert out.ttft_bound_s[0] == pytest.approx(max(cost().prefill_flops(100) / 1e11, cost().prefill_bytes(100) / 1e10))
    assert out.ttft_bound_kind[0] == "compute"
    assert out.tpot_bound_s[0] == pytest.approx(cost().decode_step_bytes(105.5) / 1e10)
    assert out.tpot_over_bound[0] == pytest.approx(0.2 / out.tpot_bound_s[0])


def test_crossover_is_interpolated():
    medians = pd.DataFrame({"prompt_tokens": [100, 200, 400], "prefill_s": [0.1, 0.2, 0.4], "tpot_s": [0.01, 0.01, 0.01]})
    # decode of 31 tokens = 30 × 0.01 = 0.3 s; prefill reaches 0.3 s halfway between 200 and 400
    assert prefill_decode.crossover(medians, 31) == pytest.approx(300)
    assert prefill_decode.crossover(medians, 100) is None  # decode 0.99 s: never crossed in range


@pytest.mark.slow
def test_limits_are_measured_and_plausible():
    limits = roofline.measure_limits("float32", quick=True)
    assert 1e9 < limits.matmul_flops < 1e14 and 1e8 < limits.bandwidth < 1e13
    assert json.dumps(limits.as_dict())
    alone = roofline.measure_limits("float32", quick=True, matmul=False)  # the bandwidth alone, beside a decode fit
    assert alone.matmul_flops == 0 and 1e8 < alone.bandwidth < 1e13
    assert roofline.best_of(limits, alone).matmul_flops == limits.matmul_flops


def test_a_verifying_pass_is_bound_by_weight_reads_until_its_tokens_reach_the_ridge():
    """Speculative decoding (lesson 09): one pass over n new tokens after c cached ones needs logits for all n; on an
    8B model on an H100 it stays bound by the 15 GB weight read until n approaches the ridge (~295 tokens)."""
    llama = roofline.ModelCost.from_config(load_preset("Llama-3.1-8B")["config"], bytes_per_param=2,
                                          kv_bytes_per_token=2 * 32 * 8 * 128 * 2)
    width, layers = 32 * 128, 32
    n, c = 5, 1000
    attention = 4 * width * layers * n * (c + (n + 1) / 2)
    assert llama.forward_flops(n, c) == pytest.approx(2 * (llama.linear_params + llama.lm_head_params) * n + attention)
    h100 = roofline.H100_SXM_BF16
    one, five = llama.forward_bound_s(1, c, h100), llama.forward_bound_s(5, c, h100)
    assert five / one == pytest.approx(1.0, abs=0.01)  # verifying k + 1 = 5 tokens costs one step's weight read
    assert llama.forward_bound_s(1024, c, h100) / one > 2  # far past the ridge it is compute-bound: no longer free
    small = cost()  # the course model on a 2-core CPU's balance (10 FLOP/byte): compute-bound from a handful of tokens
    cpu = roofline.MachineLimits(matmul_flops=1e11, bandwidth=1e10, dtype="float32", device="cpu", threads=2)
    assert small.forward_bound_s(64, 256, cpu) > 2 * small.forward_bound_s(1, 256, cpu)


def test_decode_fit_recovers_overhead_and_bandwidth_with_their_errors():
    import numpy as np

    bytes_ = np.array([2.7e8, 5.6e8, 8.0e8, 9.6e8])
    exact = 0.015 + bytes_ / 40e9  # 15 ms per step, 40 GB/s
    fit = roofline.fit_decode(bytes_, exact)
    assert abs(fit.overhead_s - 0.015) < 1e-9 and abs(fit.bandwidth - 40e9) / 40e9 < 1e-6 and fit.r2 > 0.999999
    noisy = exact * (1 + np.array([0.02, -0.01, 0.015, -0.02]))
    fit = roofline.fit_decode(bytes_, noisy)
    assert fit.overhead_se_s > 0 and fit.bandwidth_lo < fit.bandwidth < fit.bandwidth_hi
    assert abs(fit.overhead_s - 0.015) < 3 * fit.overhead_se_s + 1e-3
    assert 0.5 < fit.memory_share(9.6e8) < 0.7  # 24 ms of memory in a 39 ms step
    with pytest.raises(KVLabError, match="at least three models"):
        roofline.fit_decode([1e8, 2e8], [0.01, 0.02])
