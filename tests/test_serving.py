"""Serving: server flags, /metrics arithmetic, traffic shapes (pure logic); the real server's failure paths; lab L06."""

from __future__ import annotations

import json
import math
import socket

import pandas as pd
import pytest

from kvlab import metrics, traffic
from kvlab.course import labs
from kvlab.runtime import services, serving
from kvlab.runtime.errors import KVLabError


def test_engine_arguments_become_server_flags():
    flags = serving.server_flags({"max_model_len": 2048, "enforce_eager": True, "enable_prefix_caching": False,
                                  "use_tqdm_on_load": False, "disable_log_stats": False, "seed": 0})
    assert flags == ["--max-model-len", "2048", "--enforce-eager", "--no-enable-prefix-caching", "--seed", "0"]


def test_a_speculative_config_becomes_the_json_vllm_serve_takes():
    import json

    from kvlab import speculative

    flags = serving.server_flags(speculative.ngram_config(4))
    assert flags[0] == "--speculative-config" and json.loads(flags[1]) == speculative.ngram_config(4)["speculative_config"]


def test_server_binds_loopback_by_default_and_builds_its_command():
    s = serving.Server(enforce_eager=True)
    cmd = s.command()
    assert s.host == "127.0.0.1" and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[1:3] == ["-m", serving.SERVER_MODULE] and "--trust-remote-code" not in cmd


