"""One lab run of a grid: its id (the lab plus a hash of its parameters), its folder, its status record, and its
execution with papermill — shared by the local grid (``grid``) and the Ray one (``raygrid``)."""

from __future__ import annotations

import hashlib
import json
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvlab.course import labs
from kvlab.runtime import kernels


@dataclass
class Run:
    """One lab with one parameter set."""

    lab: str
    parameters: dict[str, Any]

    def record(self, **fields: Any) -> dict[str, Any]:
        """This run's status record (what ``status.json`` holds): its id, lab and parameters, plus ``fields``."""
        return {"run_id": self.run_id, "lab": self.lab, "parameters": self.parameters} | fields

    @property
    def run_id(self) -> str:
        digest = hashlib.sha256(json.dumps([self.lab, self.parameters], sort_keys=True).encode()).hexdigest()[:10]
        return f"{self.lab}-{digest}"


def status_of(out: Path, run: Run) -> dict[str, Any] | None:
    """The recorded status of a run in ``out``, or None if it never finished."""
    path = out / "runs" / run.run_id / "status.json"
    return json.loads(path.read_text()) if path.is_file() else None


def write_status(path: Path, status: dict[str, Any]) -> None:
    """Write a run's status atomically (a temporary file, then a rename): a reader never sees half of it."""
    tmp = path.with_name(".status.json.tmp")
    tmp.write_text(json.dumps(status, indent=2, default=str))
    os.replace(tmp, path)


def _short_error(exc: BaseException) -> str:
    """One line for a failed run: the notebook's own exception name and message when papermill reports one."""
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    if ename:
        return f"{ename}: {str(evalue).strip().splitlines()[0] if evalue else ''}"
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


def execute(run: Run, out: Path, timeout_s: int | None = None) -> dict[str, Any]:
    """Execute one run with papermill into its folder; never raises for a failing notebook (the status says it)."""

    folder = out / "runs" / run.run_id
    folder.mkdir(parents=True, exist_ok=True)
    status = run.record(started=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    t0 = time.perf_counter()
    try:
        kernels.execute(labs.lab_path(run.lab), folder / f"{run.lab}.ipynb", run.parameters | {"output_dir": str(folder / "results")},
                        labs.LAB_DIR, execution_timeout=timeout_s)
        status |= {"status": "ok", "error": ""}
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - recorded, and the grid goes on
        status |= {"status": "failed", "error": _short_error(exc)}
        (folder / "error.txt").write_text("".join(traceback.format_exception(exc)))
    status |= {"seconds": round(time.perf_counter() - t0, 1), "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_status(folder / "status.json", status)
    return status
