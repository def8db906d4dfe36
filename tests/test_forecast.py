"""The forecast on vLLM's own scheduler and lesson 10's scorecard: pure logic on small tables, then — on the real
engine — the forecast's steps equal the engine's step for step (compositions, KV blocks, prefix hits), and a grid is
measured only after its predictions are on disk."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest

from kvlab import forecast, scorecard, stepmodel
from kvlab.runtime.errors import KVLabError
from kvlab.workload import Arrival
from tests.test_stepmodel import COST, LIMITS, MAX

MODEL = stepmodel.StepModel("max", MAX, dict.fromkeys(MAX, 0.01), LIMITS, COST, residuals=[-0.02, 0.01, 0.03])


def test_one_step_costs_the_same_with_or_without_a_table():
    steps = [stepmodel.Step(0.0, ((512, 0),)), stepmodel.decode_step(8, 1024), stepmodel.Step(0.0, ((256, 512), (1, 90)))]
    for form in ("max", "sum"):
        m = stepmodel.StepModel(form, MAX, {}, LIMITS, COST)
        assert np.allclose([m.step_ms(s) for s in steps], m.predict_ms(steps))


def test_drawn_models_scatter_around_the_fit_by_its_own_errors():
    drawn = forecast.draws(MODEL, 200, seed=1)
    fixed = [m.constants["fixed_ms"] for m, _ in drawn]
    assert abs(np.mean(fixed) - MAX["fixed_ms"]) < 0.01 and 0.005 < np.std(fixed) < 0.02
    scales = {round(s, 6) for _, s in drawn}
    assert scales <= {round(1 / (1 + r), 6) for r in MODEL.residuals}  # a whole-run factor from the model's own misses


def test_drawn_drafts_and_acceptances_follow_the_measured_rates():
    spec = forecast.Speculation.from_counters({"drafts": 60, "draft_tokens": 210, "accepted_tokens": 120,
                                               "acceptance_by_position": [0.9, 0.6, 0.3, 0.2]}, decode_steps=80)
    assert spec.coverage == pytest.approx(0.75) and spec.draft_length == pytest.approx(3.5)
    rng = np.random.default_rng(0)
    drafted = [spec.draft(rng) for _ in range(20_000)]
    assert np.mean([d > 0 for d in drafted]) == pytest.approx(0.75, abs=0.02)
    assert np.mean([d for d in drafted if d]) == pytest.approx(3.5, abs=0.03)
    accepted = np.array([spec.accepted(4, rng) for _ in range(20_000)])
    assert [float(np.mean(accepted >= j)) for j in (1, 2, 3, 4)] == pytest.approx([0.9, 0.6, 0.3, 0.2], abs=0.02)
    assert spec.accepted(1, rng) <= 1  # never more than was drafted
    assert forecast.Speculation.from_counters({"drafts": 0}, 50).coverage == 0.0  # nothing drafted: plain decoding


def requests_table(ttft_ms: list[float]) -> pd.DataFrame:
    n = len(ttft_ms)
    return pd.DataFrame({"ttft_s": np.array(ttft_ms) / 1e3, "tpot_s": [0.05] * n, "e2e_s": [1.0] * n,
                         "arrival_s": np.arange(n, dtype=float), "last_token_s": np.arange(n) + 1.0,
                         "output_tokens": [10] * n, "prompt_tokens": [100] * n, "cached_tokens": [50] * n,
                         "preemptions": [0] * n})


def test_point_metrics_are_percentiles_throughput_and_hit_rate():
    m = forecast.point_metrics(requests_table([100, 200, 300, 400, 500]))
    assert m["ttft_p50_ms"] == pytest.approx(300) and m["ttft_p90_ms"] == pytest.approx(460)
    assert m["throughput_tok_s"] == pytest.approx(50 / 5) and m["hit_rate"] == pytest.approx(0.5)


def fake_grid() -> list[scorecard.GridPoint]:
    return [scorecard.GridPoint("a", "batch", "main", [Arrival("a1", [1, 2, 3], 4, 0.0)]),
            scorecard.GridPoint("b", "poisson", "main", [Arrival("b1", [4, 5], 4, 0.5)], rate_rps=2.0)]


def test_measuring_is_refused_without_predictions_after_an_edit_or_for_another_grid(tmp_path):
    grid = fake_grid()
    with pytest.raises(KVLabError, match="No predictions"):
        scorecard.check_predictions(grid, tmp_path)
    table = pd.DataFrame([{"point": "a", "metric": "tpot_p50_ms", "predicted": 50.0, "lo80": 45.0, "hi80": 55.0}])
    stamp = scorecard.write_predictions(table, grid, tmp_path)
    assert scorecard.check_predictions(grid, tmp_path)["sha256"] == stamp["sha256"]
    other = fake_grid()
    other[1].arrivals[0].at_s = 0.6
    with pytest.raises(KVLabError, match="another grid"):
        scorecard.check_predictions(other, tmp_path)
    (tmp_path / "predictions.csv").write_text((tmp_path / "predictions.csv").read_text().replace("50.0", "40.0"))
    with pytest.raises(KVLabError, match="changed after"):
        scorecard.check_predictions(grid, tmp_path)
    assert json.loads((tmp_path / "predictions.json").read_text())["points"] == 2


def test_the_scorecard_scores_errors_and_intervals():
    predictions = pd.DataFrame([
        {"point": "a", "kind": "batch", "metric": "ttft_p50_ms", "predicted": 330.0, "lo80": 290.0, "hi80": 350.0},
        {"point": "a", "kind": "batch", "metric": "hit_rate", "predicted": 0.52, "lo80": 0.52, "hi80": 0.52}])
    steps = pd.DataFrame({"blocks_used": [3, 5, 4]})
    card = scorecard.score(predictions, {"a": (requests_table([100, 200, 300, 400, 500]), steps)})
    assert card.error.tolist() == pytest.approx([0.1, 0.02]) and card.inside.tolist() == [True, False]
    board = scorecard.summary(card).set_index("metric")
    assert board.loc["ttft_p50_ms", "median_abs_error"] == pytest.approx(0.1)


def test_interval_coverage_leaves_out_the_metrics_forecast_exact():
    card = pd.DataFrame({"metric": ["tpot_p50_ms", "ttft_p50_ms", "peak_blocks", "peak_blocks", "hit_rate"],
                         "inside": [True, False, True, True, True]})
    assert scorecard.coverage(card) == (pytest.approx(2 / 3), 2, 3)  # the blocks have no interval to be inside


def measured_beside_busy_canaries(tmp_path, monkeypatch, point_s: float = 0.0, **kwargs) -> tuple[list[str], dict]:
    """Pure logic with stand-ins for the engine: points a and b, each taking ``point_s``; canaries read 1.0, 1.0, then
    1.3 after point b (the machine busy), 1.0 and 1.02 around b's second run. The points run, and what was kept."""
    grid = fake_grid()
    scorecard.write_predictions(pd.DataFrame([{"point": "a", "metric": "tpot_p50_ms", "predicted": 1.0, "lo80": 1.0,
                                               "hi80": 1.0}]), grid, tmp_path)
    speeds, runs = iter([1.0, 1.0, 1.3, 1.0, 1.02]), []

    def fake_point(llm, point):
        runs.append(point.name)
        time.sleep(point_s)
        return pd.DataFrame({"run": [len(runs)]}), pd.DataFrame({"seconds": [0.1]})

    monkeypatch.setattr(scorecard, "speed_now", lambda llm, model, warm_up: next(speeds))
    monkeypatch.setattr(scorecard, "measure_point", fake_point)
    monkeypatch.setattr(scorecard, "run_workload", lambda llm, arrivals: None)
    return runs, scorecard.measure_grid({"main": object()}, grid, tmp_path, model=object(), retries=1.0, **kwargs)


