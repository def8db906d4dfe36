"""Stall flagging on synthetic series: a known spike is flagged and re-measured, a clean series is not."""

import numpy as np
import pandas as pd

from kvlab import outliers, timing


def _series(values, point=128):
    return pd.DataFrame({"prompt_tokens": point, "ttft_s": values, "repeat": range(len(values))})


def test_a_known_spike_is_flagged_and_a_clean_noisy_series_is_not():
    rng = np.random.default_rng(0)
    noisy = 0.188 * (1 + 0.08 * rng.standard_normal(20))  # ±8 % noise: ordinary on a shared machine
    assert not outliers.flag(_series(noisy), ["prompt_tokens"], ["ttft_s"]).any()
    spiked = noisy.copy()
    spiked[7] = 0.927  # lesson 02's stall: TTFT p95 927 ms against a 188 ms median
    flags = outliers.flag(_series(spiked), ["prompt_tokens"], ["ttft_s"])
    assert flags.tolist() == [i == 7 for i in range(20)]


def test_spread_floor_and_small_groups_keep_tight_or_tiny_series_unflagged():
    assert not outliers.flag(_series([0.100, 0.100, 0.100, 0.140]), ["prompt_tokens"], ["ttft_s"]).any()  # +40 %: noise
    assert outliers.flag(_series([0.100, 0.100, 0.100, 0.160]), ["prompt_tokens"], ["ttft_s"]).iloc[-1]  # +60 %: stall
    assert not outliers.flag(_series([0.1, 5.0]), ["prompt_tokens"], ["ttft_s"]).any()  # two rows: nothing to judge by
    faster = outliers.flag(_series([0.1, 0.1, 0.1, 0.001]), ["prompt_tokens"], ["ttft_s"])
    assert not faster.any()  # only slower requests are stalls


def test_points_are_judged_separately():
    df = pd.concat([_series([0.1, 0.11, 0.1, 0.1], 128), _series([1.0, 1.1, 1.0, 1.05], 2048)], ignore_index=True)
    assert not outliers.flag(df, ["prompt_tokens"], ["ttft_s"]).any()  # 2048's times are not stalls of 128's point


def test_remeasure_keeps_the_stall_shown_adds_a_new_row_and_percentiles_skip_it():
    df = _series([0.20, 0.19, 0.21, 0.20, 3.4])
    calls = []

    def measure(row):
        calls.append(int(row["repeat"]))
        return {"prompt_tokens": int(row.prompt_tokens), "ttft_s": 0.205, "repeat": int(row["repeat"])}

    out = outliers.remeasure(df, ["prompt_tokens"], ["ttft_s"], measure)
    assert calls == [4] and len(out) == 6
    assert out.outlier.tolist() == [False] * 4 + [True, False] and out.remeasured.tolist() == [False] * 5 + [True]
    s = timing.summarize(out, ["ttft_s"])
    assert s.requests.iloc[0] == 5 and s.ttft_s_p95.iloc[0] < 0.21  # the 3.4 s stall is not the p95
    line = outliers.report(out, ["ttft_s"])
    assert line.startswith("1 of 5 timed requests flagged") and "3,400 ms" in line


def test_a_re_measurement_that_stalls_again_is_measured_once_more():
    df = _series([0.20, 0.19, 0.21, 0.20, 3.4])
    again = iter([5.0, 0.2])
    out = outliers.remeasure(df, ["prompt_tokens"], ["ttft_s"],
                             lambda row: {"prompt_tokens": 128, "ttft_s": next(again), "repeat": int(row["repeat"])})
    assert out.outlier.sum() == 2 and out.remeasured.sum() == 2 and len(outliers.clean(out)) == 5
    assert "2 of 5 timed requests" in outliers.report(out)
