"""Labs: one definition per lab (kvlab/labs/), the notebook's parameters cell agrees with it, parameters validated
before work starts (quick mode applied there, so results record what ran); each lab runs headless and writes results."""

import json
import re
import subprocess
import sys

import nbformat
import pandas as pd
import pytest

from kvlab.course import labs
from kvlab.runtime import config
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.model import SECOND_MODEL

REFERENCE = config.REPO_ROOT / "data" / "reference" / "cpu"


@pytest.mark.parametrize("lab", labs.all_labs(), ids=lambda lab: lab.name)
def test_notebook_parameters_cell_agrees_with_the_lab_definition(lab):
    """Papermill reads the notebook's cell; everything else reads the definition: they must say the same thing."""
    cell = labs.notebook_parameters(lab.name)
    assert list(cell) == [p.name for p in lab.params]
    for p in lab.params:
        assert cell[p.name]["default"] == p.default, p.name
        assert cell[p.name]["doc"] == p.doc, p.name
    sources = "\n".join(c.source for c in nbformat.read(lab.notebook, as_version=4).cells)
    assert f'kvlab.labs.validate_namespace("{lab.name}", globals())' in sources


def test_every_lab_has_questions_a_comparison_plot_and_a_reference_run():
    for lab in labs.all_labs():
        assert lab.questions and lab.compare is not None, lab.name
        assert all(q.qid.startswith(lab.key + ".") for q in lab.questions)
        assert (REFERENCE / lab.name / "metadata.json").is_file(), f"no reference results for {lab.name}"


def test_unknown_parameter_names_the_lab_suggests_and_lists_parameters():
    with pytest.raises(KVLabError, match=r"Lab L01_capacity_planning has no parameter 'memroy_gib' \(did you mean memory_gib\?\); "
                                         r"its parameters are: model, memory_gib"):
        labs.validate("L01_capacity_planning", {"memroy_gib": 80})


@pytest.mark.parametrize("key, value", [("memory_gib", 80), ("block_size", "16"), ("context_lengths", [])])
def test_wrong_type_is_one_sentence(key, value):
    with pytest.raises(KVLabError, match=rf"Lab L01_capacity_planning: parameter {key}=.* should be"):
        labs.validate("L01_capacity_planning", {key: value})


@pytest.mark.parametrize("lab, given, message", [
    ("L02", {"repeats": 0}, "Lab L02_ttft_tpot_sweep: parameter repeats must be positive, got 0"),
    ("L02", {"prompt_lengths": [128, -5]}, "parameter prompt_lengths must be positive, got -5"),
    ("L02", {"dtype": "fp32"}, "parameter dtype must be one of 'auto', 'float32', 'bfloat16', 'float16', got 'fp32'"),
    ("L03", {"shared_fraction": 1.5}, "Lab L03_prefix_cache_delta: parameter shared_fraction must be a fraction between 0 and 1, got 1.5"),
    ("L01", {"utilization": 1.2}, "parameter utilization must be between 0.01 and 1, got 1.2"),
])
def test_rules_are_one_sentence_naming_lab_and_parameter(lab, given, message):
    with pytest.raises(KVLabError, match=re.escape(message)):
        labs.validate(lab, given)


def test_ints_are_accepted_for_floats_and_defaults_fill_in():
    params = labs.validate("L01_capacity_planning", {"memory_gib": [24, 80]})
    assert params.memory_gib == [24, 80] and params.model == "Llama-3.1-8B"


def test_quick_mode_sizes_are_applied_in_validation(monkeypatch):
    monkeypatch.setenv("KVLAB_QUICK", "1")
    p = labs.validate("L05_batch_sweep", {"batch_sizes": [1, 4, 16, 32], "repeats": 3})
    assert p.batch_sizes == [1, 32] and p.repeats == 1  # what runs
    assert p.asked["batch_sizes"] == [1, 4, 16, 32] and p.asked["repeats"] == 3  # what was asked
    assert p.shrunk == {"batch_sizes": ([1, 4, 16, 32], [1, 32]), "repeats": (3, 1)}
    meta = p.metadata()
    assert meta["parameters"]["repeats"] == 1 and meta["parameters_asked"]["repeats"] == 3 and meta["quick_mode"]
    monkeypatch.setenv("KVLAB_QUICK", "")
    assert labs.validate("L05_batch_sweep", {"repeats": 3}).repeats == 3 and not labs.validate("L05", {}).shrunk