def test_a_point_beside_a_slow_canary_is_measured_again_and_the_calmer_run_kept(tmp_path, monkeypatch):
    """b, beside the busy canary, is measured twice and its second run (calmer canaries) kept; a, beside calm ones, once."""
    runs, measured = measured_beside_busy_canaries(tmp_path, monkeypatch)
    assert runs == ["a", "b", "b"] and measured["b"][0].run.iloc[0] == 3 and measured["a"][0].run.iloc[0] == 1
    speed = scorecard.machine_speed(measured).set_index("point")
    assert speed.remeasured.tolist() == [False, True] and speed.loc["b", "first_slower"] == pytest.approx(0.3)
    assert speed.loc["b", "slower"] == pytest.approx(0.02) and speed.loc["b", "after"] == pytest.approx(1.02)


def test_a_busy_point_is_not_measured_again_past_the_time_allowed_for_it(tmp_path, monkeypatch):
    """The same busy canaries, but b's first run took longer than ``retry_s``: b is measured once."""
    runs, measured = measured_beside_busy_canaries(tmp_path, monkeypatch, point_s=0.05, retry_s=0.01)
    assert runs == ["a", "b"] and scorecard.machine_speed(measured).remeasured.tolist() == [False, False]


class ByteTokenizer:
    """Enough of a tokenizer for ``kvlab.prompts``: one token per byte of the course text."""

    name_or_path = "bytes"

    def __len__(self) -> int:
        return 256

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode())


