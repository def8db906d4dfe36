import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "kvlab", "tests", "tools"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_notebooks_are_committed_without_outputs():
    import nbformat

    for nb_path in sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb")) + sorted((ROOT / "instructors").glob("*.ipynb")):
        nb = nbformat.read(nb_path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{nb_path.name} has stored outputs"


def test_first_code_cell_imports_kvlab_and_prints_environment():
    import nbformat

    for nb_path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(nb_path, as_version=4)
        first = next(c for c in nb.cells if c.cell_type == "code")
        assert "import kvlab" in first.source and "print_env" in first.source, nb_path.name
        headings = [c.source for c in nb.cells if c.cell_type == "markdown"]
        assert any(h.startswith("## Summary") for h in headings), f"{nb_path.name} has no Summary"
        assert any(h.startswith("## Exercises") for h in headings), f"{nb_path.name} has no Exercises"