def test_a_request_longer_than_the_model_s_context_is_refused_before_any_engine_starts(monkeypatch):
    """The base model has 2,048 positions: L04's default long prompt (2,048 + its 4 output tokens) cannot run on it,
    and L02's longest prompt only in full mode; the course model's 8,192 take both."""
    from kvlab.runtime.model import BASE_MODEL

    monkeypatch.setenv("KVLAB_QUICK", "0")
    with pytest.raises(KVLabError) as err:
        labs.validate("L04_chunked_prefill", {"model": BASE_MODEL})
    assert str(err.value) == ("Lab L04_chunked_prefill: its longest request, long_prompt_tokens + its 4 output tokens = "
                              "2,052 tokens, is longer than the model's context of 2,048 tokens; lower them, or choose a "
                              "model with a longer context.")
    assert labs.validate("L04_chunked_prefill", {"model": BASE_MODEL, "long_prompt_tokens": 2044}).long_prompt_tokens == 2044
    with pytest.raises(KVLabError, match=r"max\(prompt_lengths\) \+ max\(output_lengths\) = 2,080 tokens"):
        labs.validate("L02_ttft_tpot_sweep", {"model": BASE_MODEL})
    monkeypatch.setenv("KVLAB_QUICK", "1")  # quick mode runs the first two prompt lengths: 512 + 32 fits
    assert labs.validate("L02_ttft_tpot_sweep", {"model": BASE_MODEL}).prompt_lengths == [128, 512]
    assert labs.validate("L04_chunked_prefill", {}).long_prompt_tokens == 2048  # the course model: 8,192 positions


def test_traffic_labs_count_their_longest_request_with_the_model_s_tokenizer(monkeypatch):
    """L06's agent prompt grows every turn and L07's batch jobs are long documents: both are counted in the model's
    chat template before any engine starts (vLLM's server would clip max_tokens to fit, silently:
    vllm/entrypoints/serve/utils/api_utils.py get_max_tokens)."""
    from kvlab.runtime.model import BASE_MODEL

    monkeypatch.setenv("KVLAB_QUICK", "0")
    with pytest.raises(KVLabError, match=r"Lab L06_traffic_mix: its longest request, the last agent turn's prompt .* = "
                                         r"2,[0-9]{3} tokens, is longer than the model's context of 2,048 tokens"):
        labs.validate("L06_traffic_mix", {"model": BASE_MODEL})  # 1 tool (~1,000 tokens) + 3 × 400 grown
    assert labs.validate("L06_traffic_mix", {"model": BASE_MODEL, "agent_turns": 2}).agent_turns == 2
    assert labs.validate("L06_traffic_mix", {"model": BASE_MODEL, "agent_share": 0.0}).agent_share == 0.0  # chats only
    batch = {"model": BASE_MODEL, "chat_share": 0.5, "batch_share": 0.5}
    with pytest.raises(KVLabError, match=r"a batch request \(batch_prompt_tokens \+ the summary instruction \+ "
                                         r"batch_output_tokens\) = 2,[0-9]{3} tokens"):
        labs.validate("L07_slo_capacity", batch | {"batch_prompt_tokens": 2000})
    assert labs.validate("L07_slo_capacity", batch | {"batch_prompt_tokens": 1200}).batch_prompt_tokens == 1200


def test_papermill_injected_names_are_read_from_the_kernel_history():
    history = ["", "model = ''\nrepeats = 3  # doc", "# Parameters\nmemroy_gib = 24\noutput_dir = \"/tmp/x\"\n", "x = 1"]
    assert labs.injected_names({"In": history}) == ["memroy_gib", "output_dir"]
    with pytest.raises(KVLabError, match=r"has no parameter 'memroy_gib' \(did you mean memory_gib"):
        labs.validate_namespace("L01_capacity_planning", {"In": history, "memroy_gib": 24})
    p = labs.validate_namespace("L01_capacity_planning", {"In": ["# Parameters\nblock_size = 32\n"], "block_size": 32, "fig": 1})
    assert p.block_size == 32  # names that are not parameters (a learner's own variables) are left alone


def test_unknown_lab_lists_labs():
    with pytest.raises(KVLabError, match="Unknown lab 'L99'.*L01_capacity_planning"):
        labs.lab_path("L99")