def test_an_error_budget_with_no_miss_still_has_its_columns(tmp_path):
    card = pd.DataFrame([{"point": "a", "metric": "tpot_p50_ms", "error": 0.03}])
    budget = scorecard.error_budget(card, {}, {}, {}, {})
    assert budget.empty and {"point", "step_model_error", "came_from"} <= set(budget.columns)
    budget.to_csv(tmp_path / "b.csv", index=False)
    assert list(pd.read_csv(tmp_path / "b.csv").columns) == list(budget.columns)  # what the exercises read back


def test_a_grid_point_that_cannot_fit_is_refused_before_anything_runs():
    from types import SimpleNamespace

    small = forecast.Setup(None, SimpleNamespace(num_blocks=3), 4, None, None, max_model_len=64)  # 8 tokens of KV
    with pytest.raises(KVLabError, match="engine 'second', which was not started"):
        scorecard.check_grid([scorecard.GridPoint("x", "batch", "second", [])], {"main": small})
    with pytest.raises(KVLabError, match="Request 'a1' needs 9 tokens of KV but the engine's pool holds 8"):
        scorecard.check_grid([scorecard.GridPoint("a", "batch", "main", [Arrival("a1", [1] * 5, 4, 0.0)])], {"main": small})
    with pytest.raises(KVLabError, match="context is 64"):
        scorecard.check_grid([scorecard.GridPoint("a", "batch", "main", [Arrival("a1", [1] * 60, 8, 0.0)])], {"main": small})
    scorecard.check_grid(fake_grid(), {"main": forecast.Setup(None, SimpleNamespace(num_blocks=10), 4, None, None, 64)})


def test_every_grid_point_is_held_out_of_the_calibration():
    calibrated = {(p.batch, p.prompt_tokens) for p in stepmodel.calibration_points(True) + stepmodel.calibration_points(False)}
    toks = dict.fromkeys(("main", "budget 256", "second"), ByteTokenizer())
    for quick, least in ((True, 8), (False, 30)):
        grid = scorecard.held_out_grid(toks, 2.0, **scorecard.grid_sizes(quick))
        assert len(grid) + 1 >= least, len(grid)  # + the speculation point, on its own engine in the lesson
        assert len({p.name for p in grid}) == len(grid)
        shapes = {(len(p.runs()[0]), len(p.arrivals[0].prompt_ids)) for p in grid}
        assert not shapes & calibrated, shapes & calibrated
        rates = sorted(p.rate_rps / 2.0 for p in grid if p.kind == "poisson")
        assert rates[0] >= 0.25 and any(r > 1 for r in rates)  # below the forecast capacity, and one above it