def test_the_uniprocess_executor_asked_for_is_the_one_the_cpu_server_runs():
    """vLLM's CPU platform turns "uni" into "mp" unless VLLM_ENABLE_V1_MULTIPROCESSING is "0" (vllm/platforms/cpu.py)."""
    uni = serving.Server(enforce_eager=True, distributed_executor_backend="uni")
    assert uni.env()["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert uni.command()[-2:] == ["--distributed-executor-backend", "uni"]
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in serving.Server(enforce_eager=True).env()  # vLLM's default: "mp"


def test_histogram_quantile_interpolates_like_prometheus():
    # 10 observations: 4 in (0, 0.1], 4 in (0.1, 0.5], 2 in (0.5, 1]
    values = {"h_bucket{le=0.1}": 4, "h_bucket{le=0.5}": 8, "h_bucket{le=1.0}": 10, "h_bucket{le=+Inf}": 10,
              "h_sum": 3.0, "h_count": 10}
    assert metrics.quantile(values, "h", 0.5) == pytest.approx(0.1 + 0.4 * (5 - 4) / 4)
    assert metrics.quantile(values, "h", 0.2) == pytest.approx(0.05)
    assert metrics.quantile(values, "h", 0.95) == pytest.approx(0.5 + 0.5 * (9.5 - 8) / 2)
    assert metrics.mean(values, "h") == pytest.approx(0.3)
    assert math.isnan(metrics.quantile({}, "h", 0.5))


def test_delta_subtracts_counters_and_keeps_gauges():
    before = {"vllm:prompt_tokens_total": 100.0, "vllm:kv_cache_usage_perc": 0.5}
    after = {"vllm:prompt_tokens_total": 160.0, "vllm:kv_cache_usage_perc": 0.1}
    assert metrics.delta(before, after) == {"vllm:prompt_tokens_total": 60.0, "vllm:kv_cache_usage_perc": 0.1}


def test_open_loop_start_times_give_agents_one_slot_per_turn():
    sessions = [traffic.Session("chat", []), traffic.Session("agent", [], turns=3), traffic.Session("chat", [])]
    assert traffic.start_times(sessions, rate_per_s=2.0) == [0.0, 0.5, 2.0]


def test_traffic_mix_has_the_asked_share_of_agent_turns():
    from transformers import AutoTokenizer

    import kvlab

    tok = AutoTokenizer.from_pretrained(kvlab.resolve_model())
    mix = traffic.traffic_mix(tok, requests=20, agent_share=0.3, turns=3, growth_tokens=50, tools=0)
    assert sum(s.turns for s in mix) == 20  # 6 agent turns = 2 whole sessions of 3, plus 14 chats
    agents = [s for s in mix if s.kind == "agent"]
    assert len(agents) == 2 and mix[0].kind == "chat" and all(len(a.growth) == 2 for a in agents)
    assert all(s.kind == "chat" for s in traffic.traffic_mix(tok, 10, 0.0, 3, 50, 0))


def test_tokens_per_window_counts_stream_events():
    df = pd.DataFrame({"events_s": [[0.1, 0.2, 1.5], [0.5, 2.2]]})
    w = traffic.tokens_per_window(df, window_s=1.0)
    assert w.tokens_per_s.tolist() == [3.0, 1.0, 1.0]


def test_busy_port_is_refused_in_one_sentence():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(KVLabError, match=rf"Port {port} on 127.0.0.1 is already in use; pass port=None"):
            serving.Server(port=port).start()
    assert not services._LIVE


@pytest.mark.notebook
def test_server_that_exits_at_start_reports_its_log_and_leaves_nothing():
    with pytest.raises(KVLabError, match=r"(?s)exited during start-up.*last log lines.*no-such-dtype") as err:
        serving.Server(dtype="no-such-dtype", enforce_eager=True).start()
    assert "Traceback" not in str(err.value).splitlines()[0]
    assert not serving.running_servers() and not services._LIVE


@pytest.mark.notebook
def test_server_asked_for_more_context_than_the_model_has_says_so_in_one_sentence():
    with pytest.raises(KVLabError) as err:
        serving.Server(max_model_len=1_000_000, enforce_eager=True).start()
    msg = str(err.value)
    assert msg.startswith("The vLLM server did not start: max_model_len=1,000,000 is longer than this model's context "
                          "of 8,192 tokens") and "\n" not in msg
    assert not serving.running_servers() and not services._LIVE


@pytest.mark.notebook
def test_server_not_healthy_in_time_is_stopped():
    with pytest.raises(KVLabError, match=r"not healthy within 3 s, so it was stopped; raise timeout_s="):
        serving.Server(timeout_s=3, enforce_eager=True).start()
    assert not serving.running_servers() and not services._LIVE


@pytest.mark.notebook
def test_lab_l06_traffic_mix(tmp_path, second_model):
    """Through the gateway (Redis response cache, an input cap that sends the agents' later turns down the batch lane),
    on the second model (the lab's one CI run, see tests/test_second_model.py); lesson 06 runs the course model without
    a gateway."""
    from kvlab.runtime import kernels
    from kvlab.runtime.model import SECOND_MODEL

    out = tmp_path / "out"
    kernels.execute(str(labs.lab_path("L06_traffic_mix")), str(tmp_path / "run.ipynb"), cwd=str(labs.LAB_DIR),
                    parameters={"requests": 12, "agent_share": 0.25, "agent_turns": 3, "growth_tokens": 300,
                                "rate_per_s": 1.5, "response_cache": True, "input_cap": 1500, "model": SECOND_MODEL,
                                "executor": "uni", "output_dir": str(out)})
    assert not serving.running_servers()
    df = pd.read_parquet(out / "results.parquet")
    assert set(df.mix) == {"chat only", "chat + agents"} and (df.groupby("mix").size() == 12).all()
    assert (df.output_tokens == 24).all() and {"prompt_tokens", "ttft_s", "tpot_s", "kind", "turn"} <= set(df.columns)
    s = pd.read_csv(out / "summary.csv").set_index("mix")
    chat, mixed = s.loc["chat only"], s.loc["chat + agents"]
    p95_ratio = mixed["TTFT p95 (ms)"] / chat["TTFT p95 (ms)"]
    tps_change = abs(mixed["output tokens/s (mean)"] / chat["output tokens/s (mean)"] - 1)
    assert p95_ratio >= 2 and tps_change < p95_ratio - 1, s
    assert mixed["prompt tokens (mean)"] > 3 * chat["prompt tokens (mean)"]
    dash = pd.read_csv(out / "dashboard.csv").set_index("mix")
    assert (dash.requests == 12).all() and dash.loc["chat + agents", "prompt tokens"] > dash.loc["chat only", "prompt tokens"]
    assert {"response-cache hit rate", "prefix cache hit rate"} <= set(dash.columns)  # both hit rates, per mix
    assert dash.loc["chat only", "sent down the batch lane"] == 0 < dash.loc["chat + agents", "sent down the batch lane"]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["parameters"]["model"] == SECOND_MODEL and meta["engine"]["distributed_executor_backend"] == "uni"


def test_lab_l06_refuses_bad_parameters():
    with pytest.raises(KVLabError, match="Lab L06_traffic_mix: parameter agent_share must be a fraction between 0 and 1, got 1.5"):
        labs.validate("L06_traffic_mix", {"agent_share": 1.5})
    with pytest.raises(KVLabError, match="Lab L06_traffic_mix: parameter agent_tools must be between 0 and 13, got 20"):
        labs.validate("L06_traffic_mix", {"agent_tools": 20})


def test_lengths_fit_a_short_context_and_refuse_one_sentence_where_nothing_fits(model_dir):
    """A 2,048-token model (OPT, Pythia, TinyLlama) runs lessons 03 and 06 with fewer tools and agent turns."""
    from transformers import AutoTokenizer

    from kvlab import caching

    tok = AutoTokenizer.from_pretrained(model_dir)
    longest = max(caching.user_turns(), key=len)
    n = caching.tools_that_fit(tok, 7, 2048)
    assert n < 7 and len(caching.chat_ids(tok, caching.static_prefix(n), longest)) + 64 <= 2048
    assert len(caching.chat_ids(tok, caching.static_prefix(n + 1), longest)) + 64 > 2048  # the largest that fits
    assert caching.tools_that_fit(tok, 7, 8192) == 7
    turns = traffic.agent_turns_that_fit(tok, 6, 400, 1, 2048, 16)
    assert 1 <= turns < 6 and traffic.agent_turns_that_fit(tok, 6, 400, 1, 8192, 16) == 6
    lengths = traffic.agent_request_tokens(tok, 6, 400, 1, 16)  # each turn adds a reply, a tool result and 400 tokens
    assert all(400 < b - a < 520 for a, b in zip(lengths, lengths[1:], strict=False))
    assert lengths[turns - 1] <= 2048 < lengths[turns]  # the turns that fit are those whose request does
    with pytest.raises(KVLabError, match=r"do not fit a context of 100 tokens; choose a model with a longer context"):
        caching.tools_that_fit(tok, 7, 100)


def test_a_server_refusing_a_context_too_long_says_so_in_one_sentence():
    log = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n  Value error, User-specified "
           "max_model_len (4096) is greater than the derived max_model_len (max_position_embeddings=2048.0 or "
           "model_max_length=None in model's config.json). To allow overriding this maximum, set the env var ...")
    said = serving.Server(enforce_eager=True).explain(log)
    assert said == ("max_model_len=4,096 is longer than this model's context of 2,048 tokens (max_position_embeddings in "
                    "its config.json); ask for at most 2,048 (kvlab.model.fit_context does), or choose a model with a "
                    "longer context.")
    assert serving.Server(enforce_eager=True).explain("some other failure") is None