@pytest.mark.notebook
def test_a_typo_on_papermills_command_line_fails_with_one_sentence(tmp_path):
    """papermill itself only warns about a parameter the notebook does not define, and runs on with the default. Run
    the way the README says: with KV Lab's engine (an ipc:// kernel; ipykernel warns of nothing)."""
    res = subprocess.run([sys.executable, "-m", "papermill", "--engine", "kvlab", str(labs.lab_path("L01")), str(tmp_path / "out.ipynb"),
                          "-p", "memroy_gib", "24", "-p", "output_dir", str(tmp_path / "results")],
                         cwd=labs.LAB_DIR, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    assert ("KVLabError: Lab L01_capacity_planning has no parameter 'memroy_gib' (did you mean memory_gib?); its parameters "
            "are: model, memory_gib,") in res.stderr
    assert not (tmp_path / "results").exists()  # refused before any work
    assert "without encryption" not in res.stderr  # ipykernel's warning about a kernel on plain TCP


@pytest.mark.notebook
def test_lab_l01_runs_headless_twice_and_writes_tidy_results(tmp_path):
    """Lab L01 twice into one folder (safe to run twice, the one test of the results writer for every lab) on a
    7B preset: the planning tables lesson 01 does not write. No engine."""
    from kvlab.runtime import kernels

    out = tmp_path / "out"
    for _ in range(2):  # safe to run twice
        kernels.execute(str(labs.lab_path("L01_capacity_planning")), str(tmp_path / "run.ipynb"), cwd=str(labs.LAB_DIR),
                        parameters={"model": "Qwen2.5-7B-Instruct", "memory_gib": [24, 80], "context_lengths": [8192, 32768],
                                    "output_dir": str(out)})
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
    """An unknown model preset fails the executed lab with one sentence (papermill's error), which no lesson can show."""
    import papermill as pm

    from kvlab.runtime import kernels

    with pytest.raises(pm.PapermillExecutionError) as err:
        kernels.execute(str(labs.lab_path("L01_capacity_planning")), str(tmp_path / "bad.ipynb"), cwd=str(labs.LAB_DIR),
                        parameters={"model": "Llama-9", "output_dir": str(tmp_path)})
    assert "Unknown model preset 'Llama-9'" in str(err.value)


@pytest.mark.notebook
def test_lab_l02_quick_mode_records_the_sizes_that_ran(tmp_path, monkeypatch, second_model):
    """Lab L02's one CI run, on the second model: metadata.json says what quick mode ran and what was asked, and the
    rows agree point by point; lesson 02 runs the course model and writes no tables."""
    from kvlab.runtime import kernels

    monkeypatch.setenv("KVLAB_QUICK", "1")
    out = tmp_path / "out"
    executed = tmp_path / "run.ipynb"
    kernels.execute(str(labs.lab_path("L02_ttft_tpot_sweep")), str(executed), cwd=str(labs.LAB_DIR),
                    parameters={"prompt_lengths": [64, 512, 1024], "output_lengths": [4, 8], "repeats": 3, "model": SECOND_MODEL,
                                "output_dir": str(out)})
    df = pd.read_parquet(out / "results.parquet")
    meta = json.loads((out / "metadata.json").read_text())
    ran, asked = meta["parameters"], meta["parameters_asked"]
    # metadata.json states what ran — and the rows agree with it, point by point
    assert ran["prompt_lengths"] == [64, 512] and ran["output_lengths"] == [4] and ran["repeats"] == 2 and meta["quick_mode"]
    assert ran["model"] == SECOND_MODEL
    assert set(df.prompt_tokens) == set(ran["prompt_lengths"]) and set(df.output_tokens) == set(ran["output_lengths"])
    assert (df.groupby(["prompt_tokens", "output_tokens"]).size() == ran["repeats"]).all()
    assert len(df) == len(ran["prompt_lengths"]) * len(ran["output_lengths"]) * ran["repeats"]
    assert asked["prompt_lengths"] == [64, 512, 1024] and asked["repeats"] == 3  # and, separately, what was asked
    printed = "".join(o.get("text", "") for c in nbformat.read(executed, as_version=4).cells if c.cell_type == "code" for o in c.outputs)
    assert "quick mode (KVLAB_QUICK=1) runs prompt_lengths=[64, 512] (asked [64, 512, 1024])" in printed
    assert {"ttft_s", "tpot_s", "ttft_bound_s", "tpot_over_bound", "dtype", "enforce_eager"} <= set(df.columns)
    med = df.groupby("prompt_tokens").ttft_s.median()
    assert med[512] > med[64]  # longer prompts take longer to the first token
    assert meta["engine"]["limits"]["matmul_flops"] > 0
    assert (out / "summary.csv").exists() and (out / "ttft_tpot.html").exists()


@pytest.mark.notebook
def test_lab_l03_reports_hit_rate_and_ttft_delta(tmp_path, second_model):
    """Lab L03's one CI run, on the second model: the caching on/off table and its summary columns; the hit-rate
    claims themselves are asserted by lesson 03 on the course model."""
    from kvlab.runtime import kernels

    out = tmp_path / "out"
    kernels.execute(str(labs.lab_path("L03_prefix_cache_delta")), str(tmp_path / "run.ipynb"), cwd=str(labs.LAB_DIR),
                    parameters={"prefix_tokens": 512, "suffix_tokens": 32, "requests": 4, "shared_fraction": 0.75,
                                "model": SECOND_MODEL, "output_dir": str(out)})
    df = pd.read_parquet(out / "results.parquet")
    summary = pd.read_csv(out / "summary.csv").set_index("caching")
    assert set(df.caching) == {"on", "off"} and len(df) == 8
    assert summary.token_hit_rate["off"] == 0 and summary.token_hit_rate["on"] > 0
    assert (df[(df.caching == "on") & (df.label == "unique")].cached_tokens == 0).all()
    assert "ttft_p50_delta_ms" in summary.columns
    assert json.loads((out / "metadata.json").read_text())["parameters"]["model"] == SECOND_MODEL


@pytest.mark.notebook
def test_lab_l04_compares_chunked_prefill_configs(tmp_path, second_model):
    """Lab L04's one CI run, on the second model: one row per configuration, the token table and the trade-off
    figure an instructor compares across cohorts; lesson 04 asserts the stall on the course model."""
    from kvlab.runtime import kernels

    out = tmp_path / "out"
    kernels.execute(str(labs.lab_path("L04_chunked_prefill")), str(tmp_path / "run.ipynb"), cwd=str(labs.LAB_DIR),
                    parameters={"decoders": 2, "decoder_output_tokens": 24, "long_prompt_tokens": 1024, "long_arrival_s": 0.3,
                                "budgets": [128], "model": SECOND_MODEL, "output_dir": str(out)})
    df = pd.read_parquet(out / "results.parquet").set_index("config")
    assert list(df.index) == ["chunked off", "chunks of 128"]
    assert df.decoder_itl_p50_ms["chunks of 128"] < df.decoder_itl_p50_ms["chunked off"]  # the median: one stall of a shared machine is not the engine
    assert (out / "tokens.parquet").exists() and (out / "tradeoff.html").exists()
    assert json.loads((out / "metadata.json").read_text())["parameters"]["model"] == SECOND_MODEL


@pytest.mark.notebook
def test_lab_l05_batch_sweep(tmp_path, second_model):
    """Lab L05's one CI run, on the second model: the summary table and the engine's KV capacity in the metadata;
    lesson 05 asserts batching's shape on the course model."""
    from kvlab.runtime import kernels

    out = tmp_path / "out"
    kernels.execute(str(labs.lab_path("L05_batch_sweep")), str(tmp_path / "run.ipynb"), cwd=str(labs.LAB_DIR),
                    parameters={"batch_sizes": [1, 8], "output_tokens": 16, "model": SECOND_MODEL, "output_dir": str(out)})
    s = pd.read_csv(out / "summary.csv").set_index("batch_size")
    assert s.decode_tok_s[8] > s.decode_tok_s[1]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["engine"]["kv_capacity"]["tokens"] > 0 and meta["parameters"]["model"] == SECOND_MODEL


@pytest.mark.parametrize("lab", labs.all_labs(), ids=lambda lab: lab.name)
def test_comparison_plot_draws_two_runs_of_the_reference_results(lab):
    results = pd.read_parquet(REFERENCE / lab.name / "results.parquet")
    fig = lab.compare(pd.concat([results.assign(run="a"), results.assign(run="b")], ignore_index=True))
    assert len(fig.data) >= 2 and fig.layout.title.text, lab.name
