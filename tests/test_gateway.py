"""The gateway: cache keys and rules (pure logic), the real Redis server, and the gateway in front of the real vLLM
server — a repeat served from Redis without touching the engine, a Redis outage that fails no request, an over-cap
prompt refused with the documented error."""

from __future__ import annotations

import shutil
import socket

import pytest

from kvlab.runtime import gateway, services
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.redis_server import RedisServer

needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None,
                                 reason="redis-server is not installed (scripts/setup-redis.sh installs it as root)")


def test_only_greedy_single_answers_are_cached():
    assert gateway.cacheable({"temperature": 0})
    assert not gateway.cacheable({})  # the API's default temperature is 1: sampled, not cached
    assert not gateway.cacheable({"temperature": 0.7}) and not gateway.cacheable({"temperature": 0, "n": 2})


def test_the_key_changes_with_model_messages_and_settings_but_not_with_streaming_or_field_order():
    body = {"messages": [{"role": "user", "content": "What is a KV cache?"}], "temperature": 0, "max_tokens": 16}
    key = gateway.cache_key("m", body)
    assert key == gateway.cache_key("m", {"max_tokens": 16, "temperature": 0, "stream": True, "messages": body["messages"]})
    assert key != gateway.cache_key("other-model", body)
    assert key != gateway.cache_key("m", body | {"max_tokens": 17})
    paraphrase = body | {"messages": [{"role": "user", "content": "What's a KV cache?"}]}
    assert key != gateway.cache_key("m", paraphrase)  # exact match only: a paraphrase is another key


def test_over_cap_error_names_the_cap_and_the_way_out():
    err = gateway.over_cap_error(5000, 2048)["error"]
    assert err["code"] == "input_cap_exceeded" and "5,000 tokens" in err["message"] and "cap of 2,048" in err["message"]


def test_the_cap_rule_routes_at_the_boundary_and_lesson_07_uses_it():
    assert gateway.route(512, 512) == "engine" and gateway.route(10**6, 0) == "engine"
    assert gateway.route(513, 512) == "rejected" and gateway.route(513, 512, "batch") == "batch_lane"
    from kvlab import loadtest
    from kvlab.workload import Arrival
    lanes = [a.lane for a in loadtest.route_by_input_cap([Arrival("chat", list(range(n)), 4) for n in (512, 513)], 512)]
    assert lanes == ["", "batch"] and loadtest.BATCH_LANE == {"batch": gateway.BATCH_CONCURRENCY}


def test_a_cached_answer_streams_like_the_server():
    parts = gateway.cached_stream({"text": "Hello", "finish_reason": "stop", "usage": {"completion_tokens": 1}}, "m", True)
    assert parts[-1] == b"data: [DONE]\n\n" and b'"content": "Hello"' in parts[1] and b'"usage"' in parts[-2]


def test_bad_gateway_settings_are_one_sentence():
    with pytest.raises(KVLabError, match="over_cap must be one of reject, batch"):
        gateway.Gateway("http://127.0.0.1:1", "model", over_cap="drop")
    with pytest.raises(KVLabError, match="input_cap ≥ 0"):
        gateway.Gateway("http://127.0.0.1:1", "model", input_cap=-1)


@needs_redis
def test_redis_runs_on_loopback_without_persistence_and_stops():
    with RedisServer() as r:
        c = r.client()
        assert c.config_get("bind")["bind"] == "127.0.0.1" and c.config_get("save")["save"] == ""
        assert c.config_get("appendonly")["appendonly"] == "no"
        c.set("k", "v", ex=5)
        assert c.get("k") == "v" and 0 < c.ttl("k") <= 5
        pid = r.proc.pid
    import psutil

    assert not psutil.pid_exists(pid) and not services._LIVE


@needs_redis
def test_redis_on_a_busy_port_is_one_sentence():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(KVLabError, match="already in use; pass port=None"):
            RedisServer(port=s.getsockname()[1]).start()


@needs_redis
@pytest.mark.engine
def test_gateway_serves_repeats_from_redis_survives_an_outage_and_refuses_over_cap(model_dir):
    import httpx

    from kvlab import metrics
    from kvlab.runtime import serving

    question = [{"role": "user", "content": "Name three colours."}]
    long_prompt = [{"role": "user", "content": "word " * 300}]
    with serving.Server(enforce_eager=True, max_model_len=1024, distributed_executor_backend="uni") as server, \
            RedisServer() as redis_server, \
            gateway.Gateway(server.url, str(model_dir), redis_server.redis_url, input_cap=128, ttl_s=60) as gw:
        client = gw.client()
        assert not [p for p in server.processes() if "Worker" in p.name()]  # "uni": the engine core runs the model itself

        def ask(stream: bool) -> tuple[str, str]:
            raw = client.chat.completions.with_raw_response.create(model=serving.SERVED_NAME, messages=question,
                                                                   max_tokens=8, temperature=0, stream=stream)
            reply = raw.parse()
            text = "".join(c.choices[0].delta.content or "" for c in reply if c.choices) if stream else \
                reply.choices[0].message.content
            return text, raw.headers.get(gateway.CACHE_HEADER)

        first, how = ask(stream=True)
        assert how == "miss" and first
        before = metrics.scrape(server.url)
        again, how = ask(stream=True)
        plain, how_plain = ask(stream=False)
        after = metrics.scrape(server.url)
        assert how == how_plain == "hit" and again == plain == first
        assert after["vllm:request_success_total"] == before["vllm:request_success_total"]  # the engine never saw them

        over = httpx.post(gw.base_url + "/chat/completions", json={"model": serving.SERVED_NAME, "messages": long_prompt,
                                                                   "max_tokens": 4, "temperature": 0}, timeout=60)
        assert over.status_code == 400 and over.json()["error"]["code"] == "input_cap_exceeded"
        assert "input cap of 128" in over.json()["error"]["message"]

        near_full = [{"role": "user", "content": "word " * 970}]  # ~1,000 prompt tokens of the 1,024: 40 more do not fit
        with pytest.raises(KVLabError, match=r"The server returned [0-9]+ of the 40 output tokens asked for a prompt of "
                                             r"1,0[0-9]{2} tokens: together they outgrow its context"):
            serving.stream_chat(server.client(), near_full, 40)  # vLLM's server would clip max_tokens without a word

        redis_server.stop()  # the cache goes away mid-run: requests are answered by the engine, errors counted
        outage = [client.chat.completions.create(model=serving.SERVED_NAME, max_tokens=4, temperature=0,
                                                 messages=[{"role": "user", "content": f"Count to {n}."}])
                  for n in (2, 3)]
        assert all(r.choices[0].message.content for r in outage)
        g = metrics.scrape_prefix(gw.url, "kvlab_gateway_")
        assert g["kvlab_gateway_cache_errors_total"] >= 2 and g['kvlab_gateway_requests_total{route="rejected"}'] == 1
        assert g['kvlab_gateway_response_cache_total{result="hit"}'] == 2
        procs = [p.pid for p in (*server.processes(), *gw.processes())]
    import psutil

    assert not any(psutil.pid_exists(pid) for pid in procs) and not services._LIVE
