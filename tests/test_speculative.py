"""Speculative decoding helpers (pure logic): the engine argument, acceptance from counters, tasks, output comparison
and speed-ups. The engine itself runs in lesson 09 and lab L09."""

from __future__ import annotations

import pandas as pd
import pytest

from kvlab import speculative
from kvlab.runtime.errors import KVLabError


def test_ngram_config_is_vllms_speculative_config_and_k0_is_off():
    assert speculative.ngram_config(0) == {}
    cfg = speculative.ngram_config(4, 2, 4)["speculative_config"]
    assert cfg == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    with pytest.raises(KVLabError, match="prompt_lookup_min ≤ prompt_lookup_max"):
        speculative.ngram_config(4, 5, 2)


def test_acceptance_rate_and_mean_length_follow_vllms_definitions():
    before = {"drafts": 10, "draft_tokens": 40, "accepted_tokens": 20, "accepted_per_position": [8, 6, 4, 2]}
    after = {"drafts": 30, "draft_tokens": 120, "accepted_tokens": 80, "accepted_per_position": [28, 22, 18, 12]}
    acc = speculative.acceptance(before, after)
    assert acc["acceptance_rate"] == 60 / 80 and acc["mean_acceptance_length"] == 1 + 60 / 20
    assert acc["acceptance_by_position"] == [1.0, 0.8, 0.7, 0.5]
    off = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_position": []}
    assert pd.isna(speculative.acceptance(off, off)["acceptance_rate"])


def test_tasks_copy_real_text_or_ask_open_questions():
    edit = speculative.task_messages("edit", 3, seed=1)
    code = speculative.task_messages("code", 2, seed=1)
    chat = speculative.task_messages("chat", 4)
    assert len(edit) == 3 and len({m[0]["content"] for m in edit}) == 3 and all("paragraph" in m[0]["content"] for m in edit)
    assert all("def " in m[0]["content"] and "```python" in m[0]["content"] for m in code)
    assert len(chat) == 4
    with pytest.raises(KVLabError, match="Unknown task 'poem'"):
        speculative.task_messages("poem", 1)
    with pytest.raises(KVLabError, match="has 8 distinct requests"):
        speculative.task_messages("chat", 9)


