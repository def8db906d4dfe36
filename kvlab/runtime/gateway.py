"""The gateway in front of the engine: the OpenAI chat API, a Redis response cache, an interactive input cap, and its
own Prometheus metrics.

Client → gateway → vLLM server. For ``POST /v1/chat/completions`` the gateway

1. counts the prompt's tokens with the model's own tokenizer and chat template; over the interactive cap it answers
   ``400`` with an error naming the cap (``over_cap="reject"``), or sends the request down the **batch lane**
   (``over_cap="batch"``): at most ``batch_concurrency`` over-cap requests reach the engine at once, the others wait
   in the gateway, so long jobs cannot crowd out chat;
2. answers an exact repeat from **Redis** — only for greedy requests (``temperature`` 0, one choice): with
   sampling, a repeat *should* get a different answer, so caching it would change the product. Greedy is not
   bit-for-bit reproducible either — vLLM promises the same output across batch compositions only with batch
   invariance, which is GPU-only (vLLM docs, "Reproducibility"), and lesson 09 shows greedy answers changing with
   the order of computation — but a greedy repeat asks for the same answer, so serving the stored one is fair. The key is a hash of
   the model, the messages (role and content, in order) and every sampling setting; entries expire after ``ttl_s``.
   A response-cache hit skips the model entirely; the engine's prefix cache only skips part of prefill — two hit
   rates, two metrics;
3. otherwise forwards the request to the engine, streaming its answer back chunk by chunk, and stores the answer.

Redis failing (not running, stopped mid-run, slow) never fails a request: the gateway serves from the engine and
counts the error. ``/metrics`` exports ``kvlab_gateway_*`` counters and histograms; ``/health`` answers 200.
Run: ``python -m kvlab.runtime.gateway --upstream http://127.0.0.1:8000 --tokenizer MODEL_DIR [--redis-url …]``; from Python,
``Gateway`` starts and stops it like the vLLM server (127.0.0.1, a free port).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import sys
import time
import uuid
from typing import Any

from fastapi import Request  # at module level: the endpoints' string annotations resolve against these globals

from kvlab.runtime.errors import KVLabError
from kvlab.runtime.services import HttpService
from kvlab.runtime.templates import chat_template_ids

#: Body fields that do not change the answer (so they are not part of the cache key).
NOT_IN_KEY = {"messages", "stream", "stream_options", "user", "model"}
OVER_CAP = ("reject", "batch")
#: Over-cap requests at the engine at once, by default: one batch job at a time.
BATCH_CONCURRENCY = 1
CACHE_HEADER = "x-kvlab-cache"
#: Milliseconds the gateway spent on the request before the engine was asked (or, for a hit, before the answer): the
#: gateway's own share of client TTFT, per request.
TIME_HEADER = "x-kvlab-gateway-ms"


def cacheable(body: dict[str, Any]) -> bool:
    """Only greedy requests are cached: temperature 0 and one choice. A request that omits the temperature gets the
    model's ``generation_config`` default where it has one, else 1 (vLLM's server), so only an explicit 0 counts."""
    return float(body.get("temperature", 1.0)) == 0.0 and int(body.get("n", 1) or 1) == 1


def cache_key(model: str, body: dict[str, Any]) -> str:
    """A hash of the model, the messages (role and content, in order) and every sampling setting: equal only for an
    exact repeat (a paraphrase or a changed version string is another key)."""
    messages = [{"role": m.get("role"), "content": m.get("content")} for m in body.get("messages", [])]
    settings = {k: v for k, v in body.items() if k not in NOT_IN_KEY}
    blob = json.dumps({"model": model, "messages": messages, "settings": settings}, sort_keys=True, ensure_ascii=False)
    return "kvlab:chat:" + hashlib.sha256(blob.encode()).hexdigest()


def route(tokens: int, input_cap: int, over_cap: str = "reject") -> str:
    """Where the gateway sends a prompt of ``tokens`` tokens: "engine" (at or under the interactive cap, or no cap: 0),
    else "rejected" or "batch_lane" as ``over_cap`` says. Lesson 07 routes its in-process traffic with this rule."""
    if tokens <= input_cap or not input_cap:
        return "engine"
    return "batch_lane" if over_cap == "batch" else "rejected"


def over_cap_error(tokens: int, cap: int) -> dict[str, Any]:
    """The OpenAI-style error body for a prompt over the interactive input cap."""
    return {"error": {"message": f"The prompt has {tokens:,} tokens, over the interactive input cap of {cap:,}; shorten "
                                 "it, or send it to the batch lane (a gateway started with over_cap='batch').",
                      "type": "invalid_request_error", "code": "input_cap_exceeded", "param": "messages"}}


def _chunk(rid: str, model: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n".encode()


def cached_stream(entry: dict[str, Any], model: str, include_usage: bool) -> list[bytes]:
    """A cached answer as the server's stream would carry it (role, content, finish, usage, ``[DONE]``)."""
    rid = "chatcmpl-cache-" + uuid.uuid4().hex[:12]
    out = [_chunk(rid, model, {"role": "assistant", "content": ""}), _chunk(rid, model, {"content": entry["text"]}),
           _chunk(rid, model, {}, entry.get("finish_reason") or "stop")]
    if include_usage and entry.get("usage"):
        usage = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
                 "choices": [], "usage": entry["usage"]}
        out.append(f"data: {json.dumps(usage)}\n\n".encode())
    return [*out, b"data: [DONE]\n\n"]


