"""Capacity under SLOs on the real engine: the driver's closed loop and batch lane, separate pools on their own cores,
and lab L07 (headless, and its bad input refused before any engine starts)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvlab import loadtest, pools, workload
from kvlab.course import labs
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.model import SECOND_MODEL


@pytest.mark.engine
def test_closed_loop_keeps_each_user_to_one_request_in_flight(engine):
    maker = loadtest.Requests(engine.get_tokenizer(), loadtest.Mix(chat_output_tokens=6))
    reqs = loadtest.run_closed_loop(engine, maker, users=3, count=9)
    assert len(reqs) == 9 and sorted(reqs.user.unique()) == [0, 1, 2]
    assert loadtest.max_in_flight(reqs) <= 3
    for _, mine in reqs.sort_values("arrival_s").groupby("user"):  # each next request arrives when the last one ended
        assert (mine.arrival_s.iloc[1:].to_numpy() >= mine.last_token_s.iloc[:-1].to_numpy() - 1e-9).all()
    assert (reqs.output_tokens == 6).all() and (reqs.tpot_s > 0).all() and (reqs.e2e_s >= reqs.ttft_s).all()


@pytest.mark.engine
def test_batch_lane_lets_one_job_into_the_engine_at_a_time(engine):
    mix = loadtest.Mix(chat_share=0.0, batch_share=1.0, batch_prompt_tokens=200, batch_output_tokens=4)
    arrivals = loadtest.open_loop(loadtest.Requests(engine.get_tokenizer(), mix), rate_rps=50.0, count=3)
    _, reqs = workload.run_workload(engine, arrivals, lane_limits={"batch": 1})
    reqs = reqs.sort_values("submitted_s")
    assert (reqs.submitted_s.iloc[1:].to_numpy() >= reqs.last_token_s.iloc[:-1].to_numpy() - 1e-9).all()
    assert (reqs.ttft_s >= reqs.first_token_s - reqs.submitted_s - 1e-9).all()  # the wait in the queue is in TTFT


@pytest.mark.engine
def test_pools_that_share_a_core_are_refused_in_one_sentence(model_dir):
    """Lesson 07 runs real pools side by side, one engine per core set, and checks each answered all its requests
    (nbval); here, the refusal that comes before any engine starts."""
    cores = pools.cores_available()
    with pytest.raises(KVLabError, match="Each pool needs its own cores"):
        pools.run_pools({"a": ([cores[0]], []), "b": ([cores[0]], [])}, str(model_dir), {})


@pytest.mark.parametrize("given, message", [
    ({"chat_share": 0.5, "batch_share": 0.4}, r"the traffic shares must sum to 1, got chat_share=0.5, agent_share=0, batch_share=0.4"),
    ({"rates": [1.0, 0.5]}, r"parameter rates must increase from one point to the next, got \[1.0, 0.5\]"),
    ({"rates": [0.0, 1.0]}, "parameter rates must be positive, got 0.0"),
    ({"slo_ttft": 0.0}, "parameter slo_ttft must be positive, got 0.0"),
    ({"slo_e2e": -1.0}, "parameter slo_e2e must be 0 .no E2E objective. or positive"),
    ({"scheduling_policy": "lifo"}, "parameter scheduling_policy must be one of 'fcfs', 'priority', got 'lifo'"),
    ({"chat_share": 0.0, "batch_share": 1.0}, "the SLO applies to interactive requests"),
])
def test_lab_l07_bad_input_is_one_sentence_naming_the_parameter(given, message):
    with pytest.raises(KVLabError, match="Lab L07_slo_capacity: " + message):
        labs.validate("L07_slo_capacity", given)


@pytest.mark.notebook
def test_lab_l07_finds_the_sustainable_rate_and_writes_tidy_results(tmp_path, second_model):
    """On the second model (its one CI run, see tests/test_second_model.py); the results writer's safety to run twice
    is lab L01's test."""
    from kvlab.runtime import kernels

    out = tmp_path / "out"
    params = {"rates": [0.5, 1.5], "saturation_users": 8, "seconds_per_rate": 4.0, "min_requests": 8, "chat_share": 0.8,
              "batch_share": 0.2, "batch_prompt_tokens": 400, "scheduling_policy": "priority", "model": SECOND_MODEL,
              "output_dir": str(out)}
    kernels.execute(str(labs.lab_path("L07_slo_capacity")), str(tmp_path / "run.ipynb"), cwd=str(labs.LAB_DIR),
                    parameters=params)
    results = pd.read_parquet(out / "results.parquet")
    rates = pd.read_csv(out / "rates.csv")
    cap = pd.read_csv(out / "capacity.csv").iloc[0]
    assert set(results.label) == {"chat", "batch"} and results.rate_rps.nunique() == 2
    assert not results[results.label == "batch"].good.any()  # batch jobs have no SLO
    assert len(rates) == 2 and (rates.requests > 0).all() and {"goodput_rps", "throughput_rps", "attainment"} <= set(rates.columns)
    assert cap.saturation_rps > 0 and cap.slo_ttft_ms > 0 and cap.knee_rps in set(rates.rate_rps)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["parameters"]["rates"] == [0.5, 1.5] and meta["engine"]["scheduling_policy"] == "priority"
    assert meta["parameters"]["model"] == SECOND_MODEL
    assert (out / "capacity.html").exists() and (out / "calibration.csv").exists()
