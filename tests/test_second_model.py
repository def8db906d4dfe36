"""The course beyond its own model, unedited, in quick mode: a second architecture (Qwen2 layout: q/k/v biases, 8 query
heads on 2 KV heads, 24 layers, random weights, made locally) through lessons 00-09 and every lab; a third, the base
model (OPT: no chat template, multi-head attention), through lessons 01-09 (00 runs on it in the course build's test,
tests/test_course.py); a fourth, the hybrid model (Gemma-3's local:global: six KV cache groups), through lessons 00-09.
Labs whose own test already runs them on the second model (``ELSEWHERE``) are not run twice: one run per lab covers
both. The lesson runs are marked ``models``: ``make test-models`` (CI runs it after ``make test``), in the order of
this file — the second model, the hybrid, then the base model — so that CI's deadline (``KVLAB_CI_DEADLINE``,
tests/conftest.py) reaches the base model's runs first on a slow machine."""

from __future__ import annotations

import json

import nbformat
import pandas as pd
import pytest

from kvlab.course import labs
from kvlab.runtime import config, gguf, model

pytestmark = pytest.mark.notebook
SECOND = model.SECOND_MODEL
#: Labs whose own test runs them on the second model, with that test's assertions (and where it lives).
ELSEWHERE = {"L02_ttft_tpot_sweep": "test_labs.py", "L03_prefix_cache_delta": "test_labs.py",
             "L04_chunked_prefill": "test_labs.py", "L05_batch_sweep": "test_labs.py",
             "L06_traffic_mix": "test_serving.py", "L07_slo_capacity": "test_capacity.py", "L08_kv_budget": "test_paged.py",
             "L09_speculative": "test_speculative.py", "L10_forecast": "test_forecast.py"}


def test_every_lab_runs_on_the_second_model_here_or_in_its_own_test():
    here = set(labs.list_labs()) - set(ELSEWHERE)
    assert set(ELSEWHERE) <= set(labs.list_labs()) and here | set(ELSEWHERE) == set(labs.list_labs())
    for lab, test_file in ELSEWHERE.items():  # the test named runs that lab with the second model
        source = (config.REPO_ROOT / "tests" / test_file).read_text()
        assert f'"{lab}"' in source and '"model": SECOND_MODEL' in source, (lab, test_file)


def test_the_second_model_is_another_family_with_another_head_layout(second_model):
    from kvlab import sizing

    cfg = json.loads((second_model / "config.json").read_text())
    course = sizing.load_arch(str(gguf.prepare_default_model()))
    arch = sizing.load_arch(str(second_model))
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["model_type"] != "llama"
    assert arch.kv_heads != course.kv_heads and arch.query_heads != course.query_heads and arch.layers != course.layers
    assert model.resolve_model(SECOND) == str(second_model)  # KVLAB_MODEL=Qwen2-Tiny-Random picks it