def create_app(upstream: str, tokenizer: str, redis_url: str | None = None, input_cap: int = 0, ttl_s: float = 600.0,
               over_cap: str = "reject", batch_concurrency: int = BATCH_CONCURRENCY) -> Any:
    """The gateway's ASGI app (FastAPI). ``input_cap`` 0: no cap; ``redis_url`` None: no response cache."""
    import httpx
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest


    if over_cap not in OVER_CAP:
        raise KVLabError(f"over_cap must be one of {', '.join(OVER_CAP)}, got {over_cap!r}.")
    tok = None
    if input_cap:  # only a cap needs to count tokens; loading transformers and the tokenizer is most of a start (~4 s)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
    registry = CollectorRegistry()
    requests = Counter("kvlab_gateway_requests", "Chat requests by what answered them", ["route"], registry=registry)
    cache = Counter("kvlab_gateway_response_cache", "Response-cache lookups by result", ["result"], registry=registry)
    errors = Counter("kvlab_gateway_cache_errors", "Redis errors (the request was served from the engine)",
                     registry=registry)
    added = Histogram("kvlab_gateway_added_seconds", "Gateway time before the engine is asked (tokenize, cap, cache lookup)",
                      buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0), registry=registry)
    hit_time = Histogram("kvlab_gateway_cache_hit_seconds", "Receipt to the whole answer, for response-cache hits",
                         buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 1.0), registry=registry)
    queued = Histogram("kvlab_gateway_batch_queue_seconds", "Time an over-cap request waited for the batch lane",
                       buckets=(0.001, 0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60), registry=registry)
    store: Any = None
    if redis_url:
        import redis.asyncio as aioredis

        store = aioredis.from_url(redis_url, socket_timeout=0.25, socket_connect_timeout=0.25, decode_responses=True)
    lane = asyncio.Semaphore(batch_concurrency)
    client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(600.0, connect=5.0))
    app = FastAPI(title="KV Lab gateway")

    async def cache_get(key: str) -> dict[str, Any] | None:
        try:
            raw = await store.get(key)
        except Exception:  # noqa: BLE001 - any Redis failure: serve from the engine, count it
            errors.inc()
            return None
        cache.labels("hit" if raw else "miss").inc()
        return json.loads(raw) if raw else None

    async def cache_put(key: str, entry: dict[str, Any]) -> None:
        try:
            await store.set(key, json.dumps(entry), ex=max(1, int(ttl_s)))
        except Exception:  # noqa: BLE001 - a failed store loses a future hit, never this answer
            errors.inc()

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        received = time.perf_counter()
        body = await request.json()
        model = str(body.get("model", ""))
        # counted only under a cap: tokenizing a long prompt costs milliseconds the gateway otherwise does not add
        tokens = len(chat_template_ids(tok, body.get("messages", []))) if input_cap else 0
        where = route(tokens, input_cap, over_cap)
        batch = where == "batch_lane"
        if where == "rejected":
            requests.labels("rejected").inc()
            return JSONResponse(over_cap_error(tokens, input_cap), status_code=400)
        key = cache_key(model, body) if store is not None and cacheable(body) else None
        if key is not None:
            entry = await cache_get(key)
            if entry is not None:
                requests.labels("response_cache").inc()
                spent = time.perf_counter() - received
                hit_time.observe(spent)
                headers = {CACHE_HEADER: "hit", TIME_HEADER: f"{spent * 1e3:.3f}"}
                if body.get("stream"):
                    include = bool((body.get("stream_options") or {}).get("include_usage"))
                    return StreamingResponse(iter(cached_stream(entry, model, include)), media_type="text/event-stream",
                                             headers=headers)
                return JSONResponse(entry["response"] | {"id": "chatcmpl-cache-" + uuid.uuid4().hex[:12]}, headers=headers)
        requests.labels("batch_lane" if batch else "engine").inc()
        waited = time.perf_counter()
        if batch:
            await lane.acquire()
            queued.observe(time.perf_counter() - waited)
        added.observe(waited - received)
        headers = {CACHE_HEADER: "miss" if key else "skip", TIME_HEADER: f"{(waited - received) * 1e3:.3f}"}
        if not body.get("stream"):
            try:
                upstream_reply = await client.post("/v1/chat/completions", json=body)
            finally:
                if batch:
                    lane.release()
            reply = upstream_reply.json()
            if key is not None and upstream_reply.status_code == 200:
                choice = reply["choices"][0]
                await cache_put(key, {"text": choice["message"]["content"], "finish_reason": choice.get("finish_reason"),
                                      "usage": reply.get("usage"), "response": reply})
            return JSONResponse(reply, status_code=upstream_reply.status_code, headers=headers)

        async def relay() -> Any:
            text, finish, usage, buffer, ok, stored = [], None, None, b"", False, False

            async def store_once() -> None:
                """Put a complete answer (status 200, a finish reason) to a cacheable request in Redis, once."""
                nonlocal stored
                if key is None or not ok or not finish or stored:
                    return
                stored = True
                answer = "".join(text)
                await cache_put(key, {"text": answer, "finish_reason": finish, "usage": usage,
                                      "response": {"object": "chat.completion", "model": model, "usage": usage,
                                                   "choices": [{"index": 0, "finish_reason": finish,
                                                                "message": {"role": "assistant", "content": answer}}]}})

            try:
                async with client.stream("POST", "/v1/chat/completions", json=body) as upstream_reply:
                    ok = upstream_reply.status_code == 200
                    async for part in upstream_reply.aiter_raw():
                        buffer += part
                        done = False
                        while b"\n\n" in buffer:
                            event, buffer = buffer.split(b"\n\n", 1)
                            data = event.decode(errors="replace").removeprefix("data: ").strip()
                            done = done or data == "[DONE]"
                            if not data or data == "[DONE]":
                                continue
                            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):  # relayed, not parsed
                                msg = json.loads(data)
                                usage = msg.get("usage") or usage
                                for c in msg.get("choices", []):
                                    text.append((c.get("delta") or {}).get("content") or "")
                                    finish = c.get("finish_reason") or finish
                        if done:
                            # stored before the client sees the end: a repeat sent right after this answer is a hit
                            # (stored after it, a repeat raced the store and missed when the machine was busy)
                            await store_once()
                        yield part
            finally:
                if batch:
                    lane.release()
            await store_once()  # a stream that ended without [DONE]

        return StreamingResponse(relay(), media_type="text/event-stream", headers=headers)

    return app


