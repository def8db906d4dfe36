"""The real vLLM engine on the real default model: answers, KV capacity, timestamps, clear errors."""

import json
import math
import re

import pytest

import kvlab
from kvlab import timing

pytestmark = pytest.mark.engine


def test_greedy_chat_answer_is_paris(engine):
    out = kvlab.chat(engine, "What is the capital of France?")
    assert "Paris" in out.outputs[0].text


def test_kv_capacity_matches_hand_formula_to_one_block(engine, model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    layers, kv_heads = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    dtype = kvlab.runtime.hardware.model_dtype()[0]  # the machine's choice; the KV cache follows the model dtype
    per_token = 2 * layers * kv_heads * head_dim * kvlab.sizing.dtype_bytes(dtype)  # K and V
    assert per_token == {"float32": 46_080, "bfloat16": 23_040}[dtype]  # 2 · 30 · 3 · 64 · bytes, the default model's
    cap = kvlab.kv_capacity(engine)
    budget = kvlab.runtime.config.kv_cache_gib() * 2**30
    hand_tokens = math.floor(budget / per_token)
    assert cap.bytes_per_token == per_token
    assert cap.bytes_per_block == cap.block_size * per_token  # one KV cache group: a block holds every layer's page
    assert abs(cap.tokens - hand_tokens) <= cap.block_size
    assert cap.tokens == cap.num_blocks * cap.block_size
    assert cap.bytes <= budget and cap.kv_dtype == dtype


def test_engine_timestamps_are_ordered_and_consistent(engine):
    df, _ = kvlab.timing.repeat_chat(engine, "Name three colours.", repeats=2, max_tokens=8)
    assert (df.output_tokens == 8).all() and (df.prompt_tokens > 0).all()
    assert (df.queue_s >= 0).all() and (df.prefill_s > 0).all() and (df.decode_s > 0).all()
    assert (df.ttft_s >= df.prefill_s * 0.99).all()
    summary = timing.summarize(df)
    assert summary.ttft_s_p95.iloc[0] >= summary.ttft_s_p50.iloc[0]


def test_kv_budget_too_small_names_largest_context_and_fixes():
    with pytest.raises(kvlab.KVLabError) as err:
        kvlab.make_engine(kv_cache_gib=0.05, enforce_eager=True)
    msg = str(err.value)
    fits = re.search(r"largest context that fits is ([\d,]+) tokens", msg)
    per_token = 2 * 30 * 3 * 64 * kvlab.sizing.dtype_bytes(kvlab.runtime.hardware.model_dtype()[0])  # the course model's K and V
    assert fits and 128 <= int(fits.group(1).replace(",", "")) <= 0.05 * 2**30 / per_token, msg  # 1,024 fp32; 2,176 bf16
    assert "kv_cache_gib" in msg and "max_model_len" in msg
    assert "\n" not in msg


def test_a_context_beyond_the_model_s_own_is_one_sentence_with_the_limit():
    """The base model (OPT layout) has 2,048 positions; vLLM refuses more (vllm/config/model.py) and fit_context fits."""
    base = kvlab.runtime.model.BASE_MODEL
    with pytest.raises(kvlab.KVLabError) as err:
        kvlab.make_engine(base, max_model_len=4096, enforce_eager=True)
    msg = str(err.value)
    assert "max_model_len=4,096 is longer than this model's context of 2,048 tokens" in msg and "\n" not in msg
    assert kvlab.runtime.model.fit_context(4096, base) == 2048 and kvlab.runtime.model.fit_context(1024, base) == 1024


def test_a_base_model_without_a_chat_template_gets_the_plain_template_on_the_server_too():
    """No chat template: vLLM alone refuses (vllm/renderers/hf.py); the server gets KV Lab's plain one, as kvlab.chat
    uses in-process (an engine on the base model runs lesson 00 in tests/test_course.py and checks the prompt)."""
    cmd = kvlab.runtime.serving.Server(kvlab.runtime.model.BASE_MODEL).command()
    template = cmd[cmd.index("--chat-template") + 1]
    assert open(template).read() == kvlab.runtime.templates.PLAIN_CHAT_TEMPLATE
    assert "--chat-template" not in kvlab.runtime.serving.Server().command()  # the course model keeps its own


def test_unknown_hub_model_is_one_sentence(monkeypatch):
    import gc

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(kvlab.KVLabError, match=r"Could not find model 'kvlab-test/no-such-model'.*KVLAB_MODEL"):
        kvlab.make_engine("kvlab-test/no-such-model", enforce_eager=True)
    assert gc.get_freeze_count() == 0  # make_engine freezes the heap to start faster; a failed start unfreezes it


def test_stream_timing_matches_engine_and_gives_every_gap(engine):
    from kvlab import prompts

    ids = prompts.prompt_of_length(engine.get_tokenizer(), 200)
    row = timing.stream_timing(engine, ids, 6)
    assert row["prompt_tokens"] == 200 and row["output_tokens"] == 6 and len(row["itl_s"]) == 5
    assert all(g > 0 for g in row["itl_s"])
    assert abs(row["client_ttft_s"] - row["engine_ttft_s"]) < 0.1
    assert row["client_tpot_s"] == pytest.approx(row["engine_tpot_s"], rel=0.25)


def test_sweep_rows_are_cold_and_tidy(engine):
    df = kvlab.prefill_decode.sweep(engine, [64, 256], [4], repeats=2, warmup=1, desc="test", dtype="float32")
    assert len(df) == 4 and set(df.prompt_tokens) == {64, 256} and (df.output_tokens == 4).all()
    assert (df.cached_tokens == 0).all() and (df.dtype == "float32").all()
    assert set(df.repeat) == {0, 1}
    more = kvlab.prefill_decode.sweep(engine, [64, 256], [2, 4], repeats=2, warmup=0, desc="test", reuse=df)
    assert more[more.output_tokens == 4].equals(df)  # the points already timed are taken, not timed again
    assert len(more[more.output_tokens == 2]) == 4 and (more[more.output_tokens == 2].cached_tokens == 0).all()


def test_sweep_with_min_repeats_stops_between_the_floor_and_the_ceiling(engine):
    df = kvlab.prefill_decode.sweep(engine, [64], [4], repeats=5, min_repeats=2, desc="test")
    assert 2 <= len(df[~df.remeasured]) <= 5 and list(df[~df.remeasured].repeat) == list(range(len(df[~df.remeasured])))


def test_too_long_prompt_is_refused_before_running(engine):
    with pytest.raises(kvlab.KVLabError, match="exceeds the engine's context"):
        kvlab.prefill_decode.sweep(engine, [8190], [10], repeats=1)


_CAPACITY_CHECKS = """
import json, kvlab
from kvlab import sizing, timing, variants
hybrid = ["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(30)]
layouts = {"all sliding": variants.prepare_sliding_variant(256),
           "5:1 hybrid": variants.prepare_variant("hybrid5to1", None, sliding_window=256, layer_types=hybrid)}
import tempfile, torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(kvlab.resolve_model())
gemma = AutoConfig.for_model("gemma3_text", vocab_size=len(tok), hidden_size=256, intermediate_size=768, num_hidden_layers=12,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=256,
                             max_position_embeddings=4096, architectures=["Gemma3ForCausalLM"])
layouts["Gemma-3 (real architecture)"] = tempfile.mkdtemp()
AutoModelForCausalLM.from_config(gemma).to(torch.bfloat16).save_pretrained(layouts["Gemma-3 (real architecture)"])
tok.save_pretrained(layouts["Gemma-3 (real architecture)"])
rows = {name: sizing.kv_capacity_check(str(path), kv_cache_gib=1.0, dtype="bfloat16", max_num_batched_tokens=512)[0]
        for name, path in layouts.items()}
import shutil
shutil.rmtree(layouts["Gemma-3 (real architecture)"])
print(json.dumps(rows))
"""


def test_vllm_kv_plan_matches_the_engine_for_sliding_and_hybrid_layouts(model_dir):
    """vLLM 0.32's own KV arithmetic (sizing.vllm_kv_plan) against its report: every layer sliding over 256 tokens,
    and Gemma-3's pattern — five sliding layers to one full — on the course model's shapes and in Gemma-3's own
    architecture (random weights). The
    engines run in a separate process: closing an in-process engine tears down vLLM's process-wide parallel state,
    which the session's shared engine still needs."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _CAPACITY_CHECKS], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(res.stdout.strip().splitlines()[-1])
    for name, row in rows.items():
        assert row["engine_blocks"] == row["hand_blocks"], name
        assert row["engine_max_concurrency"] == pytest.approx(row["hand_max_concurrency"]), name
        assert row["ideal_max_concurrency"] > row["engine_max_concurrency"], name  # vLLM reserves more than the window
    # by hand, all sliding: 1 GiB ÷ (128 tokens × 30 layers × 2·3·64·2 B) = 364 blocks; per request
    # cdiv(min(255 + 512, 2048), 128) + 1 = 7 blocks → 52 sequences of 2,048 tokens
    assert rows["all sliding"]["engine_blocks"] == 364 and rows["all sliding"]["engine_max_concurrency"] == pytest.approx(52)
    # 5:1 hybrid: groups of 5 layers (1 full, 5 sliding); a block holds 5 layers → 2,184 blocks; per request
    # 16 (full group, 2,048 tokens) + 5 × 7 (sliding groups) = 51 blocks
    assert rows["5:1 hybrid"]["engine_blocks"] == 2**30 // (128 * 5 * 2 * 3 * 64 * 2) == 2184
    assert rows["5:1 hybrid"]["engine_max_concurrency"] == pytest.approx(2184 / 51)
    # Gemma-3's own architecture (transformers' pattern: every sixth of 12 layers full): groups of 2 layers (1 full,
    # 5 sliding) → 1 GiB ÷ (128 × 2 × 2·2·64·2 B) = 8,192 blocks; per request 16 + 5 × 7 = 51 blocks
    gemma = rows["Gemma-3 (real architecture)"]
    assert gemma["sliding_layers"] == 10 and gemma["engine_blocks"] == 2**30 // (128 * 2 * 2 * 2 * 64 * 2) == 8192
    assert gemma["engine_max_concurrency"] == pytest.approx(8192 / 51)


@pytest.mark.parametrize("env, threads", [
    ({}, None), ({"VLLM_CPU_OMP_THREADS_BIND": "auto"}, None), ({"OMP_NUM_THREADS": "1"}, "1"),
    ({"VLLM_CPU_OMP_THREADS_BIND": "0"}, "1"), ({"VLLM_CPU_OMP_THREADS_BIND": "0-3,6"}, "5"),
    ({"VLLM_CPU_OMP_THREADS_BIND": "0-1|2-3"}, None),
])
def test_numba_gets_the_engines_thread_count(env, threads):
    """An in-process n-gram engine sets numba's thread count back to numba's own after each draft; numba shares the
    OpenMP runtime, so a numba count above the engine's raised torch's threads (1 → 2) for every engine in the process."""
    from kvlab.runtime import engine

    assert engine.numba_threads_for(env) == threads
