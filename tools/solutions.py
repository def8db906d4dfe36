"""Source of instructors/solutions.ipynb (run: python tools/solutions.py)."""

from pathlib import Path

from nbgen import write_notebook

LABS = ["L01_capacity_planning", "L02_ttft_tpot_sweep", "L03_prefix_cache_delta", "L04_chunked_prefill", "L05_batch_sweep",
        "L06_traffic_mix"]

CELLS = [
("md", """
# Lab exercises — solutions (for instructors)

Every answer is **computed from a results folder**, never typed in: a learner's run on a slow laptop and the
reference run on this course's CPU machine have different numbers, and each gets its own right answers.

By default this reads the reference results in `data/reference/cpu/` (a full-mode run of every lab; see
`data/reference/README.md`). Point `results_root` at a grid's runs or a learner's `build/labs/` to mark their data:
`papermill instructors/solutions.ipynb out.ipynb -p results_root build/labs`.
"""),
("params", """
results_root = ""  # folder holding one results folder per lab (<root>/<lab>/results.csv); empty: data/reference/cpu
"""),
("code", """
from pathlib import Path

import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()
root = Path(results_root) if results_root else kvlab.config.REPO_ROOT / "data" / "reference" / "cpu"
"""),
]
for lab in LABS:
    CELLS += [
        ("md", f"## {lab}"),
        ("code", f"""
answers = kvlab.exercises.solve("{lab}", root / "{lab}")
verdicts = kvlab.exercises.check(dict(zip(answers.question, answers.answer)), root / "{lab}")
assert verdicts.verdict.str.startswith("✓").all(), verdicts
answers
"""),
    ]
CELLS += [
("md", """
## Marking a learner's answers

`kvlab.exercises.check({"L02.1": "prefill", "L02.2": 12.5}, folder)` says, per question, whether the answer agrees
with the data in `folder` — the same check the learner ran in the lab.
"""),
]

if __name__ == "__main__":
    write_notebook(Path(__file__).resolve().parents[1] / "instructors" / "solutions.ipynb", CELLS)