def test_a_grid_sized_to_its_time_shortens_only_the_rates_below_capacity(monkeypatch):
    toks = dict.fromkeys(("main", "budget 256", "second"), ByteTokenizer())
    monkeypatch.setattr(scorecard, "predicted_seconds", lambda p, setup, model: max(a.at_s for a in p.arrivals) + 1.0)
    sizes, nothing = scorecard.grid_sizes(False), dict.fromkeys(toks)
    full, seconds = scorecard.grid_for_time(toks, 2.0, sizes, nothing, nothing, target_s=1e9)
    below = [p.name for p in full if p.kind == "poisson" and p.rate_rps <= 2.0]
    target = seconds.sum() - seconds[below].sum() / 2  # half the time the rates below capacity took
    short, short_seconds = scorecard.grid_for_time(toks, 2.0, sizes, nothing, nothing, target_s=target)

    def counts(grid: list, over: bool) -> list[int]:
        return [len(p.arrivals) for p in grid if p.kind == "poisson" and (p.rate_rps > 2.0) == over]

    assert [p.name for p in short] == [p.name for p in full]  # the same points, fewer Poisson requests
    assert sum(counts(short, False)) < sum(counts(full, False)) and min(counts(short, False)) >= 10
    assert counts(short, True) == counts(full, True)  # above capacity: the whole window, for its queue to grow
    assert short_seconds.sum() < seconds.sum()


def test_a_grid_still_too_long_writes_fewer_tokens_per_request(monkeypatch):
    toks = dict.fromkeys(("main", "budget 256", "second"), ByteTokenizer())
    monkeypatch.setattr(scorecard, "predicted_seconds", lambda p, setup, model: sum(a.max_tokens for a in p.arrivals) / 10)
    sizes, nothing = scorecard.grid_sizes(False), dict.fromkeys(toks)

    def sized(target_s: float, **at: int) -> tuple[list, pd.Series]:
        return scorecard.grid_for_time(toks, 2.0, sizes | at, nothing, nothing, target_s=target_s)

    def tokens(grid: list, kind: str) -> set[int]:
        return {a.max_tokens for p in grid if p.kind == kind for a in p.arrivals}

    def alone(grid: list) -> set[int]:
        return {len(p.arrivals) for p in grid if p.one_at_a_time}

    full, seconds = sized(1e9)
    assert tokens(full, "batch") == {sizes["output_tokens"]} and alone(full) == {3}
    at_16 = sized(1e9, output_tokens=16)[1].sum()
    at_16_twice = sized(1e9, output_tokens=16, alone_requests=2)[1].sum()
    fewer_tokens, _ = sized(at_16)
    assert tokens(fewer_tokens, "batch") == {16} and alone(fewer_tokens) == {3}  # 16 tokens was enough: three runs stay
    twice, twice_seconds = sized(at_16_twice)
    assert tokens(twice, "batch") == {16} and alone(twice) == {2}  # 16 of 24 tokens was not enough
    assert [p.name for p in twice] == [p.name for p in full] and twice_seconds.sum() < seconds.sum()
    slowest, _ = sized(1.0)  # no sizing fits: every step taken
    assert tokens(slowest, "batch") == {12} and alone(slowest) == {2}  # slower still: 12 tokens
    assert tokens(slowest, "poisson") == {scorecard.POISSON_OUTPUT}  # a rate's requests keep theirs


@pytest.mark.engine
def test_the_forecast_takes_the_engines_steps_exactly(engine):
    """A closed batch and a shared-prefix batch (all arrivals at once, so the schedule does not depend on time):
    the forecast's compositions, KV blocks in use and prefix-cache hits equal the engine's, step for step."""
    from kvlab.prompts import distinct_prompts, shared_prefix_prompts

    tok = engine.get_tokenizer()
    setup = forecast.setup_from_engine(engine)
    cases = {"batch": [Arrival(f"b{i}", p, 12, 0.0) for i, p in enumerate(distinct_prompts(tok, 300, 6, seed=4))],
             "prefix": [Arrival(f"p{i}", p, 6, 0.0) for i, p in enumerate(shared_prefix_prompts(tok, 400, 40, 5, seed=5))]}
    for name, arrivals in cases.items():
        predicted = forecast.simulate(setup, arrivals, MODEL)
        requests, steps = scorecard.measure_point(engine, scorecard.GridPoint(name, "batch", "main", arrivals))
        real = [tuple(sorted(s.sequences)) for s in steps.attrs["steps"]]
        assert real == predicted.steps.composition.tolist(), name
        assert steps.blocks_used.tolist() == predicted.steps.blocks_used.tolist(), name
        assert sorted(requests.cached_tokens) == sorted(predicted.requests.cached_tokens), name
        assert (predicted.requests.output_tokens == arrivals[0].max_tokens).all()
    assert predicted.requests.cached_tokens.max() >= 384  # the prefix case did hit: 3 of its blocks of 128


