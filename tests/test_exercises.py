"""Lab exercises: answers are computed from the data, checks agree with the data, and the reference results hold up."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvlab.course import exercises, labs
from kvlab.runtime import config
from kvlab.runtime.errors import KVLabError

REFERENCE = config.REPO_ROOT / "data" / "reference" / "cpu"


@pytest.fixture
def l02_folder(tmp_path):
    """A tiny, hand-made L02 results folder: prefill dominates at 2,048 tokens, TTFT ×10, TPOT ×1.2."""
    rows = []
    for prompt, ttft, tpot in ((128, 0.2, 0.040), (2048, 2.0, 0.048)):
        for r in range(3):
            rows.append({"prompt_tokens": prompt, "output_tokens": 32, "ttft_s": ttft + r * 0.01, "tpot_s": tpot,
                         "decode_s": tpot * 31})
    pd.DataFrame(rows).to_parquet(tmp_path / "results.parquet")
    return tmp_path


def test_answers_come_from_the_data(l02_folder):
    solved = exercises.solve("L02_ttft_tpot_sweep", l02_folder).set_index("question")
    assert solved.answer["L02.1"] == "prefill" and solved.answer["L02.3"] == "less"
    assert solved.answer["L02.2"] == pytest.approx(2.01 / 0.21, rel=0.01)
    assert "2010 ms" in solved.loc["L02.1", "from the data"]


def test_check_says_consistent_wrong_or_unanswered(l02_folder):
    verdicts = exercises.check({"L02.1": "Prefill", "L02.2": 11.0, "L02.3": None}, l02_folder).set_index("question").verdict
    assert verdicts["L02.1"].startswith("✓") and verdicts["L02.2"].startswith("✓")  # within ±25 %
    assert verdicts["L02.3"] == "not answered yet"
    verdicts = exercises.check({"L02.1": "decode", "L02.2": 3, "L02.3": "sideways"}, l02_folder).set_index("question").verdict
    assert verdicts["L02.1"].startswith("✗") and verdicts["L02.2"].startswith("✗")
    assert verdicts["L02.3"] == "answer one of: less, more"


def test_missing_results_are_one_sentence(tmp_path):
    with pytest.raises(KVLabError, match="No results in .*: run the lab first"):
        exercises.check({"L02.1": "prefill"}, tmp_path)


def test_every_lab_has_exercises_in_its_notebook():
    import nbformat

    for lab in labs.list_labs():
        nb = nbformat.read(labs.lab_path(lab), as_version=4)
        sources = "\n".join(c.source for c in nb.cells)
        assert f'kvlab.exercises.show("{lab[:3]}")' in sources and "kvlab.exercises.check(answers, out)" in sources
        for q in exercises.questions(lab):
            assert f'"{q.qid}": None' in sources, (lab, q.qid)


@pytest.mark.parametrize("lab", labs.list_labs())
def test_reference_results_are_a_full_mode_run_with_machine_info(lab):
    folder = REFERENCE / lab
    assert (folder / "results.parquet").is_file() and (folder / "results.csv").is_file(), f"no reference results for {lab}"
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["machine"]["quick mode (KVLAB_QUICK)"] == "off" and meta["machine"]["cores usable"]
    assert meta["parameters"].keys() == {p.name for p in labs.get(lab).params}
    answers = exercises.solve(lab, folder)  # every question is answerable from the reference data
    assert answers.answer.notna().all()


@pytest.mark.notebook
def test_solutions_notebook_runs_on_the_reference_results(tmp_path):
    """The instructors' solutions notebook, run on the committed reference results (no engine): nothing else runs it."""
    from kvlab.runtime import kernels

    kernels.execute(str(config.REPO_ROOT / "instructors" / "solutions.ipynb"), str(tmp_path / "solutions.ipynb"),
                    cwd=str(config.REPO_ROOT / "instructors"))
