"""Timing arithmetic on a small fake RequestOutput (pure logic; the real engine is tested elsewhere)."""

from types import SimpleNamespace

import pandas as pd
import pytest

from kvlab import timing
from kvlab.runtime.errors import KVLabError


def fake_output(n_out=11, queued=10.0, scheduled=10.5, first=11.0, last=12.0, ttft=1.2, cached=0):
    metrics = SimpleNamespace(num_generation_tokens=n_out, queued_ts=queued, scheduled_ts=scheduled,
                              first_token_ts=first, last_token_ts=last, first_token_latency=ttft, num_preemptions=0)
    return SimpleNamespace(request_id="r1", prompt_token_ids=list(range(40)), num_cached_tokens=cached, metrics=metrics)


def test_request_timing_phases_and_definitions():
    row = timing.request_timing(fake_output())
    assert row["prompt_tokens"] == 40 and row["output_tokens"] == 11
    assert row["queue_s"] == pytest.approx(0.5)
    assert row["prefill_s"] == pytest.approx(0.5)
    assert row["decode_s"] == pytest.approx(1.0)
    assert row["tpot_s"] == pytest.approx(0.1)  # 1.0 s over 10 gaps: the first token belongs to TTFT
    assert row["e2e_s"] == pytest.approx(2.2)  # TTFT (from arrival) + decode


def test_single_token_has_no_tpot():
    row = timing.request_timing(fake_output(n_out=1, last=11.0))
    assert row["tpot_s"] != row["tpot_s"]  # NaN


def test_missing_metrics_explains_how_to_fix():
    out = SimpleNamespace(request_id="x", metrics=None)
    with pytest.raises(KVLabError, match="make_engine"):
        timing.request_timing(out)


def test_timeline_is_relative_to_queue():
    tl = timing.timeline(fake_output())
    assert list(tl.event) == ["queued", "scheduled", "first token", "last token"]
    assert list(tl.t_ms) == pytest.approx([0, 500, 1000, 2000])


def test_p95_matches_linear_interpolation():
    assert timing.p95([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]) == pytest.approx(20.0)
    assert timing.p95([1.0, 2.0]) == pytest.approx(1.95)
    assert timing.p95([3.0]) == 3.0


def test_summarize_reports_median_and_p95_per_group():
    df = pd.DataFrame({"g": ["a"] * 3 + ["b"] * 3, "ttft_s": [1, 2, 9, 4, 5, 6]})
    s = timing.summarize(df, ["ttft_s"], by=["g"]).set_index("g")
    assert s.loc["a", "ttft_s_p50"] == 2 and s.loc["b", "ttft_s_p50"] == 5
    assert s.loc["a", "ttft_s_p95"] == pytest.approx(8.3)
    assert s.loc["a", "requests"] == 3


def test_relative_ci_is_narrow_for_a_tight_point_wide_for_a_noisy_one_and_shrinks_with_repeats():
    tight, noisy = [0.100, 0.101, 0.099], [0.10, 0.13, 0.08]
    assert timing.relative_ci(tight) < timing.PRECISION < timing.relative_ci(noisy)
    assert timing.relative_ci(noisy * 4) < timing.relative_ci(noisy)  # same spread, more repeats: a narrower interval
    assert timing.relative_ci([0.1]) == float("inf")  # one value: nothing known about its spread
