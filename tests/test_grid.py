"""Lab grids: expansion and validation before anything runs; a real grid with a failing entry, resumed; collect."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvlab.course import grid
from kvlab.course.cli import main
from kvlab.runtime.errors import KVLabError


def write(tmp_path, text: str):
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    return path


def test_grid_expands_every_combination(tmp_path):
    runs, _ = grid.load_grid(write(tmp_path, """
runs:
  - lab: L02_ttft_tpot_sweep
    parameters: {repeats: 2}
    grid: {dtype: [float32, bfloat16], prompt_lengths: [[128, 512], [128, 1024], [64]]}
  - lab: L01_capacity_planning
"""))
    assert len(runs) == 7 and len({r.run_id for r in runs}) == 7
    assert runs[0].parameters == {"repeats": 2, "dtype": "float32", "prompt_lengths": [128, 512]}
    assert runs[-1].lab == "L01_capacity_planning" and runs[-1].parameters == {}
    # the id depends only on lab and parameters: the same run keeps its folder across invocations
    assert runs[0].run_id == grid.Run("L02_ttft_tpot_sweep", {"dtype": "float32", "prompt_lengths": [128, 512], "repeats": 2}).run_id


@pytest.mark.parametrize("entry, message", [
    ("lab: L02_ttft_tpot_sweep\n    parameters: {prompt_length: [128]}",
     r"Lab L02_ttft_tpot_sweep has no parameter 'prompt_length' \(did you mean prompt_lengths\?\); its parameters are: model, prompt_lengths"),
    ("lab: L02_ttft_tpot_sweep\n    grid: {repeats: [3, '4']}", r"Lab L02_ttft_tpot_sweep: parameter repeats='4' should be a int"),
    ("lab: L06_traffic_mix\n    grid: {agent_share: [0.2, 1.5]}",
     "Lab L06_traffic_mix: parameter agent_share must be a fraction between 0 and 1, got 1.5"),
    ("lab: L06_traffic_mix\n    parameters: {agent_tools: 40}", "Lab L06_traffic_mix: parameter agent_tools must be between 0 and 13, got 40"),
    ("lab: L99_nothing", "Unknown lab 'L99_nothing'; the labs are: L01_capacity_planning"),
    ("lab: L02_ttft_tpot_sweep\n    grid: {repeats: 3}", "grid axis 'repeats' must be a non-empty list"),
])
def test_bad_grids_are_refused_before_anything_runs(tmp_path, entry, message):
    with pytest.raises(KVLabError, match=message):
        grid.run_grid(write(tmp_path, f"runs:\n  - {entry}\n"), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_not_yaml_and_no_runs_are_one_sentence(tmp_path):
    with pytest.raises(KVLabError, match="is not valid YAML"):
        grid.load_grid(write(tmp_path, "runs: [\n"))
    with pytest.raises(KVLabError, match="needs a non-empty list 'runs:'"):
        grid.load_grid(write(tmp_path, "output: x\n"))


#: Three L01 runs, one of which fails at run time (Llama-9 is no preset). The Ray test runs the first two on Ray.
FAILING_GRID = """
runs:
  - lab: L01_capacity_planning
    parameters: {memory_gib: [24, 80], context_lengths: [8192, 32768]}
    grid:
      model: [Llama-3.1-8B, Llama-9, Qwen2.5-7B-Instruct]
      kv_dtype: [bf16]
