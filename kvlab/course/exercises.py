"""Lab exercises: questions a learner answers from their own run's numbers, and checks that say whether that reading
agrees with the data (not with a number printed in a book: every answer is computed from the results folder).

Each lab's questions live in its definition (``kvlab/labs/lNN_*.py``). In a lab: ``kvlab.course.exercises.show("L02")``
lists the questions; ``kvlab.course.exercises.check({"L02.1": "prefill"}, out)`` checks answers against the results in
``out``. Instructors: ``solve("L02", folder)`` gives every answer with the numbers behind it
(``instructors/solutions.ipynb``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kvlab.course import labs
from kvlab.runtime.errors import KVLabError

Tables = dict[str, pd.DataFrame]


@dataclass(frozen=True)
class Question:
    """One question: its text, how to compute the answer (and a sentence of why) from a lab's tables."""

    qid: str
    text: str
    solve: Callable[[Tables], tuple[Any, str]]
    choices: tuple[str, ...] = ()  # empty: the answer is a number
    tolerance: float = 0.0  # numbers: relative tolerance (0 = exact)


def load(folder: str | Path) -> Tables:
    """A lab's results folder as tables: ``results`` plus every other CSV/Parquet (``summary``, ``dashboard``…)."""
    folder = Path(folder)
    if not (folder / "results.parquet").is_file() and not (folder / "results.csv").is_file():
        raise KVLabError(f"No results in {folder}: run the lab first (its Save cell writes them), or point at data/reference/cpu/<lab>.")
    tables: Tables = {}
    for f in sorted(folder.iterdir()):
        if f.suffix == ".parquet":
            tables[f.stem] = pd.read_parquet(f)
        elif f.suffix == ".csv" and f.stem not in tables and not (folder / f"{f.stem}.parquet").is_file():
            tables[f.stem] = pd.read_csv(f)
    return tables


def questions(lab: str) -> list[Question]:
    """The questions of a lab (``"L02"`` or ``"L02_ttft_tpot_sweep"``), from the lab's definition in ``kvlab.course.labs``."""

    spec = labs.get(lab)
    if not spec.questions:
        raise KVLabError(f"Lab {spec.name} has no exercises yet; add questions to its definition in kvlab/labs/.")
    return list(spec.questions)


def show(lab: str) -> Any:
    """The lab's questions as Markdown, with the key to use for each answer."""
    from IPython.display import Markdown

    lines = [f"{i}. **`{q.qid}`** — {q.text}" + (f" Choices: {', '.join(q.choices)}." if q.choices else "")
             for i, q in enumerate(questions(lab), start=1)]
    return Markdown("\n".join(lines))


def _agrees(q: Question, given: Any, expected: Any) -> bool:
    if q.choices or isinstance(expected, str):
        return str(given).strip().lower() == str(expected).strip().lower()
    if not isinstance(given, (int, float)) or isinstance(given, bool):
        return False
    if q.tolerance == 0:
        return given == expected
    return abs(given - expected) <= q.tolerance * abs(expected)


def check(answers: dict[str, Any], folder: str | Path) -> pd.DataFrame:
    """Check answers ({question id: answer}; None = not answered yet) against the results in ``folder``. A wrong
    answer gets the numbers to look at, not the answer."""
    tables = load(folder)
    lab = next(iter(answers))[:3] if answers else ""
    rows = []
    for q in questions(lab):
        given = answers.get(q.qid)
        if given is None:
            rows.append({"question": q.qid, "your answer": "", "verdict": "not answered yet"})
            continue
        if q.choices and str(given).strip().lower() not in q.choices:
            rows.append({"question": q.qid, "your answer": given, "verdict": f"answer one of: {', '.join(q.choices)}"})
            continue
        expected, _ = q.solve(tables)
        ok = _agrees(q, given, expected)
        rows.append({"question": q.qid, "your answer": given,
                     "verdict": "✓ consistent with your data" if ok else "✗ not what your data says: look again at the table above"})
    return pd.DataFrame(rows)


def solve(lab: str, folder: str | Path) -> pd.DataFrame:
    """Every answer of a lab computed from the results in ``folder``, with the numbers behind it (instructors)."""
    tables = load(folder)
    rows = []
    for q in questions(lab):
        answer, why = q.solve(tables)
        rows.append({"question": q.qid, "text": q.text, "answer": answer, "from the data": why})
    return pd.DataFrame(rows)
