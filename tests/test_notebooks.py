"""How the course is authored: every notebook is paired with a plain-text source (jupytext percent format) that
JupyterLab opens and saves; the committed pair agrees, carries no outputs, is linted; links work in the built course."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from kvlab.course import build as course
from kvlab.runtime.serving import free_port

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("notebooks", "labs", "instructors")
NOTEBOOKS = sorted(p for folder in FOLDERS for p in (ROOT / folder).glob("*.ipynb"))


def test_every_notebook_has_a_paired_source_and_every_source_a_notebook():
    assert len(NOTEBOOKS) >= 14
    for folder in FOLDERS:
        notebooks = {p.stem for p in (ROOT / folder).glob("*.ipynb")}
        sources = {p.stem for p in (ROOT / folder).glob("*.py")}
        assert notebooks == sources, f"{folder}/: unpaired {sorted(notebooks ^ sources)}; run `make sync`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_and_its_source_agree(path):
    import jupytext
    from jupytext.compare import compare_notebooks

    source = jupytext.read(path.with_suffix(".py"))
    notebook = nbformat.read(path, as_version=4)
    compare_notebooks(source, notebook, "py:percent")  # raises NotebookDifference, naming the cell, when they differ


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name} has stored outputs"


def test_a_changed_pair_is_caught(tmp_path):
    """The agreement check is not vacuous: one changed word in the source, or a lost tag, is a difference."""
    import jupytext
    from jupytext.compare import NotebookDifference, compare_notebooks

    path = ROOT / "labs" / "L01_capacity_planning.ipynb"
    notebook = nbformat.read(path, as_version=4)
    text = path.with_suffix(".py").read_text()
    for changed in (text.replace("tokens per sequence", "tokens per seq"), text.replace('# %% tags=["parameters"]', "# %%")):
        with pytest.raises(NotebookDifference):
            compare_notebooks(jupytext.reads(changed, "py:percent"), notebook, "py:percent")


def test_ruff_lints_the_package_tests_notebooks_and_their_sources():
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "kvlab", "tests", "benchmarks", *FOLDERS],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    listed = subprocess.run([sys.executable, "-m", "ruff", "check", "--show-files", *FOLDERS], cwd=ROOT,
                            capture_output=True, text=True).stdout
    assert "02_prefill_vs_decode.py" in listed and "02_prefill_vs_decode.ipynb" in listed  # both sides are linted


def test_first_code_cell_imports_kvlab_and_prints_environment():
    for nb_path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(nb_path, as_version=4)
        first = next(c for c in nb.cells if c.cell_type == "code")
        assert "import kvlab" in first.source and "print_env" in first.source, nb_path.name
        headings = [c.source for c in nb.cells if c.cell_type == "markdown"]
        assert any(h.startswith("## Summary") for h in headings), f"{nb_path.name} has no Summary"
        assert any(h.startswith("## Exercises") for h in headings), f"{nb_path.name} has no Exercises"


def test_each_lesson_marks_one_key_figure():
    for nb_path in course.lessons():
        nb = nbformat.read(nb_path, as_version=4)
        tagged = [c for c in nb.cells if "key-figure" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, f"{nb_path.name}: {len(tagged)} cells tagged key-figure"


def test_jupyterlab_edits_either_side_of_a_pair(tmp_path):
    """The server JupyterLab talks to (with jupytext, as `make setup` installs it): an edit to the paired source shows
    when the notebook is opened, and saving the notebook writes the source. Runs on a copy, never on the repo."""
    for name in ("01_kv_cache_by_hand.ipynb", "01_kv_cache_by_hand.py"):
        shutil.copy2(ROOT / "notebooks" / name, tmp_path / name)
    shutil.copy2(ROOT / "jupytext.toml", tmp_path / "jupytext.toml")
    port, token = free_port(), "kvlab-test"
    server = subprocess.Popen([sys.executable, "-m", "jupyter", "server", "--ip=127.0.0.1", f"--port={port}", "--no-browser",
                               "--allow-root", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}"],
                              stdout=subprocess.DEVNULL, stderr=(tmp_path / "server.log").open("w"))
    base = f"http://127.0.0.1:{port}/api/contents/"

    def call(method: str, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(f"{base}{path}?token={token}", method=method,
                                         data=json.dumps(body).encode() if body else None,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    try:
        for _ in range(150):
            try:
                call("GET", "")
                break
            except OSError:
                time.sleep(0.2)
        source = tmp_path / "01_kv_cache_by_hand.py"
        source.write_text(source.read_text().replace("# ## 1. The formula", "# ## 1. The formula, edited in the .py"))
        opened = call("GET", "01_kv_cache_by_hand.ipynb")["content"]
        assert any(c["source"].startswith("## 1. The formula, edited in the .py\n") for c in opened["cells"])  # .py → notebook

        opened["cells"][0]["source"] += "\n\nA sentence an instructor added in JupyterLab."
        call("PUT", "01_kv_cache_by_hand.ipynb", {"type": "notebook", "format": "json", "content": opened})
        assert "# A sentence an instructor added in JupyterLab." in source.read_text()  # notebook → .py
        saved = nbformat.read(tmp_path / "01_kv_cache_by_hand.ipynb", as_version=4)
        assert saved.cells[0].source.endswith("A sentence an instructor added in JupyterLab.")
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_every_link_and_anchor_of_the_built_course_leads_somewhere(tmp_path):
    """Lessons link to each other once, as JupyterLab follows links (`03_prefix_caching.ipynb#…`); the built course
    turns them into links between its pages. Every link and anchor of the site is followed."""
    index, runs = course.build(out=tmp_path, run=False)
    assert all(r.ok for r in runs) and len(runs) == len(course.lessons())
    pages = {p.name for p in (tmp_path / "html").glob("*.html")}
    assert pages == {f"{nb.stem}.html" for nb in course.lessons()}
    lesson06 = (tmp_path / "html" / "06_serving_and_dashboards.html").read_text()
    assert 'href="03_prefix_caching.html#4.-Token-identity:-what-breaks-a-hit"' in lesson06 and ".ipynb#" not in lesson06
    assert course.broken_links(tmp_path) == []


def test_broken_links_are_reported(tmp_path):
    (tmp_path / "html").mkdir()
    (tmp_path / "html" / "a.html").write_text('<h2 id="Intro">Intro</h2><a href="b.html">b</a><a href="a.html#Intro">ok</a>'
                                              '<a href="#Missing">bad anchor</a><a href="https://example.org">external</a>')
    (tmp_path / "index.html").write_text('<a href="html/a.html#Intro">a</a><a href="html/a.ipynb">old</a>')
    assert course.broken_links(tmp_path) == ["index.html: html/a.ipynb (no such file)", "html/a.html: b.html (no such file)",
                                             "html/a.html: #Missing (no such anchor)"]
