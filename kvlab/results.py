"""Write a run's results the same way everywhere: tidy CSV + Parquet, and a JSON of run metadata."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pandas as pd


def run_metadata(parameters: dict[str, Any], engine_settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parameters, machine (the environment report), engine settings and time of a run."""
    from kvlab.envinfo import env_report

    return {"parameters": parameters, "machine": env_report(), "engine": engine_settings or {},
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def save_results(df: pd.DataFrame, out_dir: str | Path, parameters: dict[str, Any], name: str = "results",
                 engine_settings: dict[str, Any] | None = None) -> Path:
    """Write ``name.csv``, ``name.parquet`` and ``metadata.json`` into ``out_dir`` (overwriting: safe to re-run).

    Files are written to a temporary name and renamed, so a crash never leaves a half-written table.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for suffix, write in ((".csv", lambda p: df.to_csv(p, index=False)), (".parquet", lambda p: df.to_parquet(p, index=False))):
        tmp = out / f".{name}{suffix}.tmp"
        write(tmp)
        os.replace(tmp, out / f"{name}{suffix}")
    meta = out / "metadata.json"
    meta.write_text(json.dumps(run_metadata(parameters, engine_settings), indent=2, default=str))
    return out
