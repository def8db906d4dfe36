"""Lower bounds: FLOPs and bytes counted by hand for the course model (pure arithmetic)."""

import json

import pandas as pd
import pytest

from kvlab import experiments, roofline
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


def test_add_bounds_ratios():
    limits = roofline.MachineLimits(matmul_flops=1e11, bandwidth=1e10, dtype="float32", device="cpu", threads=2)
    df = pd.DataFrame({"prompt_tokens": [100], "output_tokens": [11], "ttft_s": [1.0], "tpot_s": [0.2], "prefill_s": [0.9]})
    out = roofline.add_bounds(df, cost(), limits)
    assert out.ttft_bound_s[0] == pytest.approx(cost().prefill_flops(100) / 1e11)
    assert out.tpot_bound_s[0] == pytest.approx(cost().decode_step_bytes(105.5) / 1e10)
    assert out.tpot_over_bound[0] == pytest.approx(0.2 / out.tpot_bound_s[0])


def test_crossover_is_interpolated():
    medians = pd.DataFrame({"prompt_tokens": [100, 200, 400], "prefill_s": [0.1, 0.2, 0.4], "tpot_s": [0.01, 0.01, 0.01]})
    # decode of 31 tokens = 30 × 0.01 = 0.3 s; prefill reaches 0.3 s halfway between 200 and 400
    assert experiments.crossover(medians, 31) == pytest.approx(300)
    assert experiments.crossover(medians, 100) is None  # decode 0.99 s: never crossed in range


def test_limits_are_measured_and_plausible():
    limits = roofline.measure_limits("float32", quick=True)
    assert 1e9 < limits.matmul_flops < 1e14 and 1e8 < limits.bandwidth < 1e13
    assert json.dumps(limits.as_dict())