def _vllm_ngram_rule():
    """vLLM 0.32's own n-gram function, read from its source and run as plain Python (no numba, no vLLM import)."""
    import ast
    import importlib.util
    from pathlib import Path

    import numpy as np

    source = Path(importlib.util.find_spec("vllm").origin).parent / "v1" / "spec_decode" / "ngram_proposer.py"
    tree = ast.parse(source.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_find_longest_matched_ngram_and_propose_tokens")
    fn.decorator_list = []
    namespace = {"np": np}
    exec(compile(ast.Module([fn], []), str(source), "exec"), namespace)  # noqa: S102 - vLLM's own function, from its source
    return namespace[fn.name]


def test_the_ngram_rule_is_vllms_longest_suffix_earliest_occurrence():
    import numpy as np

    vllm_rule = _vllm_ngram_rule()
    rng = np.random.default_rng(0)
    for _ in range(400):
        tokens = [int(x) for x in rng.integers(0, 4, size=int(rng.integers(1, 30)))]
        k, lo = int(rng.integers(1, 6)), int(rng.integers(1, 3))
        hi = lo + int(rng.integers(0, 3))
        theirs = vllm_rule(np.array(tokens, dtype=np.int32), lo, hi, 10_000, k).tolist()
        assert speculative.ngram_proposal(tokens, k, lo, hi) == theirs, (tokens, k, lo, hi)
    assert speculative.ngram_proposal([5, 7, 9, 2, 5, 7, 9, 4, 5, 7], 3) == [9, 2, 5]  # the earliest, not the latest
    assert speculative.ngram_proposal([1, 2, 1, 2], 5) == [1, 2]  # fewer than k where the sequence ends


def test_coverage_is_the_share_of_decode_steps_with_a_draft():
    assert speculative.coverage(3, 12) == 0.25
    assert speculative.coverage(0, 0) != speculative.coverage(0, 0)  # nan: no decode step


def test_same_outputs_finds_the_first_difference():
    base = pd.DataFrame({"task": ["edit", "edit"], "request": [0, 1], "repeat": [0, 0], "token_ids": [[1, 2, 3], [4, 5, 6]]})
    other = pd.DataFrame({"task": ["edit", "edit"], "request": [0, 1], "repeat": [0, 0], "token_ids": [[1, 2, 3], [4, 9, 6]]})
    same = speculative.same_outputs(base, other)
    assert same.identical.tolist() == [True, False]
    assert same.first_difference.iloc[1] == 1 and same.base_token.iloc[1] == 5 and same.other_token.iloc[1] == 9


def test_speedups_divide_tpot_without_by_tpot_with_speculation():
    runs = pd.DataFrame({"task": ["edit"] * 4 + ["chat"] * 4, "k": [0, 0, 4, 4] * 2,
                         "client_tpot_s": [0.04, 0.04, 0.01, 0.01, 0.04, 0.04, 0.05, 0.05],
                         "client_e2e_s": [4.0] * 8, "task_acceptance_rate": [None, None, 0.8, 0.8, None, None, 0.1, 0.1],
                         "task_tokens_per_step": [1.0, 1.0, 3.4, 3.4, 1.0, 1.0, 1.1, 1.1]})
    t = speculative.speedups(runs).set_index(["task", "k"])
    assert t.loc[("edit", 4), "tokens_per_step"] == 3.4 and t.loc[("chat", 0), "tokens_per_step"] == 1.0
    assert t.loc[("edit", 4), "speedup"] == pytest.approx(4.0) and t.loc[("chat", 4), "speedup"] == pytest.approx(0.8)
    assert t.loc[("edit", 0), "speedup"] == 1.0 and t.loc[("edit", 4), "acceptance_rate"] == 0.8


@pytest.mark.parametrize(("given", "message"), [
    ({"tasks": ["edit", "poem"]}, "parameter tasks must be one of 'edit', 'code', 'chat', got 'poem'"),
    ({"tasks": []}, r"parameter tasks=\[\] should be a non-empty list"),
    ({"ks": [2, 2]}, "parameter ks lists a value twice"),
    ({"prompt_lookup_min": 5, "prompt_lookup_max": 2}, r"prompt_lookup_min \(5\) must not exceed prompt_lookup_max \(2\)"),
    ({"ks": [0, 2]}, "parameter ks must be positive, got 0"),
])
def test_lab_l09_bad_input_is_one_sentence_naming_the_parameter(given, message):
    from kvlab.course import labs

    with pytest.raises(KVLabError, match="Lab L09_speculative: .*" + message):
        labs.validate("L09_speculative", given)


@pytest.mark.notebook
def test_lab_l09_writes_every_table_the_exercises_read(tmp_path, second_model):
    """Lab L09 headless on the real engine, on the second model (the lab's one CI run, see tests/test_second_model.py):
    speculation off and on, the batch runs, every table the exercises read, and their solutions. Random weights copy
    nothing, so what depends on a model that copies its input — edit accepted more often than chat, answers identical
    in float32 — is asserted by lesson 09 on the course model, through the same ``speculative`` functions."""
    import json

    from kvlab.course import exercises, labs
    from kvlab.runtime import kernels
    from kvlab.runtime.model import SECOND_MODEL

    out = tmp_path / "out"
    params = {"tasks": ["edit", "chat"], "ks": [4], "requests": 1, "output_tokens": 48, "batch_sizes": [1, 4],
              "batch_output_tokens": 32, "model": SECOND_MODEL, "output_dir": str(out)}
    kernels.execute(str(labs.lab_path("L09_speculative")), str(tmp_path / "run.ipynb"), cwd=str(labs.LAB_DIR),
                    parameters=params)
    summary = pd.read_csv(out / "summary.csv").set_index(["task", "k"])
    results = pd.read_parquet(out / "results.parquet")
    assert set(summary.index) == {("edit", 0), ("edit", 4), ("chat", 0), ("chat", 4)}
    assert summary.loc[[("edit", 4), ("chat", 4)], "acceptance_rate"].between(0, 1).all()
    assert (results[results.k == 0].tokens_per_chunk == 1).all()  # without speculation: one token per chunk
    assert results.identical.dtype == bool and set(results.k) == {0, 4}
    assert set(pd.read_csv(out / "batch_summary.csv").batch_size) == {1, 4}
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["parameters"]["ks"] == [4] and meta["parameters"]["model"] == SECOND_MODEL
    assert len(exercises.solve("L09", out)) == 4


def test_each_request_is_set_against_itself_without_speculation():
    runs = pd.DataFrame([
        {"task": "edit", "request": 0, "repeat": 0, "k": 0, "client_tpot_s": 0.030, "chunk_tokens": [1, 1, 1, 1, 1]},
        {"task": "edit", "request": 1, "repeat": 0, "k": 0, "client_tpot_s": 0.020, "chunk_tokens": [1, 1, 1]},
        {"task": "edit", "request": 0, "repeat": 0, "k": 4, "client_tpot_s": 0.010, "chunk_tokens": [1, 3, 1]},
        {"task": "edit", "request": 1, "repeat": 0, "k": 4, "client_tpot_s": 0.020, "chunk_tokens": [1, 1, 1]}])
    table = speculative.request_speedups(runs)
    assert table.speedup.tolist() == pytest.approx([3.0, 1.0]) and table.tokens_per_step.tolist() == [2.0, 1.0]
    assert set(table.k) == {4}
