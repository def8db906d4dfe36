"""Labs: parameters read from the tagged cell, validated before work starts; L01 runs headless and writes results."""

import json

import pandas as pd
import pytest

from kvlab import labs
from kvlab.errors import KVLabError


def test_parameters_cell_is_read_with_defaults_types_and_docs():
    spec = labs.lab_parameters("L01_capacity_planning")
    assert spec["model"]["default"] == "Llama-3.1-8B" and spec["model"]["type"] == "str"
    assert spec["memory_gib"]["type"] == "list" and "GiB" in spec["memory_gib"]["doc"]
    assert set(spec) >= {"utilization", "context_lengths", "kv_dtype", "block_size", "output_dir"}


def test_unknown_parameter_names_the_lab_and_lists_parameters():
    with pytest.raises(KVLabError, match=r"Lab L01_capacity_planning has no parameter 'memory'; its parameters are: model, memory_gib"):
        labs.validate("L01_capacity_planning", {"memory": 80})


@pytest.mark.parametrize("key, value", [("memory_gib", 80), ("block_size", "16"), ("context_lengths", [])])
def test_wrong_type_is_one_sentence(key, value):
    with pytest.raises(KVLabError, match=rf"Lab L01_capacity_planning: parameter {key}=.* should be"):
        labs.validate("L01_capacity_planning", {key: value})


def test_ints_are_accepted_for_floats_and_defaults_fill_in():
    params = labs.validate("L01_capacity_planning", {"memory_gib": [24, 80]})
    assert params["memory_gib"] == [24, 80] and params["model"] == "Llama-3.1-8B"


def test_unknown_lab_lists_labs():
    with pytest.raises(KVLabError, match="Unknown lab 'L99'.*L01_capacity_planning"):
        labs.lab_path("L99")


@pytest.mark.notebook
def test_lab_l01_runs_headless_twice_and_writes_tidy_results(tmp_path):
    import papermill as pm

    out = tmp_path / "out"
    for _ in range(2):  # safe to run twice
        pm.execute_notebook(str(labs.lab_path("L01_capacity_planning")), str(tmp_path / "run.ipynb"), cwd=str(labs.LAB_DIR),
                            parameters={"model": "Qwen2.5-7B-Instruct", "memory_gib": [24, 80], "context_lengths": [8192, 32768],
                                        "output_dir": str(out)}, progress_bar=False, kernel_name="python3")
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 4 and set(df.memory_gib) == {24, 80} and (df.model == "Qwen2.5-7B-Instruct").all()
    assert pd.read_csv(out / "results.csv").shape == df.shape
    # more memory never fits fewer sequences; longer context never fits more
    piv = df.pivot_table(index="context", columns="memory_gib", values="max_sequences")
    assert (piv[80] >= piv[24]).all() and piv.loc[32768, 80] <= piv.loc[8192, 80]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["parameters"]["model"] == "Qwen2.5-7B-Instruct" and "cores usable" in meta["machine"]
    assert (out / "capacity.html").stat().st_size > 10_000


@pytest.mark.notebook
def test_lab_l01_bad_parameter_fails_with_one_sentence(tmp_path):
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError) as err:
        pm.execute_notebook(str(labs.lab_path("L01_capacity_planning")), str(tmp_path / "bad.ipynb"), cwd=str(labs.LAB_DIR),
                            parameters={"model": "Llama-9", "output_dir": str(tmp_path)}, progress_bar=False, kernel_name="python3")
    assert "Unknown model preset 'Llama-9'" in str(err.value)


@pytest.mark.notebook
def test_lab_l02_runs_headless_in_quick_mode(tmp_path, monkeypatch):
    import papermill as pm

    monkeypatch.setenv("KVLAB_QUICK", "1")
    out = tmp_path / "out"
    pm.execute_notebook(str(labs.lab_path("L02_ttft_tpot_sweep")), str(tmp_path / "run.ipynb"), cwd=str(labs.LAB_DIR),
                        parameters={"prompt_lengths": [64, 512, 1024], "output_lengths": [4, 8], "repeats": 3, "output_dir": str(out)},
                        progress_bar=False, kernel_name="python3")
    df = pd.read_parquet(out / "results.parquet")
    assert set(df.prompt_tokens) == {64, 512} and set(df.output_tokens) == {4} and len(df) == 4  # quick mode shrank the sweep
    assert {"ttft_s", "tpot_s", "ttft_bound_s", "tpot_over_bound", "dtype", "enforce_eager"} <= set(df.columns)
    med = df.groupby("prompt_tokens").ttft_s.median()
    assert med[512] > med[64]  # longer prompts take longer to the first token
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["engine"]["limits"]["matmul_flops"] > 0 and meta["parameters"]["repeats"] == 3
    assert (out / "summary.csv").exists() and (out / "ttft_tpot.html").exists()


