"""Write a run's results the same way everywhere: tidy CSV + Parquet, and a JSON of run metadata."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pandas as pd

from kvlab.runtime.envinfo import env_report


def run_metadata(parameters: Any, engine_settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parameters, machine (the environment report), engine settings and time of a run. ``parameters`` is a lab's
    validated ``kvlab.course.labs.Params`` (the values that ran, and separately what was asked) or a plain dict."""

    params = parameters.metadata() if hasattr(parameters, "metadata") else {"parameters": parameters}
    return params | {"machine": env_report(), "engine": engine_settings or {}, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _write_table(df: pd.DataFrame, path: Path) -> None:
    """Write a table as CSV or Parquet (by suffix) under a temporary name, then rename: never half-written."""
    tmp = path.with_name(f".{path.name}.tmp")
    if path.suffix == ".parquet":
        df.to_parquet(tmp, index=False)
    else:
        df.to_csv(tmp, index=False)
    os.replace(tmp, path)


def save_results(df: pd.DataFrame, out_dir: str | Path, parameters: Any, name: str = "results",
                 engine_settings: dict[str, Any] | None = None, tables: dict[str, pd.DataFrame] | None = None,
                 figures: dict[str, Any] | None = None) -> Path:
    """Write ``name.csv``, ``name.parquet``, ``metadata.json``, extra ``tables`` ({file name: frame}) and plotly
    ``figures`` ({file name: figure}, standalone HTML) into ``out_dir``, overwriting: safe to re-run.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for file_name, table in {f"{name}.csv": df, f"{name}.parquet": df, **(tables or {})}.items():
        _write_table(table, out / file_name)
    for file_name, fig in (figures or {}).items():
        fig.write_html(out / file_name, include_plotlyjs=True)
    meta = out / "metadata.json"
    meta.write_text(json.dumps(run_metadata(parameters, engine_settings), indent=2, default=str))
    return out
