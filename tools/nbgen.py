"""Write a notebook from a list of ("md"|"code"|"params"|"keyfig", source) cells: how the course's notebooks are authored.

Usage from a lesson script:  write_notebook(path, cells)  — outputs are never stored.
"""

from __future__ import annotations

from pathlib import Path

import nbformat


def write_notebook(path: Path, cells: list[tuple[str, str]], parameters: str | None = None) -> None:
    """Create ``path`` with markdown/code cells; ``parameters`` becomes a papermill-tagged first code cell."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    out = []
    for kind, src in cells:
        src = src.strip("\n")
        if kind == "md":
            out.append(nbformat.v4.new_markdown_cell(src))
        elif kind == "params":
            out.append(nbformat.v4.new_code_cell(src, metadata={"tags": ["parameters"]}))
        elif kind == "keyfig":  # the lesson's key figure: shown in the course report next to the Summary
            out.append(nbformat.v4.new_code_cell(src, metadata={"tags": ["key-figure"]}))
        else:
            out.append(nbformat.v4.new_code_cell(src))
    for i, c in enumerate(out):
        c["id"] = f"cell-{i:02d}"
    nb.cells = out
    nbformat.validate(nb)
    path.write_text(nbformat.writes(nb) + "\n")


def exercise_cells(lab: str) -> list[tuple[str, str]]:
    """The checked exercises every lab ends with: the questions (from ``kvlab.exercises``) and an answers cell."""
    from kvlab.exercises import questions

    answers = ", ".join(f'"{q.qid}": None' for q in questions(lab))
    return [
        ("md", """
## Exercises

Answer from **your** numbers above — the tables, the plot, the files in `out` — not from the lessons' prose. Put each
answer in `answers` and run the check: it says whether your reading agrees with this run's data (and, if not, where
to look), without giving the answer away.
"""),
        ("code", f'kvlab.exercises.show("{lab}")'),
        ("code", f"answers = {{{answers}}}  # replace None with your answers\nkvlab.exercises.check(answers, out)"),
    ]