class Gateway(HttpService):
    """The gateway as a local service in front of a vLLM server (``upstream``: its root URL)."""

    name = "gateway"

    def __init__(self, upstream: str, tokenizer: str, redis_url: str | None = None, input_cap: int = 0,
                 ttl_s: float = 600.0, over_cap: str = "reject", batch_concurrency: int = BATCH_CONCURRENCY, port: int | None = None,
                 host: str = "127.0.0.1", timeout_s: float = 60.0) -> None:
        if over_cap not in OVER_CAP:
            raise KVLabError(f"over_cap must be one of {', '.join(OVER_CAP)}, got {over_cap!r}.")
        if input_cap < 0 or ttl_s <= 0 or batch_concurrency < 1:
            raise KVLabError(f"The gateway needs input_cap ≥ 0 (0: none), ttl_s > 0 and batch_concurrency ≥ 1; got "
                             f"{input_cap}, {ttl_s}, {batch_concurrency}.")
        super().__init__(port, host, timeout_s)
        self.options = {"upstream": upstream, "tokenizer": tokenizer, "redis_url": redis_url, "input_cap": input_cap,
                        "ttl_s": ttl_s, "over_cap": over_cap, "batch_concurrency": batch_concurrency}

    @property
    def settings(self) -> dict[str, Any]:
        return {"gateway": self.url, **{k: v for k, v in self.options.items() if k != "tokenizer"}}

    def command(self) -> list[str]:
        o = self.options
        cmd = [sys.executable, "-m", "kvlab.runtime.gateway", "--upstream", o["upstream"], "--tokenizer", o["tokenizer"],
               "--input-cap", str(o["input_cap"]), "--ttl", str(o["ttl_s"]), "--over-cap", o["over_cap"],
               "--batch-concurrency", str(o["batch_concurrency"]), "--host", self.host, "--port", str(self.port)]
        return cmd + (["--redis-url", o["redis_url"]] if o["redis_url"] else [])

    def __repr__(self) -> str:
        return f"Gateway({self.base_url} → {self.options['upstream']}, {'running' if self.proc else 'stopped'})"


def main(argv: list[str] | None = None) -> None:
    """Serve the gateway with uvicorn (127.0.0.1 unless told otherwise)."""
    import uvicorn

    ap = argparse.ArgumentParser(prog="python -m kvlab.runtime.gateway", description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True, help="the vLLM server's root URL")
    ap.add_argument("--tokenizer", required=True, help="model folder or id whose tokenizer counts prompt tokens")
    ap.add_argument("--redis-url", default=None, help="redis://host:port/db for the response cache (none: no cache)")
    ap.add_argument("--input-cap", type=int, default=0, help="interactive input cap in prompt tokens (0: none)")
    ap.add_argument("--ttl", type=float, default=600.0, help="response-cache entry lifetime, seconds")
    ap.add_argument("--over-cap", choices=OVER_CAP, default="reject", help="what an over-cap request gets")
    ap.add_argument("--batch-concurrency", type=int, default=BATCH_CONCURRENCY, help="over-cap requests at the engine at once")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100)
    a = ap.parse_args(argv)
    app = create_app(a.upstream, a.tokenizer, a.redis_url, a.input_cap, a.ttl, a.over_cap, a.batch_concurrency)
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