@pytest.mark.engine
def test_a_replay_never_hits_a_prompts_last_token(engine):
    """vLLM always computes a prompt's last token (``max_cache_hit_length = num_tokens - 1``): the same prompt of exactly
    3 blocks hits 2 blocks the second time; 3 blocks and 5 tokens hit all 3."""
    setup = forecast.setup_from_engine(engine)
    block = setup.block_size
    ids = list(range(1000, 1000 + 3 * block))
    assert forecast.replay_hits(setup, [ids, ids]) == [0, 2 * block]
    longer = [*ids, 7, 8, 9, 10, 11]
    assert forecast.replay_hits(setup, [longer, longer], max_tokens=3) == [0, 3 * block]


@pytest.mark.engine
def test_the_scheduler_verifies_drafts_and_rolls_back_rejections(engine):
    """vLLM's scheduler with n-gram speculation (k = 4) in the engine's config: every draft accepted gives 5 tokens a
    step (20 after the first in 4 steps of 3 × 5 tokens); nothing drafted is plain decoding; half accepted lies
    between."""
    import copy

    from vllm.config import SpeculativeConfig

    from kvlab.prompts import distinct_prompts

    base = forecast.setup_from_engine(engine)
    config = copy.deepcopy(base.vllm_config)
    config.speculative_config = SpeculativeConfig(method="ngram", num_speculative_tokens=4, prompt_lookup_min=2,
                                                  prompt_lookup_max=4, target_model_config=config.model_config,
                                                  target_parallel_config=config.parallel_config)
    setup = forecast.Setup(config, base.kv_cache_config, base.block_size, base.hash_block_size, base.block_hasher,
                           base.max_model_len)
    arrivals = [Arrival(f"s{i}", p, 21, 0.0) for i, p in enumerate(distinct_prompts(engine.get_tokenizer(), 100, 3, seed=1))]
    every = forecast.simulate(setup, arrivals, MODEL, speculation=forecast.Speculation(1.0, 4.0, (1, 1, 1, 1)))
    assert every.requests.decode_steps.tolist() == [4, 4, 4] and (every.requests.output_tokens == 21).all()
    assert every.steps.tokens.tolist() == [300, 15, 15, 15, 15]
    none = forecast.simulate(setup, arrivals, MODEL, speculation=forecast.Speculation(0.0, 0.0, ()))
    assert none.requests.decode_steps.tolist() == [20, 20, 20]
    half = forecast.point_metrics(forecast.simulate(setup, arrivals, MODEL, speculation=forecast.Speculation(
        1.0, 4.0, (0.5, 0.5, 0.5, 0.5))).requests)["tokens_per_step"]
    assert 1.5 < half < 4.5
    with pytest.raises(KVLabError, match="speculation on"):
        forecast.simulate(base, arrivals, MODEL, speculation=forecast.Speculation(1.0, 4.0, (1, 1, 1, 1)))


