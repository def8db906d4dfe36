# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab exercises — solutions (for instructors)
#
# Every answer is **computed from a results folder**, never typed in: a learner's run on a slow laptop and the
# reference run on this course's CPU machine have different numbers, and each gets its own right answers.
#
# By default this reads the reference results in `data/reference/cpu/` (a full-mode run of every lab; see
# `data/reference/README.md`). Point `results_root` at a grid's runs or a learner's `build/labs/` to mark their data:
# `papermill instructors/solutions.ipynb out.ipynb -p results_root build/labs`.

# %% tags=["parameters"]
results_root = ""  # folder holding one results folder per lab (<root>/<lab>/results.csv); empty: data/reference/cpu

# %%
from pathlib import Path

import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()
root = Path(results_root) if results_root else kvlab.config.REPO_ROOT / "data" / "reference" / "cpu"

# %% [markdown]
# ## Every lab's answers
#
# One table per lab (the labs and their questions come from their definitions in `kvlab/labs/`), each answer with
# the numbers behind it; the check a learner runs must agree with every answer (asserted).

# %%
from IPython.display import Markdown, display

for lab in kvlab.labs.all_labs():
    folder = root / lab.name
    display(Markdown(f"### {lab.name} · {lab.title}"))
    if not (folder / "results.parquet").is_file() and not (folder / "results.csv").is_file():
        print(f"no results for {lab.name} under {root}: skipped")
        continue
    answers = kvlab.exercises.solve(lab.name, folder)
    verdicts = kvlab.exercises.check(dict(zip(answers.question, answers.answer, strict=True)), folder)
    assert verdicts.verdict.str.startswith("✓").all(), verdicts
    display(answers)

# %% [markdown]
# ## Marking a learner's answers
#
# `kvlab.exercises.check({"L02.1": "prefill", "L02.2": 12.5}, folder)` says, per question, whether the answer agrees
# with the data in `folder` — the same check the learner ran in the lab.