"""


@pytest.fixture(scope="module")
def local_grid(tmp_path_factory):
    """FAILING_GRID run once locally: (grid file, output folder, exit code, what it printed)."""
    import contextlib
    import io

    folder = tmp_path_factory.mktemp("local-grid")
    grid_file = write(folder, FAILING_GRID)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["labs", "run", str(grid_file), "--out", str(folder / "out")])
    return grid_file, folder / "out", code, printed.getvalue()


@pytest.mark.notebook
def test_grid_with_a_failing_entry_finishes_the_rest_and_resumes_only_that_entry(local_grid):
    grid_file, out, code, printed = local_grid
    assert code == 1
    first = pd.read_csv(out / "runs.csv")
    assert sorted(first.status) == ["failed", "ok", "ok"] and (first.action == "executed").all()
    failed = first[first.status == "failed"].iloc[0]
    assert "Unknown model preset 'Llama-9'" in failed.error
    assert "FAILED" in printed
    assert (out / "runs" / failed.run_id / "L01_capacity_planning.ipynb").exists()  # the executed notebook is kept

    assert main(["labs", "run", str(grid_file), "--out", str(out)]) == 1  # second run: only the failed entry executes
    second = pd.read_csv(out / "runs.csv").set_index("run_id")
    assert second.loc[failed.run_id, "action"] == "executed"
    assert (second.drop(index=failed.run_id).action == "skipped (done)").all()

    assert main(["labs", "collect", str(out)]) == 0
    table = pd.read_parquet(out / "collected" / "L01_capacity_planning.parquet")
    assert set(table.param_model) == {"Llama-3.1-8B", "Qwen2.5-7B-Instruct"} and table.run_id.nunique() == 2
    assert json.loads(table.param_memory_gib.iloc[0]) == [24, 80]
    assert {"machine_cores usable", "machine_vllm", "max_sequences"} <= set(table.columns)
    assert len(table) == 8 and (out / "collected" / "L01_capacity_planning.html").stat().st_size > 10_000
    assert pd.read_csv(out / "collected" / "all.csv").shape[0] == 8


def test_collect_of_an_empty_folder_says_what_to_do(tmp_path):
    with pytest.raises(KVLabError, match="No runs found under .*; run a grid there first"):
        grid.collect(tmp_path)


def test_labs_list_shows_parameters_with_types_defaults_and_units(capsys):
    assert main(["labs", "list"]) == 0
    text = capsys.readouterr().out
    assert "L06_traffic_mix" in text and "rate_per_s" in text and "requests per second" in text
    assert "prompt_lengths           list   = [128, 512, 1024, 2048]" in text


def test_example_grids_are_valid():
    for path in (grid.labs.LAB_DIR / "grids").glob("*.yaml"):
        runs, _ = grid.load_grid(path)
        assert runs, path


def test_lab_all_expands_to_every_lab_at_its_defaults(tmp_path):
    runs, _ = grid.load_grid(write(tmp_path, "runs:\n  - lab: all\n"))
    assert [r.lab for r in runs] == grid.labs.list_labs() and all(r.parameters == {} for r in runs)


def _loopback(ip: str) -> bool:
    import ipaddress

    addr = ipaddress.ip_address(ip)
    return addr.is_loopback or bool(getattr(addr, "ipv4_mapped", None) and addr.ipv4_mapped.is_loopback)


def _listening_addresses(stop, seen) -> None:
    """Every TCP port a process of this test (and its children: Ray's) listens on, sampled until ``stop`` is set."""
    import psutil

    while not stop.is_set():
        me = psutil.Process()
        for proc in [me, *me.children(recursive=True)]:
            try:
                seen |= {(c.laddr.ip, proc.name()) for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        stop.wait(0.5)


@pytest.mark.notebook
def test_ray_grid_lands_results_like_a_local_run_resumes_and_listens_on_loopback_only(tmp_path, local_grid):
    """A small L01 grid on a local Ray instance: each run is a Ray task that owns the (only) node; the results land in
    the same folders as a local run's, collect is unchanged, a second run executes only what failed."""
    import threading

    pytest.importorskip("ray", reason="the ray extra is not installed (make test installs it)")
    grid_file = write(tmp_path, FAILING_GRID.replace(", Qwen2.5-7B-Instruct", ""))  # its first two runs, same ids
    _, local, _, _ = local_grid
    on_ray = tmp_path / "ray"
    stop, seen = threading.Event(), set()
    sampler = threading.Thread(target=_listening_addresses, args=(stop, seen), daemon=True)
    sampler.start()
    try:
        assert main(["labs", "run", str(grid_file), "--out", str(on_ray), "--ray", "local"]) == 1
    finally:
        stop.set()
        sampler.join()
    assert seen and all(_loopback(ip) for ip, _ in seen), sorted(seen)  # Ray's servers included

    def files(out, run_ids):
        return {str(p.relative_to(out / "runs")) for p in (out / "runs").rglob("*") if p.is_file() and p.relative_to(out / "runs").parts[0] in run_ids}

    ray_ids = {p.name for p in (on_ray / "runs").iterdir()}
    assert len(ray_ids) == 2 and files(on_ray, ray_ids) == files(local, ray_ids)  # the same layout, run for run
    table = pd.read_csv(on_ray / "runs.csv").set_index("run_id")
    assert sorted(table.status) == ["failed", "ok"] and table.node.notna().all()
    failed = table[table.status == "failed"].index[0]
    assert "Unknown model preset 'Llama-9'" in table.error[failed]
    status = json.loads((on_ray / "runs" / failed / "status.json").read_text())
    assert status["node"] and status["status"] == "failed"

    assert main(["labs", "run", str(grid_file), "--out", str(on_ray), "--ray", "local"]) == 1  # resume: only the failed run
    again = pd.read_csv(on_ray / "runs.csv").set_index("run_id")
    assert again.action[failed] == "executed" and (again.drop(index=failed).action == "skipped (done)").all()

    assert main(["labs", "collect", str(on_ray)]) == 0
    ray_rows = pd.read_parquet(on_ray / "collected" / "L01_capacity_planning.parquet")
    main(["labs", "collect", str(local)])
    local_rows = pd.read_parquet(local / "collected" / "L01_capacity_planning.parquet")
    local_rows = local_rows[local_rows.run_id.isin(ray_rows.run_id)]
    key = ["context", "memory_gib", "max_sequences", "kv_tokens"]
    assert ray_rows[key].sort_values(key).reset_index(drop=True).equals(local_rows[key].sort_values(key).reset_index(drop=True))


def test_ray_grid_without_a_cluster_is_one_sentence(tmp_path):
    pytest.importorskip("ray", reason="the ray extra is not installed")
    from kvlab.course import raygrid

    with pytest.raises(KVLabError, match="Could not reach a Ray cluster at 'ray://127.0.0.1:1'"):
        list(raygrid.execute_all([grid.Run("L01_capacity_planning", {})], tmp_path, "ray://127.0.0.1:1"))
