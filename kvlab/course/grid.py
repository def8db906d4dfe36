"""Lab grids for instructors: many (lab × parameters) runs from one YAML file, resumable, and their results collected.

A grid file (see ``labs/grids/``)::

    output: build/grids/prompt-lengths      # optional; ``kvlab labs run --out`` wins
    runs:
      - lab: L02_ttft_tpot_sweep
        parameters: {repeats: 3}             # the same for every run of this entry
        grid:                                # every combination of these
          dtype: [float32, bfloat16]
          prompt_lengths: [[128, 1024], [128, 4096]]
      - lab: all                             # every lab, at its defaults

Every run gets a folder ``<out>/runs/<run id>/`` with its executed notebook, its results and ``status.json``. The run id
is the lab plus a hash of its parameters, so the same run keeps its folder: a second ``kvlab labs run`` skips runs
whose status is ``ok`` and executes the rest (failed or never finished).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pandas as pd

from kvlab.course import labs, raygrid
from kvlab.course.runs import Run, execute, status_of
from kvlab.runtime.errors import KVLabError


def load_grid(path: str | Path) -> tuple[list[Run], dict[str, Any]]:
    """Read a grid file, expand every entry into runs, and validate every run's parameters before anything runs."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise KVLabError(f"Grid file {str(path)!r} not found; see labs/grids/ for examples.")
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise KVLabError(f"Grid file {path.name} is not valid YAML ({str(exc).splitlines()[0]}).") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("runs"), list) or not spec["runs"]:
        raise KVLabError(f"Grid file {path.name} needs a non-empty list 'runs:' of entries with 'lab:' (see labs/grids/).")
    runs: list[Run] = []
    for n, entry in enumerate(spec["runs"], start=1):
        if not isinstance(entry, dict) or "lab" not in entry:
            raise KVLabError(f"Grid file {path.name}, entry {n}: each entry needs 'lab:' (and optionally 'parameters:', 'grid:').")
        unknown = set(entry) - {"lab", "parameters", "grid"}
        if unknown:
            raise KVLabError(f"Grid file {path.name}, entry {n}: unknown key(s) {sorted(unknown)}; use lab, parameters, grid.")
        chosen = labs.list_labs() if entry["lab"] == "all" else [labs.get(str(entry["lab"])).name]
        fixed = entry.get("parameters") or {}
        axes = entry.get("grid") or {}
        if not isinstance(fixed, dict) or not isinstance(axes, dict):
            raise KVLabError(f"Grid file {path.name}, entry {n} ({entry['lab']}): 'parameters' and 'grid' must be mappings of name: value.")
        for name, values in axes.items():
            if not isinstance(values, list) or not values:
                raise KVLabError(f"Grid file {path.name}, entry {n} ({entry['lab']}): grid axis {name!r} must be a non-empty list of values.")
        for lab in chosen:
            for combo in itertools.product(*axes.values()):
                params = {**fixed, **dict(zip(axes, combo, strict=True))}
                params.pop("output_dir", None)  # the grid decides where each run writes
                labs.validate(lab, params)  # one sentence naming the lab and the parameter, before any engine starts
                runs.append(Run(lab, params))
    ids = [r.run_id for r in runs]
    if len(set(ids)) != len(ids):
        raise KVLabError(f"Grid file {path.name} lists the same lab with the same parameters twice; remove the duplicate.")
    return runs, spec


def run_grid(grid_file: str | Path, out: str | Path | None = None, progress: bool = True,
             timeout_s: int | None = None, ray_address: str | None = None) -> pd.DataFrame:
    """Run every (lab × parameters) of a grid file that has not already finished ``ok`` in ``out``; a failing run is
    recorded with its error and the others go on. Runs here one after another, or — with ``ray_address`` ("local",
    "auto" or a cluster's address) — as Ray tasks across machines, each owning a whole node or one GPU
    (``kvlab.course.raygrid``); the results land in the same folders either way. Returns one row per run: run id, lab,
    status, seconds, error and whether it was executed now or skipped."""
    from tqdm.auto import tqdm

    runs, spec = load_grid(grid_file)
    out = Path(out or spec.get("output") or Path("build") / "grids" / Path(grid_file).stem).expanduser().resolve()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "grid.yaml").write_text(Path(grid_file).read_text())
    rows, todo = [], []
    for run in runs:
        previous = status_of(out, run)
        if previous and previous.get("status") == "ok":
            rows.append(previous | {"action": "skipped (done)"})
        else:
            todo.append(run)
    bar = tqdm(total=len(todo), desc=f"grid {Path(grid_file).stem}", unit="run", disable=not progress)
    if ray_address is None:
        statuses = (execute(run, out, timeout_s) for run in todo)
    else:

        statuses = raygrid.execute_all(todo, out, ray_address, timeout_s)
    for status in statuses:  # each status is on disk before it is yielded: an interrupted grid keeps every finished run
        rows.append(status | {"action": "executed"})
        mark = "ok    " if status["status"] == "ok" else "FAILED"
        where = f" on {status['node']}" if status.get("node") else ""
        bar.update(1)
        tqdm.write(f"{mark} {status['run_id']}{where} ({status['seconds']:.0f} s){'  ' + status['error'] if status['error'] else ''}")
    bar.close()
    order = {r.run_id: i for i, r in enumerate(runs)}
    table = pd.DataFrame(sorted(rows, key=lambda r: order[r["run_id"]]))
    table = table.reindex(columns=["run_id", "lab", "status", "action", "seconds", "error", "node", "parameters"])
    table.assign(parameters=table.parameters.map(json.dumps)).to_csv(out / "runs.csv", index=False)
    return table