def outputs_text(executed) -> str:
    nb = nbformat.read(executed, as_version=4)
    return "".join(o.get("text", "") + str(o.get("data", {}).get("text/markdown", ""))
                   for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_lesson_00_runs_with_the_base_model_in_the_course_build():
    source = (config.REPO_ROOT / "tests" / "test_course.py").read_text()
    assert 'setenv("KVLAB_MODEL", BASE_MODEL)' in source and "check for 'Paris' is skipped" in source
    assert "has no chat template" in source


def run_lesson(lesson: str, model_name: str, tmp_path, monkeypatch) -> str:
    """Execute a lesson unedited in quick mode with ``KVLAB_MODEL=model_name``; the text of its outputs."""
    from kvlab.runtime import kernels

    monkeypatch.setenv("KVLAB_MODEL", model_name)
    monkeypatch.setenv("KVLAB_QUICK", "1")
    executed = tmp_path / f"{lesson}.ipynb"
    kernels.execute(str(config.REPO_ROOT / "notebooks" / f"{lesson}.ipynb"), str(executed), cwd=str(config.REPO_ROOT / "notebooks"))
    return outputs_text(executed)


LESSONS = sorted(p.stem for p in (config.REPO_ROOT / "notebooks").glob("0[0-9]_*.ipynb"))


@pytest.mark.models
@pytest.mark.parametrize("lesson", LESSONS)
def test_lessons_run_unedited_with_the_second_model(lesson, second_model, tmp_path, monkeypatch):
    """Every lesson on Qwen2, with its own checks; where the numbers follow the model's shape (variants from its heads,
    the roofline, the step model fitted on another family), that they are this model's, not the course model's."""
    text = run_lesson(lesson, SECOND, tmp_path, monkeypatch)
    assert SECOND in text  # the environment report names the model that ran
    if lesson.startswith("01"):  # variants follow the chosen model: MHA = its 8 query heads; ratios 2/8 and 2/1
        assert "MHA copy (8 KV heads)" in text and "formula 0.250×" in text and "formula 2.000×" in text
    if lesson.startswith("02"):
        assert "prefill is compute-bound from" in text
    if lesson.startswith(("05", "09")):  # the step-time model attributes the points of a model it was not fitted on
        assert "fixed cost" in text, text[-2000:]


@pytest.mark.parametrize("lab", [lab for lab in labs.list_labs() if lab not in ELSEWHERE])
def test_labs_run_with_the_second_model(lab, second_model, tmp_path, monkeypatch):
    """Each lab not run elsewhere, with its defaults, on the second model: its only CI run."""
    from kvlab.runtime import kernels

    monkeypatch.setenv("KVLAB_QUICK", "1")
    out = tmp_path / "out"
    model_param = str(second_model) if lab.startswith("L01") else SECOND  # L01 plans from a config, the rest run it
    kernels.execute(labs.lab_path(lab), tmp_path / "run.ipynb", {"model": model_param, "output_dir": str(out)})
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["parameters"]["model"] == model_param
    assert len(pd.read_parquet(out / "results.parquet")) > 0


def test_the_hybrid_model_has_sliding_and_full_attention_layers():
    from kvlab import sizing
    from kvlab.runtime import randomweights

    path = randomweights.prepare_hybrid_model()
    arch = sizing.load_arch(str(path))
    assert 0 < arch.sliding_layers < arch.layers and arch.sliding_window == 512, arch
    assert model.resolve_model(model.HYBRID_MODEL) == str(path)  # KVLAB_MODEL=Gemma3-Tiny-Random picks it


@pytest.mark.models
@pytest.mark.parametrize("lesson", LESSONS)
def test_lessons_run_unedited_on_the_hybrid_model(lesson, tmp_path, monkeypatch):
    """Gemma-3's local:global layout keeps several KV cache groups: lesson 03 checks its prefix hits against vLLM's
    scheduler replay (the hybrid rule), lesson 08 its events, pools and preemptions per group; the others run their
    own checks on a model whose every layer group is a sixth of its KV."""
    text = run_lesson(lesson, model.HYBRID_MODEL, tmp_path, monkeypatch)
    assert model.HYBRID_MODEL in text
    if lesson.startswith(("03", "08")):
        groups = int(text.split(" KV cache group(s)")[0].rsplit(maxsplit=1)[-1])
        assert groups > 1, "a sliding-window + full-attention model keeps several KV cache groups"


def test_every_lesson_runs_on_the_hybrid_model():
    assert LESSONS == [f"{n:02d}_{p.split('_', 1)[1]}" for n, p in enumerate(LESSONS)] and len(LESSONS) == 10, LESSONS


@pytest.mark.models
@pytest.mark.parametrize("lesson", LESSONS[1:])  # lesson 00 runs on it in the course build's test
def test_lessons_run_unedited_with_the_base_model(lesson, tmp_path, monkeypatch):
    """Every lesson on OPT — no chat template (the course's fallback template serves its chats), one KV head per query
    head, learned positions — with its own checks; the model that ran is the one named."""
    text = run_lesson(lesson, model.BASE_MODEL, tmp_path, monkeypatch)
    assert model.BASE_MODEL in text
    if lesson.startswith("01"):  # OPT has no setting for fewer KV heads: the lesson says so instead of varying them
        assert "the MHA and MQA copies are skipped" in text, text[-2000:]


def test_ci_starts_no_lesson_run_that_would_end_past_its_deadline():
    """tests/conftest.py's guard for ``make test-models`` in CI (``.ci/run`` sets ``KVLAB_CI_DEADLINE``)."""
    from conftest import FIRST_MODEL_RUN_S, deadline_reason

    assert deadline_reason(0.0, 2 * FIRST_MODEL_RUN_S, []) is None
    assert "not started" in deadline_reason(0.0, FIRST_MODEL_RUN_S, [])  # under 1.25 × the assumed first run
    assert deadline_reason(1000.0, 1130.0, [60.0, 100.0]) is None  # 130 s left ≥ 1.25 × the slowest run so far
    assert "0.2 min left" in deadline_reason(1000.0, 1010.0, [60.0, 100.0])
    assert "KVLAB_CI_DEADLINE" in (config.REPO_ROOT / ".ci" / "run").read_text()


def test_ci_starts_no_slow_file_that_would_end_past_its_deadline():
    """The same guard for ``make test``'s slow files: each one's time on the slowest CI machine seen, scaled by how
    fast this run has been so far, against the time left; every lesson and slow test file is in the table."""
    from conftest import SLOW_MACHINE_S, file_deadline_reason

    assert file_deadline_reason(0.0, 1000.0, 600.0, 1.0) is None  # 1,000 s left ≥ 1.1 × 600 s
    assert "not started" in file_deadline_reason(0.0, 1000.0, 600.0, 2.0)  # this run is twice as slow: 1,200 s
    assert file_deadline_reason(0.0, 1000.0, 1200.0, 0.5) is None  # and half as fast: 600 s
    lessons = {f"notebooks/{p.stem}.ipynb" for p in (config.REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.py")}
    assert lessons <= set(SLOW_MACHINE_S), lessons - set(SLOW_MACHINE_S)
    assert all((config.REPO_ROOT / f).exists() for f in SLOW_MACHINE_S)
