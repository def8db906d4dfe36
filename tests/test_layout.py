"""The package's shape (DEVELOPERS.md, "Where the code is"): three layers, no import cycles, every kvlab import at the
top of its module, and a lesson → module → lab → tests table that names every lesson and every module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from kvlab.runtime.config import REPO_ROOT

PACKAGE = REPO_ROOT / "kvlab"


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path) -> list[tuple[str, bool]]:
    """(kvlab module imported, whether the import sits inside a function) for every kvlab import in ``path``."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom) and child.module and child.module.split(".")[0] == "kvlab":
                for alias in child.names:  # `from kvlab.x import y`: y may itself be a module
                    sub = f"{child.module}.{alias.name}"
                    found.append((sub if sub in MODULES else child.module, inside))
            elif isinstance(child, ast.Import):
                found.extend((a.name, inside) for a in child.names if a.name.split(".")[0] == "kvlab")
            visit(child, inside)

    visit(ast.parse(path.read_text()), False)
    return found


def graph() -> dict[str, set[str]]:
    """kvlab module → the kvlab modules it imports (the package root, a namespace of re-exports, left out)."""
    return {name: {m for m, _ in imports_of(path) if m != "kvlab" and m != name} for name, path in MODULES.items()
            if name != "kvlab"}


def layer(name: str) -> str:
    if name == "kvlab.__main__":
        return "course"  # ``python -m kvlab``: the command line
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ("runtime", "course") else "topics"


def test_no_import_cycles_among_kvlab_modules():
    edges, cycles, state = graph(), [], {}

    def walk(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" → ".join(path[path.index(nxt):] + [nxt]) if nxt in path else f"{node} → {nxt}")
            elif nxt not in state:
                walk(nxt, path + [nxt])
        state[node] = "done"

    for start in sorted(edges):
        if start not in state:
            walk(start, [start])
    assert not cycles, cycles


def test_kvlab_imports_sit_at_the_top_of_each_module():
    """Only heavy third-party packages (vllm, torch, transformers, ray) are imported inside functions."""
    local = [f"{name}: {m}" for name, path in MODULES.items() for m, inside in imports_of(path) if inside]
    assert not local, local


def test_layers_depend_downwards_only():
    """runtime needs nothing above it; the topics never reach into the course tooling."""
    allowed = {"runtime": {"runtime"}, "topics": {"runtime", "topics"}, "course": {"runtime", "topics", "course"}}
    wrong = [f"{a} → {b}" for a, targets in graph().items() for b in targets if layer(b) not in allowed[layer(a)]]
    assert not wrong, wrong


def test_no_grab_bag_modules():
    assert not {"kvlab.experiments", "kvlab.plots", "kvlab.capacity"} & set(MODULES)


def developers_table() -> list[list[str]]:
    text = (REPO_ROOT / "DEVELOPERS.md").read_text()
    section = text.split("## Where the code is", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("|") and not set(line) <= set("|-: ")][1:]


def test_the_lesson_table_names_every_lesson_topic_module_lab_and_test():
    rows = developers_table()
    text = " ".join(" ".join(r) for r in rows)
    lessons = sorted(p.stem for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    assert [r[0].strip("`") for r in rows[: len(lessons)]] == lessons, "one row per lesson, in order"
    topics = sorted(n.split(".", 1)[1] for n in MODULES if layer(n) == "topics" and n != "kvlab")
    named = set(re.findall(r"`([a-z_]+)`", text))
    assert not set(topics) - named, f"topic modules missing from DEVELOPERS.md's table: {sorted(set(topics) - named)}"
    labs = {p.stem for p in (REPO_ROOT / "labs").glob("L[0-9][0-9]_*.py")}
    assert labs <= set(re.findall(r"`(L\d\d_[a-z_]+)`", text)), sorted(labs - set(re.findall(r"`(L\d\d_[a-z_]+)`", text)))
    for test_file in set(re.findall(r"`(test_[a-z_]+\.py)`", text)) | {"test_layout.py"}:
        assert (REPO_ROOT / "tests" / test_file).is_file(), test_file
    in_table = set(re.findall(r"`(test_[a-z_]+\.py)`", text))
    tests = {p.name for p in (REPO_ROOT / "tests").glob("test_*.py")}
    assert tests <= in_table, f"test files missing from DEVELOPERS.md's tables: {sorted(tests - in_table)}"


def test_every_test_that_runs_a_notebook_says_what_it_asserts():
    """Nothing measured twice in CI without a reason: a test that executes a lesson or a lab again says in its docstring
    what it asserts that the lesson's own run (nbval) cannot."""
    missing = []
    for path in sorted((REPO_ROOT / "tests").glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                calls = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                         for n in ast.walk(node) if isinstance(n, ast.Call)}
                if calls & {"execute", "run_lesson", "build"} and not ast.get_docstring(node):
                    missing.append(f"{path.name}::{node.name}")
    assert not missing, missing
