"""The paged-cache arithmetic (pure logic): blocks per sequence, budgets refused before any engine starts, and the LRU
prediction of when a shared prefix survives."""

from __future__ import annotations

import pytest

from kvlab import paged
from kvlab.runtime.errors import KVLabError


def test_blocks_needed_rounds_up_to_whole_blocks():
    assert [paged.blocks_needed(n, 16) for n in (1, 16, 17, 32, 33)] == [1, 1, 2, 2, 3]


def test_a_budget_smaller_than_one_sequence_names_the_smallest_that_works():
    with pytest.raises(KVLabError, match=r"A KV budget of 3 blocks \(384 tokens\) cannot hold one sequence of max_model_len "
                                         r"1,024 tokens; use at least 8 blocks or a smaller max_model_len"):
        paged.check_budget(3, 128, 1024)
    paged.check_budget(8, 128, 1024)


def traffic(pattern: str, prefix_blocks: int = 4, block: int = 16) -> list[tuple[str, list[int]]]:
    """S = a shared-prefix request (prefix + 5 tokens), U = a unique request of 3 blocks + 2 tokens."""
    return [("shared", [0] * (prefix_blocks * block + 5)) if c == "S" else ("unique", [1] * (3 * block + 2)) for c in pattern]


def test_prefix_survives_while_prefix_plus_blocks_cached_since_plus_partial_and_null_block_fit():
    reqs = traffic("SUSUUS")
    # after S: 1 unique (3 full blocks) → needs 4 + 3 + 1 + 1 = 9; after the second S: 2 uniques → 4 + 6 + 2 = 12
    assert paged.predicted_prefix_hits(reqs, 4, 16, 2, pool_blocks=9) == [None, None, True, None, None, False]
    assert paged.predicted_prefix_hits(reqs, 4, 16, 2, pool_blocks=12) == [None, None, True, None, None, True]
    assert paged.survival_budget(reqs, 4, 16, 2) == 12


def test_output_tokens_that_fill_a_block_count_as_cached_blocks():
    reqs = [("shared", [0] * 64), ("unique", [1] * 47), ("shared", [0] * 64)]
    assert paged.survival_budget(reqs, 4, 16, output_tokens=0) == 4 + 2 + 2   # 47 tokens: 2 full blocks
    assert paged.survival_budget(reqs, 4, 16, output_tokens=1) == 4 + 3 + 2   # 48 tokens: 3 full blocks


def test_shared_prefix_traffic_has_the_asked_share_and_a_common_prefix():
    class Tok:
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

        def __len__(self):
            return 256

    reqs = paged.shared_prefix_traffic(Tok(), 200, 0.5, 64, 8, 40, seed=1)
    shared = [ids for label, ids in reqs if label == "shared"]
    assert 0.35 < len(shared) / 200 < 0.65 and all(ids[:64] == shared[0][:64] and len(ids) == 72 for ids in shared)
    with pytest.raises(KVLabError, match="shared_share must be a fraction"):
        paged.shared_prefix_traffic(Tok(), 10, 1.5, 64, 8, 40)


def test_budgets_in_any_unit_become_whole_blocks():
    assert paged.to_blocks([0.5, 1.0, 1.24, 1.25], "survival", 128, 128 * 46_080, survival=16) == [8, 16, 19, 20]
    assert paged.to_blocks([1000, 1024, 2048], "tokens", 128, 128 * 46_080, survival=16) == [7, 8, 16]
    gib_per_block = 128 * 46_080 / 2**30
    assert paged.to_blocks([10 * gib_per_block], "GiB", 128, 128 * 46_080, survival=16) == [10]
    with pytest.raises(KVLabError, match="Unknown budget unit 'MB'"):
        paged.to_blocks([1], "MB", 128, 128 * 46_080, survival=16)


def test_traffic_longer_than_the_context_and_a_prefix_under_one_block_are_one_sentence():
    assert paged.check_traffic(512, 40, 400, 2, max_context=8192) == 554
    with pytest.raises(KVLabError, match=r"The shared prefix \(9,000 tokens\) plus its suffix \(40\) and the output \(2\) is "
                                         r"longer than the model's context of 8,192 tokens; use a shorter shared prefix\."):
        paged.check_traffic(9000, 40, 400, 2, max_context=8192)
    with pytest.raises(KVLabError, match="A unique prompt of 9,000 tokens"):
        paged.check_traffic(512, 40, 9000, 2, max_context=8192)
    assert paged.prefix_blocks_of(300, 128) == 2
    with pytest.raises(KVLabError, match=r"shorter than one KV block \(128 tokens\).*at least 128 tokens"):
        paged.prefix_blocks_of(100, 128)