def test_a_gpu_forecast_needs_its_limits_and_a_gpu_that_holds_the_model():
    with pytest.raises(KVLabError, match="needs the GPU's peak matmul FLOP/s and memory bandwidth"):
        forecast.paper_model(MODEL, None, COST)
    gpu = forecast.paper_model(MODEL, LIMITS, COST, fixed_ms=1.5)
    assert gpu.constants == {"fixed_ms": 1.5, "per_sequence_ms": 0.0, "compute_scale": 1.0, "kv_scale": 1.0}
    tokens = forecast.kv_tokens_on(80, COST)  # 90 % of 80 GiB, less the weights and 2 GiB, ÷ bytes per token
    assert tokens == int((80 * 2**30 * 0.9 - COST.weights_read(1) - 2 * 2**30) // COST.kv_bytes_per_token)
    with pytest.raises(KVLabError, match="does not hold this model's weights"):
        forecast.kv_tokens_on(0.1, COST)


@pytest.mark.engine
def test_a_paper_setup_schedules_with_the_gpus_blocks_and_budget(engine):
    """vLLM's scheduler with 16-token blocks and a 256-token budget: four 100-token prompts (all admitted by the
    second step) hold 7 blocks each, and no step schedules more than 256 tokens."""
    from kvlab.prompts import distinct_prompts

    setup = forecast.paper_setup(forecast.setup_from_engine(engine), kv_tokens=16 * 1000, block_size=16,
                                 max_num_batched_tokens=256, max_num_seqs=8, max_model_len=2048)
    arrivals = [Arrival(f"g{i}", p, 6, 0.0) for i, p in enumerate(distinct_prompts(engine.get_tokenizer(), 100, 4, seed=6))]
    run = forecast.simulate(setup, arrivals, MODEL)
    assert setup.num_blocks == 1001 and run.steps.tokens.max() <= 256 and len(run.steps) > 6
    assert run.steps.blocks_used.max() == 4 * 7 and (run.requests.output_tokens == 6).all()


@pytest.mark.engine
def test_a_request_that_cannot_fit_is_refused_in_one_sentence(engine):
    setup = forecast.setup_from_engine(engine)
    too_long = Arrival("huge", [1] * setup.max_model_len, 8, 0.0)
    with pytest.raises(KVLabError, match="context"):
        forecast.simulate(setup, [too_long], MODEL)


@pytest.mark.parametrize(("given", "message"), [
    ({"budgets": [512, 512]}, "parameter budgets lists a value twice"),
    ({"ttft_slo_x": 1.0}, "must be above 1"),
    ({"rate_fractions": [0.0, 1.2]}, "parameter rate_fractions must be positive, got 0"),
])
def test_lab_l10_bad_input_is_one_sentence_naming_the_parameter(given, message):
    from kvlab.course import labs

    with pytest.raises(KVLabError, match="Lab L10_forecast: .*" + message):
        labs.validate("L10_forecast", given)


@pytest.mark.notebook
def test_lab_l10_writes_predictions_before_its_scorecard(tmp_path, second_model):
    """Lab L10 headless on the second model (the lab's one CI run, see tests/test_second_model.py), with the course
    model as the one never calibrated on: predictions stamped before the measured scorecard, KV blocks exact, every
    table the exercises read. Forecast accuracy on the course model is asserted by lesson 10."""
    from kvlab.course import exercises, labs
    from kvlab.runtime import kernels
    from kvlab.runtime.model import SECOND_MODEL

    out = tmp_path / "out"
    params = {"budgets": [512], "prompt_lengths": [768], "batch_sizes": [8], "long_prompts": [1024], "prefixes": [512],
              "rate_fractions": [0.5, 1.25], "poisson_requests": 12, "output_tokens": 12, "model": SECOND_MODEL,
              "output_dir": str(out)}
    kernels.execute(str(labs.lab_path("L10_forecast")), str(tmp_path / "run.ipynb"), cwd=str(labs.LAB_DIR),
                    parameters=params)
    stamp = json.loads((out / "predictions.json").read_text())
    meta = json.loads((out / "metadata.json").read_text())
    assert stamp["written_unix"] < (out / "results.csv").stat().st_mtime and meta["engine"]["predictions"] == stamp
    card = pd.read_parquet(out / "results.parquet")
    assert {"metric", "point", "held_out", "predicted", "measured", "lo80", "hi80"} <= set(card.columns)
    blocks = card[card.metric == "peak_blocks"]
    assert len(blocks) and (blocks.predicted == blocks.measured).all(), blocks
    assert set(card.kind) >= {"unloaded", "batch", "chunked", "prefix", "poisson", "second model", "speculation"}
    spec = card[card.kind == "speculation"]  # forecast after its run, given the acceptance vLLM counted there
    assert spec.given.str.startswith("measured acceptance").all() and "tokens_per_step" in set(spec.metric)
    assert spec.predicted.notna().all(), spec
    assert len(pd.read_csv(out / "capacity.csv")) == 2 and meta["parameters"]["model"] == SECOND_MODEL
    assert len(exercises.solve("L10", out)) == 3
