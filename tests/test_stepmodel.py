"""The step-time model: recovery of known constants from synthetic steps (pure logic), the choice between its two
forms, and — on the real engine — a step composition outside the calibration predicted before it is measured."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from kvlab import scorecard, stepmodel
from kvlab.roofline import MachineLimits, ModelCost
from kvlab.runtime.errors import KVLabError

COST = ModelCost(linear_params=110_000_000, lm_head_params=28_000_000, layers=30, attn_width=576,
                 kv_bytes_per_token=23_040, bytes_per_param=2)
LIMITS = MachineLimits(matmul_flops=2.5e11, bandwidth=3.0e10, dtype="bfloat16", device="cpu", threads=2)


def synthetic(form: str, constants: dict[str, float], noise: float, seed: int = 0) -> list[stepmodel.Step]:
    """Steps of many compositions (prefills of 32-2,048 tokens; 1-16 sequences decoding at 64-2,048 tokens of
    context) timed by the model itself with ``constants``, times multiplicative noise."""
    rng = np.random.default_rng(seed)
    shapes = [((n, 0),) for n in (32, 64, 128, 256, 512, 1024, 2048)]
    shapes += [tuple((1, c) for _ in range(b)) for b in (1, 2, 3, 4, 6, 8, 12, 16) for c in (64, 128, 256, 512, 1024, 2048)]
    shapes += [((256, 0), *((1, 512),) * 4), ((512, 512), (1, 128), (1, 128))]  # mixed prefill + decode steps
    truth = stepmodel.StepModel(form, constants, {}, LIMITS, COST)
    steps = [stepmodel.Step(1.0, s) for s in shapes]
    ms = truth.predict_ms(steps) * rng.normal(1.0, noise, len(steps))
    return [stepmodel.Step(t / 1e3, s.sequences) for t, s in zip(ms, steps, strict=True)]


SUM = {"fixed_ms": 14.0, "per_sequence_ms": 0.6, "compute_scale": 1.4, "kv_scale": 1.8}
MAX = {"fixed_ms": 12.0, "per_sequence_ms": 0.8, "compute_scale": 1.5, "kv_scale": 2.0}


@pytest.mark.parametrize(("form", "constants"), [("sum", SUM), ("max", MAX)])
def test_the_fit_recovers_known_constants_and_picks_the_form_that_made_the_data(form, constants):
    steps = synthetic(form, constants, noise=0.01)
    model = stepmodel.fit(steps, COST, LIMITS)
    assert model.form == form, (model.form, model.median_abs_residual(), model.other_form)
    for name, value in constants.items():
        assert model.constants[name] == pytest.approx(value, rel=0.05), (name, model.constants, model.errors)
        assert model.errors[name] > 0
    assert model.median_abs_residual() < 0.02
    assert len(model.describe()) == len(constants) <= 8


def test_no_fitted_cost_is_negative_even_where_least_squares_would_make_one():
    """Steps whose per-sequence cost is truly 0 and whose KV costs more than the model's KV term can say: unconstrained,
    least squares trades a negative per-sequence cost against the KV scale (as a float32 calibration did, −1.4 ms per
    sequence); the fit keeps every constant ≥ 0 and still describes the steps."""
    truth = {"fixed_ms": 20.0, "per_sequence_ms": 0.0, "compute_scale": 1.1, "kv_scale": 1.0}
    steps = [stepmodel.Step(s.seconds * (1 - 0.02 * len(s.sequences) / 16), s.sequences)
             for s in synthetic("sum", truth, noise=0.01, seed=5)]  # bigger batches a little faster than the terms say
    x, offset = stepmodel._design(stepmodel.features(COST, LIMITS, steps), "sum")
    y = np.array([s.seconds * 1e3 for s in steps])
    unconstrained, *_ = np.linalg.lstsq(x / y[:, None], (y - offset) / y, rcond=None)
    assert unconstrained[1] < 0  # the case this guards: least squares alone fits a negative per-sequence cost
    model = stepmodel.fit(steps, COST, LIMITS, form="sum")
    assert min(model.constants.values()) >= 0 and model.constants["per_sequence_ms"] == 0, model.constants
    assert model.median_abs_residual() < 0.03


def test_a_burst_on_a_shared_machine_does_not_move_the_constants():
    """A slow stretch (a neighbour's job) makes the short-context decode steps of 1-3 sequences 25 % slower (6 of 57
    steps): least squares trades it against the KV scale (here −6 %; on a CI machine 0.5 where its decode steps alone
    showed ~2), the robust fit does not."""
    steps = [stepmodel.Step(s.seconds * (1.25 if len(s.sequences) <= 3 and 0 < s.sequences[0][1] <= 128 else 1.0), s.sequences)
             for s in synthetic("max", MAX, noise=0.01, seed=7)]
    model = stepmodel.fit(steps, COST, LIMITS, form="max")
    assert model.constants["kv_scale"] == pytest.approx(MAX["kv_scale"], rel=0.03), model.constants
    table = stepmodel.features(COST, LIMITS, steps)
    x, offset = stepmodel._design(table, "max", stepmodel.compute_bound(table, MAX))
    y = np.array([s.seconds * 1e3 for s in steps])
    plain = stepmodel._nonnegative_lstsq(x / y[:, None], (y - offset) / y)
    assert abs(plain[3] / MAX["kv_scale"] - 1) > 0.05, plain  # the case this guards: least squares alone is moved


def test_a_model_keeps_its_constants_on_another_model_and_bounds_a_gpu():
    model = stepmodel.fit(synthetic("sum", SUM, 0.01), COST, LIMITS)
    wider = ModelCost(**{**COST.__dict__, "linear_params": 2 * COST.linear_params})
    step = [stepmodel.Step(1.0, ((1, 512),) * 4)]
    assert model.for_model(wider).predict_ms(step)[0] > model.predict_ms(step)[0]
    assert model.for_model(wider).constants == model.constants  # same layers: same machine constants
    shallower = model.for_model(ModelCost(**{**COST.__dict__, "layers": COST.layers // 2}))
    assert shallower.constants["fixed_ms"] == pytest.approx(model.constants["fixed_ms"] / 2)  # dispatch per layer
    assert shallower.constants["per_sequence_ms"] == model.constants["per_sequence_ms"]
    gpu = model.with_limits(MachineLimits(989e12, 3.35e12, "bfloat16", "H100 (datasheet)", 0))
    assert gpu.constants["fixed_ms"] == 0 and 0 < gpu.predict_ms(step)[0] < model.predict_ms(step)[0] / 10


def test_a_runs_time_is_its_prefill_step_and_its_decode_steps():
    model = stepmodel.fit(synthetic("sum", SUM, 0.01), COST, LIMITS)
    prefill = model.step_ms(stepmodel.Step(0.0, ((256, 0),) * 4))
    decode = model.step_ms(stepmodel.decode_step(4, 256 + 16))
    assert model.run_seconds(4, 256, 32) == pytest.approx((prefill + 31 * decode) / 1e3)
    assert model.run_seconds(4, 256, 64) > model.run_seconds(4, 256, 32) > model.run_seconds(1, 256, 32)


def test_a_fit_that_misses_says_so_and_names_the_worst_steps():
    steps = synthetic("sum", SUM, noise=0.6, seed=3)
    model = stepmodel.fit(steps, COST, LIMITS)
    with pytest.raises(KVLabError, match=r"misses this machine's steps by a median \d+%.*worst: \d+ sequences"):
        stepmodel.check_fit(model, steps)


def test_a_model_that_cannot_be_costed_is_refused_before_any_engine_starts(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "mystery-net", "architectures": ["MysteryNet"]}')
    with pytest.raises(KVLabError, match="step model cannot count|lacks"):
        stepmodel.calibrate_and_check(str(tmp_path), quick=True, out=tmp_path)


def test_attribution_terms_add_up_to_the_prediction(tmp_path):
    model = stepmodel.fit(synthetic("max", MAX, 0.01), COST, LIMITS)
    steps = [stepmodel.Step(0.02, ((1, 256),) * 2), stepmodel.Step(0.5, ((1024, 0),))]
    table = model.attribution(steps)
    terms = table[["fixed", "per-sequence", "weight reads", "KV reads", "compute"]].sum(axis=1)
    assert np.allclose(terms, model.predict_ms(steps)) and np.allclose(table.predicted_ms, terms)
    again = stepmodel.StepModel.from_json(model.to_json(tmp_path / "step_model.json"))
    assert again.constants == model.constants and again.form == model.form


def test_a_composition_is_read_from_vllms_scheduler_output():
    from types import SimpleNamespace

    out = SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(req_id="a", num_computed_tokens=128)],
                          scheduled_cached_reqs=SimpleNamespace(req_ids=["b", "c"], num_computed_tokens=[300, 40]),
                          num_scheduled_tokens={"a": 256, "b": 1, "c": 5}, scheduled_spec_decode_tokens={"c": [1, 2, 3, 4]},
                          total_num_scheduled_tokens=262)
    step = stepmodel.composition(out, 0.03)
    assert step.sequences == ((256, 128), (1, 300), (5, 40)) and step.spec_tokens == 4 and step.tokens == 262


@pytest.mark.engine
def test_a_step_outside_the_calibration_is_predicted_within_15_percent(engine):
    """Calibrated on ≤ 8 sequences at ≤ 256 tokens, ≤ 4 at ≤ 1,024 and 2 at 2,048 (and prefills ≤ 512), quick mode;
    then 8 sequences decoding at ~1,024 tokens of context — twice the KV of any calibration step — predicted before it
    is measured. The machine is shared: a miss beside a canary (lesson 10's: 4 short sequences, measured ÷ predicted)
    more than 10 % off the calibration's speed is measured once more; a miss on a calm machine is calibrated once
    more (a calibration's sweep can itself catch a busy spell: a 12-06 CI one put the KV scale at 6.3, normally 2–3,
    and missed by +25 % beside calm canaries), and a second calibration's miss fails. The calibration is measured here
    (``fresh=True``) and saved: the lessons run after this file reuse it, not measure it again; lesson 05 checks the
    same composition at a looser 30 %, on a calibration from another process."""
    tries = []
    for calibration in range(2):
        model = stepmodel.calibrated(engine, fresh=True)
        for _ in range(2):  # once more only if a canary says the machine ran at another speed than it was calibrated at
            before = stepmodel.speed_now(engine, model)
            table = stepmodel.held_out(engine, model, [stepmodel.Point(8, 1024, 16)], repeats=2)
            after = stepmodel.speed_now(engine, model)
            decode = table[(table.sequences == 8) & (table.tokens == 8)]
            error = float(decode.predicted_ms.median() / decode.measured_ms.median() - 1)
            tries.append(f"calibration {calibration + 1} (kv_scale {model.constants['kv_scale']:.2f}): predicted "
                         f"{decode.predicted_ms.median():.1f} ms, measured {decode.measured_ms.median():.1f} ms "
                         f"({error:+.0%}) over {len(decode)} steps, canaries {before:.2f} and {after:.2f} (1: as calibrated)")
            if abs(error) <= 0.15 or max(abs(before - 1), abs(after - 1)) <= scorecard.CANARY_SLOWER:
                break
        if abs(error) <= 0.15:
            break
    print("; then ".join(tries))
    terms = model.attribution([stepmodel.decode_step(8, int(decode.context_mean.median()))]).iloc[0]
    assert abs(error) <= 0.15, (f"{'; then '.join(tries)}; {model.form} model {model.constants}; "
                                f"terms (ms) {terms.round(2).to_dict()}; limits {model.limits}; measured again in "
                                f"the sweep: {model.meta.get('measured_again')}")


def test_the_reference_calibration_is_small_sure_of_itself_and_checked_on_held_out_steps():
    """data/reference/cpu/step_model.json: a full-mode `kvlab forecast calibrate` on the reference machine."""
    from kvlab.runtime.config import REPO_ROOT

    path = REPO_ROOT / "data" / "reference" / "cpu" / "step_model.json"
    model = stepmodel.StepModel.from_json(path)
    assert len(model.constants) <= 8 and set(model.errors) == set(model.constants)
    assert all(model.errors[k] < abs(model.constants[k]) for k in model.constants), model.describe()
    assert model.median_abs_residual() <= 0.05
    assert model.meta["held_out_median_abs_error"] <= 0.10 and len(model.meta["held_out"]) >= 4
    assert model.meta["machine"]["cpu"] and model.meta["engine"]["model"]


def test_run_to_run_noise_is_each_repeat_against_its_points_mean():
    a, b = stepmodel.Point(1, 64, 4), stepmodel.Point(2, 128, 4)
    step = [stepmodel.Step(s, ((1, 64),)) for s in (0.010, 0.011, 0.012)]
    measured = [(a, [step[0], step[0]]), (b, [step[2]]), (b, [step[2]]), (a, [step[1], step[1]])]  # 2 runs each
    noise = stepmodel.run_to_run(measured)
    assert noise == pytest.approx([-1 / 21, 1 / 21, 0.0, 0.0])  # a: 20 ms then 22 ms around 21; b: 12 and 12


def test_a_point_is_unsteady_until_most_of_its_runs_agree():
    a = stepmodel.Point(4, 1024, 16)

    def runs(*totals):
        return [(a, [stepmodel.Step(t, ((1, 1024),))]) for t in totals]

    assert stepmodel.unsteady(runs(0.050, 0.052)) == []  # 4 % apart
    assert stepmodel.unsteady(runs(0.050, 0.065)) == [a]  # one slow run of two
    assert stepmodel.unsteady(runs(0.050, 0.065, 0.051)) == []  # a third agrees with the faster
    assert stepmodel.unsteady(runs(0.050, 0.065, 0.080)) == [a]  # no two agree
    assert stepmodel.unsteady(runs(0.050)) == []  # one run: nothing to compare


def test_a_busy_spell_during_the_sweep_is_measured_again_and_outvoted(monkeypatch):
    """A fake engine whose every step takes 10 ms × the batch, except the runs in a busy spell (1.5× as long): the
    spell's point is measured again, and each composition's median is the calm duration."""
    calls: list[stepmodel.Point] = []
    points = [stepmodel.Point(b, 64, 3) for b in (1, 2, 4, 8)]
    busy = {5}  # the 6th run of the sweep, in its second repeat

    def fake_run(llm, prompts, max_tokens):
        calls.append(len(prompts))
        slow = 1.5 if len(calls) - 2 in busy else 1.0  # call 0 is the warm-up
        return [stepmodel.Step(0.010 * len(prompts) * slow, tuple((1, 64 + k) for _ in prompts)) for k in range(max_tokens)]

    monkeypatch.setattr(stepmodel, "run_recorded", fake_run)
    monkeypatch.setattr(stepmodel, "distinct_prompts", lambda tok, n, batch, seed: [[seed]] * batch)
    llm = type("FakeLLM", (), {"get_tokenizer": lambda self: None})()
    runs = stepmodel.measure(llm, points, repeats=2)
    assert len(runs) == 9, [p for p, _ in runs]  # 2 × 4 runs, then the slow one's point once more
    slow_point = runs[5][0]
    assert runs[-1][0] == slow_point and stepmodel.unsteady(runs) == []
    assert [p for p, _ in runs[4:8]] != points  # the second repeat in another order
    for step in stepmodel.typical([s for _, run in runs for s in run]):
        assert step.seconds == pytest.approx(0.010 * len(step.sequences))


def test_each_calibration_point_out_gives_one_whole_run_error():
    """A point's run is predicted by a fit on the other points: one error per point, its steps' totals compared, so a
    step's own noise (here ±10 %) averages out and a run's error is far smaller than its steps' spread."""
    steps = synthetic("sum", SUM, noise=0.10, seed=3)
    points = [stepmodel.Point(i, 64, 4) for i in range(len(steps) // 4)]
    measured: dict = {}
    for i, s in enumerate(steps):
        measured.setdefault(points[min(i // 4, len(points) - 1)], []).append(s)
    errors = stepmodel.point_out_errors(list(measured.items()), COST, LIMITS, "sum")
    assert len(errors) == len(points)
    step_errors = [s.seconds * 1e3 / m - 1 for s, m in zip(steps, stepmodel.StepModel("sum", SUM, {}, LIMITS, COST)
                                                            .predict_ms(steps), strict=True)]
    assert np.std(errors) < 0.75 * np.std(step_errors), (np.std(errors), np.std(step_errors))


def test_a_plain_decode_step_is_one_sequence_one_token_no_draft():
    steps = [stepmodel.Step(0.020, ((1, 300),)), stepmodel.Step(0.022, ((1, 301),)), stepmodel.Step(0.030, ((1, 302),)),
             stepmodel.Step(0.050, ((3, 303),), spec_tokens=2),  # a verify step
             stepmodel.Step(0.040, ((1, 300), (1, 200))),  # two sequences
             stepmodel.Step(0.090, ((64, 0),))]  # a prefill
    assert stepmodel.plain_decode_ms(steps) == pytest.approx(22.0)
    assert math.isnan(stepmodel.plain_decode_ms(steps[3:]))


def test_a_saved_calibration_is_reused_only_for_the_same_key_and_while_recent(tmp_path, monkeypatch):
    """Lessons 02, 05, 09 and 10 share one calibration sweep: the second lesson loads what the first saved, a
    different machine, model or engine setting (the key) calibrates anew, as does an old file, ``fresh=True``, or a
    check step that runs more than 15 % off the saved calibration's prediction; a reused one predicts × the check's
    speed."""
    monkeypatch.setenv("KVLAB_BUILD_DIR", str(tmp_path))
    key = {"model": "m", "dtype": "torch.bfloat16", "cpu": "c"}
    monkeypatch.setattr(stepmodel, "reuse_key", lambda llm, quick: key | {"engine": llm})
    runs = []

    def fake_calibrate(llm, quick=False, limits=None):
        runs.append(llm)
        return stepmodel.fit(synthetic("sum", SUM, 0.01, seed=len(runs)), COST, LIMITS, meta={"steps_recorded": 3, "compositions": 2})

    monkeypatch.setattr(stepmodel, "calibrate", fake_calibrate)
    speed = {"now": 1.05}
    monkeypatch.setattr(stepmodel, "speed_now", lambda llm, model: speed["now"])
    first = stepmodel.calibrated("eager")
    again = stepmodel.calibrated("eager")
    assert runs == ["eager"] and again.meta["reused"]["age_s"] >= 0
    assert again.constants == pytest.approx(first.constants) and again.form == first.form
    step = stepmodel.decode_step(4, 300)
    assert first.speed == 1.0 and again.speed == 1.05  # the machine 5 % slower now: every prediction 5 % longer
    assert again.step_ms(step) == pytest.approx(1.05 * first.step_ms(step))
    assert again.predict_ms([step]) == pytest.approx(again.step_ms(step))
    stepmodel.calibrated("compiled")  # another key: measured
    stepmodel.calibrated("eager", fresh=True)
    assert runs == ["eager", "compiled", "eager"]
    path = stepmodel.saved_path(key | {"engine": "eager"})
    old = path.stat().st_mtime - stepmodel.REUSE_HOURS * 3600 - 60
    os.utime(path, (old, old))
    stepmodel.calibrated("eager")
    assert runs[-1] == "eager" and len(runs) == 4
    speed["now"] = 1.6  # the same report, a machine 1.6× slower (two AVX2 EPYCs, 2026-12-05): measured anew
    stepmodel.calibrated("eager")
    assert len(runs) == 5