def test_expected_stored_blocks_are_full_computed_blocks_less_the_hits():
    import pandas as pd

    rows = pd.DataFrame({"prompt_tokens": [401, 401, 300], "output_tokens": [2, 2, 40], "cached_tokens": [0, 384, 0]})
    # 402 computed tokens → 3 full blocks (none hit), then 3 − 3 hit = 0, then 339 → 2
    assert paged.expected_stored(rows, 128) == 3 + 0 + 2


def test_budget_table_counts_hits_predictions_and_joins_the_engine_counters():
    import pandas as pd

    res = pd.DataFrame({"budget_blocks": [8, 8, 8, 16, 16, 16], "label": ["shared", "unique", "shared"] * 2,
                        "hit": [False, False, False, False, False, True], "predicted_hit": [None, None, False, None, None, True],
                        "ttft_s": [0.2, 0.3, 0.2, 0.2, 0.3, 0.05], "cached_tokens": [0, 0, 0, 0, 0, 512]})
    engine = pd.DataFrame({"budget_blocks": [8, 16], "engine_hit_tokens": [0, 512], "engine_query_tokens": [1500, 1500]})
    t = paged.budget_table(res, engine, 128, 128 * 46_080).set_index("budget_blocks")
    assert t.loc[16, "prefix_hits"] == 1 and t.loc[8, "prefix_hits"] == 0 and t.loc[16, "prediction_agrees"] == 1.0
    assert t.loc[16, "budget_tokens"] == 2048 and abs(t.loc[16, "token_hit_rate"] - 512 / 1500) < 1e-12
    assert t.loc[16, "shared_ttft_p50_ms"] < t.loc[8, "shared_ttft_p50_ms"]


@pytest.mark.notebook
def test_lab_l08_hit_rate_rises_with_the_budget_and_events_agree_with_the_counters(tmp_path, second_model):
    """Lab L08 headless on the second model (its one CI run, see tests/test_second_model.py): its own cell asserts the
    events against the engine's counters."""
    import json

    import pandas as pd

    from kvlab.course import labs
    from kvlab.runtime import kernels
    from kvlab.runtime.model import SECOND_MODEL

    out = tmp_path / "out"
    params = {"budgets": [0.6, 1.0], "requests": 10, "model": SECOND_MODEL, "output_dir": str(out)}
    kernels.execute(str(labs.lab_path("L08_kv_budget")), str(tmp_path / "run.ipynb"), cwd=str(labs.LAB_DIR),
                    parameters=params)
    budgets = pd.read_csv(out / "budgets.csv").sort_values("budget_blocks")
    results, events = pd.read_parquet(out / "results.parquet"), pd.read_csv(out / "events.csv")
    small, large = budgets.iloc[0], budgets.iloc[-1]
    assert small.token_hit_rate < large.token_hit_rate and small.prefix_blocks_evicted > 0
    assert large.prefix_hits == large.shared_requests - 1  # at the survival budget every shared request but the first hits
    assert (budgets.stored_events == budgets.expected_stored).all() and (budgets.prediction_agrees == 1).all()
    assert set(results.budget_blocks) == set(budgets.budget_blocks) == set(events.budget_blocks)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["parameters"]["budgets"] == [0.6, 1.0] and meta["engine"]["block_size"] > 0
    assert meta["parameters"]["model"] == SECOND_MODEL
    assert (out / "hit_rate.html").exists()


@pytest.mark.notebook
def test_lab_l08_traffic_longer_than_the_context_fails_before_any_engine_starts(tmp_path):
    """Lab L08 refuses traffic longer than the context in one sentence before an engine starts (seconds, no engine)."""
    import papermill as pm

    from kvlab.course import labs
    from kvlab.runtime import kernels

    with pytest.raises(pm.PapermillExecutionError, match="longer than the model's context"):
        kernels.execute(str(labs.lab_path("L08_kv_budget")), str(tmp_path / "run.ipynb"), cwd=str(labs.LAB_DIR),
                        parameters={"shared_prefix_tokens": 100_000, "output_dir": str(tmp_path / "out")})
    assert not (tmp_path / "out").exists()


def test_preempted_hits_add_up_the_scheduler_s_stats_for_readmitted_requests():
    from types import SimpleNamespace

    from kvlab import paged

    counter = paged.PreemptedHits()
    step = SimpleNamespace(prefix_cache_stats=SimpleNamespace(preempted_requests=1, preempted_queries=300, preempted_hits=256))
    counter.record(step, None)
    counter.record(SimpleNamespace(prefix_cache_stats=None), None)  # a step with no cache stats
    counter.record(step, None)
    assert (counter.readmissions, counter.queried_tokens, counter.hit_tokens, counter.recomputed_tokens) == (2, 600, 512, 88)