def test_lab_l02_refuses_zero_repeats():
    with pytest.raises(KVLabError, match="Lab L02_ttft_tpot_sweep: parameter repeats must be positive, got 0"):
        labs.require_positive("L02_ttft_tpot_sweep", repeats=0)


@pytest.mark.notebook
def test_lab_l03_reports_hit_rate_and_ttft_delta(tmp_path):
    import papermill as pm

    out = tmp_path / "out"
    pm.execute_notebook(str(labs.lab_path("L03_prefix_cache_delta")), str(tmp_path / "run.ipynb"), cwd=str(labs.LAB_DIR),
                        parameters={"prefix_tokens": 512, "suffix_tokens": 32, "requests": 4, "shared_fraction": 0.75, "output_dir": str(out)},
                        progress_bar=False, kernel_name="python3")
    df = pd.read_parquet(out / "results.parquet")
    summary = pd.read_csv(out / "summary.csv").set_index("caching")
    assert set(df.caching) == {"on", "off"} and len(df) == 8
    assert summary.token_hit_rate["off"] == 0 and summary.token_hit_rate["on"] > 0
    assert (df[(df.caching == "on") & (df.label == "unique")].cached_tokens == 0).all()
    assert "ttft_p50_delta_ms" in summary.columns


def test_lab_l03_refuses_a_fraction_above_one():
    with pytest.raises(KVLabError, match="Lab L03_prefix_cache_delta: parameter shared_fraction must be a fraction between 0 and 1, got 1.5"):
        labs.require_fraction("L03_prefix_cache_delta", shared_fraction=1.5)


@pytest.mark.notebook
def test_lab_l04_compares_chunked_prefill_configs(tmp_path):
    import papermill as pm

    out = tmp_path / "out"
    pm.execute_notebook(str(labs.lab_path("L04_chunked_prefill")), str(tmp_path / "run.ipynb"), cwd=str(labs.LAB_DIR),
                        parameters={"decoders": 2, "decoder_output_tokens": 24, "long_prompt_tokens": 1024, "long_arrival_s": 0.3,
                                    "budgets": [128], "output_dir": str(out)}, progress_bar=False, kernel_name="python3")
    df = pd.read_parquet(out / "results.parquet").set_index("config")
    assert list(df.index) == ["chunked off", "chunks of 128"]
    assert df.decoder_itl_max_ms["chunks of 128"] < df.decoder_itl_max_ms["chunked off"]
    assert (out / "tokens.parquet").exists() and (out / "tradeoff.html").exists()


@pytest.mark.notebook
def test_lab_l05_batch_sweep(tmp_path):
    import papermill as pm

    out = tmp_path / "out"
    pm.execute_notebook(str(labs.lab_path("L05_batch_sweep")), str(tmp_path / "run.ipynb"), cwd=str(labs.LAB_DIR),
                        parameters={"batch_sizes": [1, 8], "output_tokens": 16, "output_dir": str(out)}, progress_bar=False, kernel_name="python3")
    s = pd.read_csv(out / "summary.csv").set_index("batch_size")
    assert s.decode_tok_s[8] > s.decode_tok_s[1]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["engine"]["kv_capacity"]["tokens"] > 0


def test_validate_checks_positive_and_fraction_parameters():
    with pytest.raises(KVLabError, match="parameter repeats must be positive, got 0"):
        labs.validate("L02_ttft_tpot_sweep", {"repeats": 0}, positive=("repeats", "prompt_lengths"))
    with pytest.raises(KVLabError, match="parameter prompt_lengths must be positive, got -5"):
        labs.validate("L02_ttft_tpot_sweep", {"prompt_lengths": [128, -5]}, positive=("prompt_lengths",))
    with pytest.raises(KVLabError, match="shared_fraction must be a fraction"):
        labs.validate("L03_prefix_cache_delta", {"shared_fraction": 2.0}, fractions=("shared_fraction",))