def finished_runs(out: Path) -> list[tuple[dict[str, Any], Path]]:
    """(status, results folder) of every run under ``out`` that finished ``ok`` and wrote results."""
    done = []
    for st_path in sorted((out / "runs").glob("*/status.json")):
        st = json.loads(st_path.read_text())
        results = st_path.parent / "results"
        if st.get("status") == "ok" and (results / "results.parquet").is_file():
            done.append((st, results))
    return done


def varying(params: pd.Series) -> list[str]:
    """Parameter names whose values differ between the runs of one lab (what a comparison is about)."""
    frame = pd.DataFrame(list(params)).map(lambda v: json.dumps(v, sort_keys=True))
    return [c for c in frame.columns if frame[c].nunique() > 1]


def _cell(v: Any) -> Any:
    return json.dumps(v) if isinstance(v, (list, dict)) else v


def comparison_figure(lab: str, table: pd.DataFrame, varying: list[str]) -> Any:
    """The lab's comparison plot (from its definition) for collected runs, each run named by the parameters that differ
    between runs (its id when none do)."""
    spec = labs.get(lab)
    if spec.compare is None:
        return None
    names = table["run_id"]
    if varying:
        names = table[[f"param_{k}" for k in varying]].astype(str).apply(
            lambda row: ", ".join(f"{k}={v}" for k, v in zip(varying, row, strict=True)), axis=1)
    return spec.compare(table.assign(run=names))


def collect(out: str | Path) -> dict[str, pd.DataFrame]:
    """Gather every finished run's ``results`` under ``out`` into one table per lab, each row carrying its run id, the
    parameters that ran (``param_*``; ``asked_*`` too where quick mode ran smaller sizes than asked) and the machine
    it ran on (``machine_*``); write them as ``collected/<lab>.csv`` and ``.parquet``, plus ``collected/all.csv``
    (every lab's rows, columns united) and the lab's comparison plot (``collected/<lab>.html``)."""
    out = Path(out).expanduser().resolve()
    if not list((out / "runs").glob("*/status.json")):
        raise KVLabError(f"No runs found under {out}; run a grid there first (kvlab labs run GRID.yaml --out {out}).")
    per_lab: dict[str, list[pd.DataFrame]] = {}
    ran: dict[str, list[dict[str, Any]]] = {}
    for st, results in finished_runs(out):
        df = pd.read_parquet(results / "results.parquet")
        meta = json.loads((results / "metadata.json").read_text()) if (results / "metadata.json").is_file() else {}
        params = {k: v for k, v in meta.get("parameters", st["parameters"]).items() if k != "output_dir"}
        asked = meta.get("parameters_asked", {})
        df.insert(0, "run_id", st["run_id"])
        df.insert(1, "lab", st["lab"])
        for k, v in params.items():
            df[f"param_{k}"] = _cell(v)
            if k in asked and asked[k] != v:
                df[f"asked_{k}"] = _cell(asked[k])
        for k, v in meta.get("machine", {}).items():
            df[f"machine_{k}"] = str(v)
        per_lab.setdefault(st["lab"], []).append(df)
        ran.setdefault(st["lab"], []).append(params)
    target = out / "collected"
    target.mkdir(exist_ok=True)
    tables = {lab: pd.concat(frames, ignore_index=True) for lab, frames in sorted(per_lab.items())}
    for lab, table in tables.items():
        table.to_csv(target / f"{lab}.csv", index=False)
        table.to_parquet(target / f"{lab}.parquet", index=False)
        fig = comparison_figure(lab, table, varying(pd.Series(ran[lab])) if len(ran[lab]) > 1 else [])
        if fig is not None:
            fig.write_html(target / f"{lab}.html", include_plotlyjs=True)
    if tables:
        pd.concat(tables.values(), ignore_index=True).to_csv(target / "all.csv", index=False)
    return tables


def publish_reference(out: str | Path, dest: str | Path) -> list[Path]:
    """Copy each finished run's tables and metadata (no HTML: plotly pages are megabytes) into ``dest/<lab>/`` —
    how ``data/reference/`` is made from a grid run."""
    import shutil

    out, dest = Path(out).expanduser().resolve(), Path(dest).expanduser().resolve()
    written = []
    for st, results in finished_runs(out):
        target = dest / st["lab"]
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for f in results.iterdir():
            if f.suffix in {".csv", ".parquet", ".json"}:
                shutil.copy2(f, target / f.name)
        written.append(target)
    if not written:
        raise KVLabError(f"No finished runs with results under {out}.")
    return written
