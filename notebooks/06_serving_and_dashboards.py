# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · The request's whole journey — serving, streaming, and reading a dashboard
#
# So far the engine ran inside this notebook. In production a request travels **Client → HTTP server (gateway) →
# engine**: it is parsed, templated and tokenized, waits for a slot (queue), is prefilled (→ first token, the stream
# starts), then decoded token by token, each token detokenized and sent back over HTTP.
#
# You will start vLLM's real OpenAI-compatible server on this machine, time requests as a client does, put that next
# to the engine's own numbers from its Prometheus `/metrics`, and then build the dashboard that misleads: one where
# tokens per second stays flat while agents' long prompts make users wait seconds for their first token.

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()

# %% [markdown]
# ## 1. Start a local server
#
# `kvlab.serving.start_server()` runs `python -m vllm.entrypoints.openai.api_server` with the course's engine settings,
# bound to **127.0.0.1** on a free port, and waits until `/health` answers. Running this cell again stops the previous
# server first; the server also stops when the kernel exits. Its log goes to a file, not here. One difference from the
# in-process engine of lessons 00–05: on a CPU the server runs the model in a worker process and keeps one core per
# worker for its scheduler (`vllm/utils/ompmultiprocessing.py`, `reserve_cpu_num`), so on a machine with few cores
# its steps are slower than those lessons' (`docs/stalls.md` has the numbers for a 2-core machine).

# %%
from kvlab.runtime import serving

server = serving.start_server()
print(f"{server}\nhealthy after {server.start_s:.0f} s; log: {server.log_file.name}")

# %% [markdown]
# ## 2. One streamed request, as a client sees it
#
# The `openai` client streams the reply: one event per token or so. **TTFT** = send → first content event; **TPOT** =
# the rest of the stream ÷ (output tokens − 1). Token counts come from the server's `usage` report — prompt and output
# kept apart, always.

# %%
import pandas as pd

from kvlab import traffic

client = server.client()
first = serving.stream_chat(client, traffic.chat_sessions(1)[0].messages, max_tokens=32)
pd.DataFrame([first]).drop(columns=["events_s", "text"]).round(3)

# %% [markdown]
# ## 3. Client-side vs engine-side TTFT
#
# The engine reports each request's TTFT, queue and prefill time in its histograms. Sending requests **one at a time**
# and reading `/metrics` around each one gives *that request's* engine numbers exactly (the histogram sums grow by one
# observation). The client's TTFT also includes what happens outside the engine: HTTP, the chat template and
# tokenization, detokenization and streaming the first event back.

# %%
from transformers import AutoTokenizer

tok = AutoTokenizer.from_pretrained(kvlab.resolve_model())
probe = traffic.chat_sessions(kvlab.pick(6, 3)) + [traffic.agent_session(tok, 1, 0, tools=1, seed=99)]
side_by_side = traffic.client_vs_engine(server, probe, max_tokens=16)
side_by_side[["kind", "prompt_tokens", "engine_queue_s", "engine_prefill_s", "engine_ttft_s", "client_ttft_s", "gap_ms"]].round(4)

# %%
import plotly.graph_objects as go

sbs = side_by_side.assign(label=side_by_side.kind + " · " + side_by_side.prompt_tokens.astype(str) + " tok")
fig = go.Figure()
fig.add_bar(x=sbs.label, y=sbs.engine_queue_s * 1e3, name="engine: queue")
fig.add_bar(x=sbs.label, y=(sbs.engine_ttft_s - sbs.engine_queue_s) * 1e3, name="engine: prefill → first token")
fig.add_bar(x=sbs.label, y=sbs.gap_ms, name="outside the engine (HTTP, template, detokenize, stream)")
fig.update_layout(barmode="stack", title="Client TTFT = engine TTFT + what happens outside the engine",
                  xaxis_title="request (kind · prompt tokens)", yaxis_title="milliseconds")
fig.show()
assert (side_by_side.client_ttft_s >= side_by_side.engine_ttft_s).all(), side_by_side
print(f"outside-the-engine share of client TTFT: median {side_by_side.gap_ms.median():.1f} ms, max {side_by_side.gap_ms.max():.1f} ms")

# %% [markdown]
# ## 4. What the server's `/metrics` says
#
# An operations dashboard (Grafana on Prometheus) plots these series. Counters and histograms only grow, so a run's
# numbers are *after − before*. Here are the raw prefix-cache and KV series, then the dashboard numbers for the
# requests of section 3 — and a cross-check: the histogram's p50 against the median the client measured. A dashboard's
# percentile is *estimated* from bucket counts (interpolated inside the bucket, as Prometheus does), so it is only as
# sharp as the bucket edges: a queue time of ~0 ms that lands in the first bucket (0–0.3 s) reads as 150 ms. The
# mean (`_sum ÷ _count`) is exact.

# %%
from kvlab import metrics

now = metrics.scrape(server.url)
metrics.as_table(now, "cache")

# %%
before = metrics.scrape(server.url)
rerun = traffic.client_vs_engine(server, probe, max_tokens=16)
after = metrics.scrape(server.url)
board = metrics.dashboard(before, after, seconds=rerun.client_e2e_s.sum())
pd.Series(board).round(3).to_frame("this window")

# %%
ttft_buckets = metrics.buckets(metrics.delta(before, after), metrics.HISTOGRAMS["TTFT"])
ttft_buckets["in bucket"] = ttft_buckets["count"].diff().fillna(ttft_buckets["count"])
shown = ttft_buckets[ttft_buckets["le"] <= 20]
fig = go.Figure(go.Bar(x=[f"≤ {le:g}" for le in shown["le"]], y=shown["in bucket"]))
fig.update_layout(title="The engine's TTFT histogram for these requests (what a dashboard's heatmap is built from)",
                  xaxis_title="TTFT bucket upper edge (seconds)", yaxis_title="requests")
fig.show()
print(f"TTFT p50: histogram estimate {board['TTFT p50 (ms)']:.0f} ms (only as sharp as the bucket edges) vs engine's own "
      f"per-request median {rerun.engine_ttft_s.median() * 1e3:.0f} ms vs client median {rerun.client_ttft_s.median() * 1e3:.0f} ms; "
      f"prefix cache hit rate {board['prefix cache hit rate']:.0%} (the same prompts, sent a second time)")

# %% [markdown]
# ## 5. A gateway in front: two hit rates, and the gateway's share of TTFT
#
# Production traffic rarely reaches the engine directly: a **gateway** sits in front (`kvlab/runtime/gateway.py`, the same
# OpenAI API). Ours answers exact repeats of deterministic requests from **Redis** (a real `redis-server` on 127.0.0.1)
# and forwards the rest. Its own `/metrics` sit next to the engine's, and the dashboard needs both: a **response-cache
# hit** skips the model, a **prefix-cache hit** skips part of prefill — confusing the two is a classic misreading. The
# traffic: FAQ-style chats, each question asked several times in random order. They share only a short system prompt:
# where that is less than one KV block, the prefix cache has nothing to reuse while the response cache answers every
# repeat — the two rates move independently. (No input cap here: the gateway does not need to tokenize.)

# %%
from kvlab.runtime import gateway
from kvlab.runtime.redis_server import RedisServer

cache_server = RedisServer().start()
gw = gateway.Gateway(server.url, server.model, cache_server.redis_url, ttl_s=600).start()
engine_before = metrics.scrape(server.url)
faq = traffic.faq_traffic(gw.client(), traffic.chat_sessions(kvlab.pick(6, 4), offset=20), repeats=kvlab.pick(4, 3))
rates = metrics.hit_rates(engine_before, metrics.scrape(server.url), metrics.scrape_prefix(gw.url, "kvlab_gateway_"))
faq["gateway share of TTFT"] = faq.gateway_ms / (faq.ttft_s * 1e3)
panel = faq.groupby("answered_by").agg(requests=("ttft_s", "size"), ttft_p50_ms=("ttft_s", lambda s: s.median() * 1e3),
                                       ttft_p95_ms=("ttft_s", lambda s: s.quantile(0.95) * 1e3),
                                       gateway_p50_ms=("gateway_ms", "median"), gateway_p95_ms=("gateway_ms", lambda s: s.quantile(0.95)),
                                       gateway_share_p50=("gateway share of TTFT", "median"))
pd.Series(rates).round(3).to_frame("this run")

# %%
from plotly.subplots import make_subplots

fig = make_subplots(rows=1, cols=2, subplot_titles=("Two caches, two hit rates", "Client TTFT by who answered"))
fig.add_bar(x=list(rates), y=list(rates.values()), showlegend=False, row=1, col=1)
fig.add_bar(x=panel.index, y=panel.ttft_p50_ms, name="client TTFT p50", row=1, col=2)
fig.add_bar(x=panel.index, y=panel.gateway_p50_ms, name="gateway's own time p50", row=1, col=2)
fig.update_yaxes(title_text="hit rate (0-1)", row=1, col=1)
fig.update_yaxes(title_text="ms (log)", type="log", row=1, col=2)
fig.update_layout(title="The gateway's panel, next to the engine's", barmode="group")
fig.show()
panel.round(3)

# %%
engine_side = panel.loc["engine"]
print(f"response cache: {rates['response-cache hit rate (requests, gateway)']:.0%} of requests answered from Redis; engine prefix "
      f"cache: {rates['prefix-cache hit rate (tokens, engine)']:.0%} of prompt tokens; the gateway added {engine_side.gateway_p50_ms:.2f} ms "
      f"(p95 {engine_side.gateway_p95_ms:.2f} ms) before asking the engine: {engine_side.gateway_share_p50:.1%} of client TTFT")
assert panel.loc["response cache", "ttft_p50_ms"] < engine_side.ttft_p50_ms
assert rates["response-cache hit rate (requests, gateway)"] > 0
gw.stop()
cache_server.stop()

# %% [markdown]
# ## 6. The bad dashboard
#
# Two traffic mixes, the same number of requests arriving at the same steady rate, the same output tokens per request:
#
# - **chat only** — short questions;
# - **chat + agents** — a share of the requests are turns of agent loops; each turn resends the whole conversation
#   plus a tool's JSON result and the documents it retrieved, so the prompt grows every turn.
#
# A panel of *tokens per second* (averaged over a few seconds per point, as a dashboard's `rate()` does) follows the
# demand — about the same either way, as long as the server keeps up (the figure's title says whether it did here).
# The TTFT percentiles and the prompt tokens sent per second tell the real story.

# %%
n_requests, rate = kvlab.pick(24, 12), kvlab.pick(1.0, 1.5)
agent_turns, growth, out_tokens = kvlab.pick(5, 3), kvlab.pick(400, 300), 24
agent_turns = traffic.agent_turns_that_fit(tok, agent_turns, growth, 1, server.max_model_len(), out_tokens)  # fewer on a short context
mixes = {"chat only": traffic.traffic_mix(tok, n_requests, 0.0, agent_turns, growth, tools=1),
         "chat + agents": traffic.traffic_mix(tok, n_requests, 0.25, agent_turns, growth, tools=1, seed=1)}
runs, boards, gauges = {}, {}, {}
for name, sessions in mixes.items():
    runs[name], boards[name], gauges[name] = traffic.run_traffic(server, sessions, out_tokens, rate_per_s=rate)
mix_summary = pd.DataFrame({name: traffic.summary(df, boards[name]["wall_s"]) for name, df in runs.items()}).T
mix_summary.round(1)

# %% tags=["key-figure"]
window = kvlab.pick(5.0, 4.0)  # seconds per point, like a dashboard's rate() over a window
fig = kvlab.traffic.bad_dashboard(runs, window_s=window)
fig.show()

# %%
chat, mixed = mix_summary.loc["chat only"], mix_summary.loc["chat + agents"]
p95_ratio = mixed["TTFT p95 (ms)"] / chat["TTFT p95 (ms)"]
tps_change = abs(mixed["output tokens/s (mean)"] / chat["output tokens/s (mean)"] - 1)
print(f"output tokens/s: {chat['output tokens/s (mean)']:.1f} vs {mixed['output tokens/s (mean)']:.1f} ({tps_change:.0%} apart); "
      f"TTFT p95: {chat['TTFT p95 (ms)']:.0f} vs {mixed['TTFT p95 (ms)']:.0f} ms ({p95_ratio:.1f}×); "
      f"mean prompt tokens {chat['prompt tokens (mean)']:.0f} vs {mixed['prompt tokens (mean)']:.0f}, output tokens "
      f"{chat['output tokens (mean)']:.0f} vs {mixed['output tokens (mean)']:.0f}")
probe_agent = side_by_side[side_by_side.kind == "agent"].iloc[0]  # section 3's agent prompt, prefilled alone
agent_prefill_ms = probe_agent.engine_prefill_s * 1e3
if agent_prefill_ms >= 5 * chat["TTFT p95 (ms)"]:  # a chat behind an agent's prefill waits far longer than its own TTFT
    assert p95_ratio >= 2, p95_ratio
    assert tps_change < p95_ratio - 1, (tps_change, p95_ratio)
else:  # a model whose prefill is quick: a chat that meets an agent's prefill barely waits
    print(f"The 2× check is skipped on this model: one agent prompt prefills in {agent_prefill_ms:.0f} ms (section 3), "
          f"under 5× the chats' TTFT p95 ({chat['TTFT p95 (ms)']:.0f} ms), so a chat behind it need not wait twice as long. "
          + kvlab.claim(p95_ratio >= 2, "The TTFT p95 doubled all the same.", f"Here it moved {p95_ratio:.1f}×."))

# %% [markdown]
# The same two runs as the server's own `/metrics` tells them — what the operations dashboard would plot: histogram
# percentiles, prefix-cache hits, and the KV cache usage and waiting queue sampled every half second during the run.

# %%
columns = ["requests", "prompt tokens", "output tokens/s", "TTFT p50 (ms)", "TTFT p95 (ms)", "ITL p95 (ms)",
           "prefix cache hit rate", "KV cache usage (peak)", "requests waiting (peak)"]
pd.DataFrame(boards).T.reindex(columns=columns).round(3)

# %% [markdown]
# Who waited? Per request kind, with prompt and output tokens logged apart: the slow first tokens belong to long
# prompts — and to the chats that arrived while one was being prefilled. Then decode speed: a TTFT spike with unchanged
# TPOT is a prefill/queue story, not "the machine got slower"; a TPOT that rose too means decodes shared their steps
# with those prefills (the line below says which happened here).

# %%
who = runs["chat + agents"].groupby("kind").agg(requests=("ttft_s", "size"), prompt_tokens=("prompt_tokens", "mean"),
    output_tokens=("output_tokens", "mean"), ttft_p50_ms=("ttft_s", lambda s: s.median() * 1e3),
    ttft_max_ms=("ttft_s", lambda s: s.max() * 1e3), tpot_p50_ms=("tpot_s", lambda s: s.median() * 1e3)).round(1)
chat_tpot = (runs["chat only"].tpot_s.median() * 1e3, who.loc["chat", "tpot_p50_ms"])
tpot_moved = chat_tpot[1] / chat_tpot[0] - 1
print(f"chat TPOT p50: {chat_tpot[0]:.0f} ms alone, {chat_tpot[1]:.0f} ms beside agents ({tpot_moved:+.0%}): "
      + kvlab.claim(abs(tpot_moved) <= 0.15, "decode speed barely moved — the TTFT spike is prefill and queueing.",
                    "decode slowed as well — chats' decode steps carried the agents' prefill chunks."))
who

# %% [markdown]
# ## 7. The agent's prefill storm
#
# One agent loop alone: each turn's prompt is everything so far. With **prefix caching** the engine reuses the KV of
# the conversation up to the last full block and prefills only what is new; without it, every turn prefills the whole
# history again and TTFT grows with it. "Without" needs no second server: the same loop runs again with a fresh
# `cache_salt` on every turn. vLLM mixes a request's salt into the hash of its first block
# (`vllm/v1/core/kv_cache_utils.py`), so no block of an earlier turn matches and each turn is prefilled whole, as with
# caching off (tenants use the salt to keep their cached prefixes apart). The counters confirm it: nothing reused.
# Five turns where the salted run's prefills (forecast from section 3's agent prompt) fit about 25 seconds here, else four.

# %%
per_token_s = probe_agent.engine_prefill_s / probe_agent.prompt_tokens
turn_tokens = traffic.agent_request_tokens(tok, 5, 400, 1, 16)
salted_s = lambda n: per_token_s * sum(turn_tokens[:n])  # noqa: E731 - the salted run's prefills, forecast
storm_turns = kvlab.fit_to_time(kvlab.pick([5, 4], [4]), salted_s, kvlab.pick(25.0, 15.0))
storm_turns = traffic.agent_turns_that_fit(tok, storm_turns, 400, 1, server.max_model_len(), 16)  # fewer on a short context
print(f"{storm_turns} turns: the salted run's prefills forecast at about {salted_s(storm_turns):.0f} s here "
      f"({per_token_s * 1e3:.2f} ms per prompt token)")
agent = traffic.agent_session(tok, storm_turns, 400, tools=1, seed=7)
storm = {"prefix caching on": traffic.agent_storm(server, agent, 16),
         "no reuse (salted)": traffic.agent_storm(server, agent, 16, reuse=False)}
storms = pd.concat([df.assign(setting=name) for name, df in storm.items()], ignore_index=True)
storms.pivot(index="turn", columns="setting", values=["prompt_tokens", "cached_tokens", "ttft_s"]).round(3)

# %%
import plotly.express as px

px.line(storms.assign(ttft_ms=storms.ttft_s * 1e3), x="prompt_tokens", y="ttft_ms", color="setting", markers=True,
        title="Agent loop: TTFT per turn as the prompt grows", labels={"prompt_tokens": "prompt tokens at this turn",
        "ttft_ms": "client TTFT (ms)"}).show()
on, off = storm["prefix caching on"], storm["no reuse (salted)"]
assert (off.cached_tokens == 0).all() and on.cached_tokens.iloc[-1] > 0, storms
assert off.ttft_s.iloc[-1] > off.ttft_s.iloc[0] and off.ttft_s.iloc[-1] > on.ttft_s.iloc[-1]
print(f"last turn ({off.prompt_tokens.iloc[-1]:,} prompt tokens): TTFT {off.ttft_s.iloc[-1] * 1e3:.0f} ms with nothing reused, "
      f"{on.ttft_s.iloc[-1] * 1e3:.0f} ms with ({on.cached_tokens.iloc[-1]:,.0f} tokens reused)")

# %% [markdown]
# ## 8. Failure modes, and where this course measured each
#
# | Failure mode | Measured in |
# |---|---|
# | A tokens/sec-only dashboard hides TTFT regressions from long agent prompts | [06 · 6. The bad dashboard](#6.-The-bad-dashboard) |
# | Looking only at mean latency: blind to p95 prefill storms | [06 · 7. The agent's prefill storm](#7.-The-agent's-prefill-storm), [02 · 6. The client's view](02_prefill_vs_decode.ipynb#6.-The-client's-view:-a-token-by-token-stream), [07 · 4. The rate sweep](07_capacity_under_slos.ipynb#4.-Open-loop:-a-rate-sweep,-and-the-knee) |
# | Prompt and output tokens not logged apart: a TTFT spike blamed on "the GPU got slower" | [06 · 6. (per request kind)](#6.-The-bad-dashboard), [02 · 5. Where the time goes](02_prefill_vs_decode.ipynb#5.-Where-the-time-goes:-short-vs-long-prompts-×-output-lengths) |
# | Per-chunk gaps reported as "inter-token latency": with speculative decoding a chunk carries several tokens | [09 · 5. ITL is no longer TPOT](09_speculative_decoding.ipynb#5.-What-it-does-to-the-metrics:-ITL-is-no-longer-TPOT), [02 · 1. What other tools call it](02_prefill_vs_decode.ipynb#1.-What-we-measure,-and-what-other-tools-call-it) |
# | Confusing Redis cache hits with engine prefix hits: a Redis hit skips the model, a prefix hit skips part of prefill | [06 · 5. A gateway in front](#5.-A-gateway-in-front:-two-hit-rates,-and-the-gateway's-share-of-TTFT), [03 · 7. A response cache is a different thing](03_prefix_caching.ipynb#7.-A-response-cache-is-a-different-thing:-Redis-behind-a-gateway) |
# | Client TTFT read as engine TTFT (HTTP, template, detokenization are outside the engine) | [06 · 3. Client-side vs engine-side TTFT](#3.-Client-side-vs-engine-side-TTFT) |
# | KV cache sized by guesswork | [01 · 4. Proving it against the engine](01_kv_cache_by_hand.ipynb#4.-Proving-it-against-the-engine) |
# | fp8 KV cache assumed free | [01 · 6. KV precision](01_kv_cache_by_hand.ipynb#6.-KV-precision:-fp8-halves-the-cache-—-what-does-it-cost?) |
# | A timestamp or version at the start of the prompt breaks every prefix hit | [03 · 4. Token identity](03_prefix_caching.ipynb#4.-Token-identity:-what-breaks-a-hit) |
# | Benchmarking prefix caching with unique synthetic prompts (zero benefit) | [03 · 5. Synthetic unique prompts](03_prefix_caching.ipynb#5.-Synthetic-unique-prompts:-zero-benefit) |
# | One long prompt stalls every decoding user | [04 · 3. The stall, token by token](04_chunked_prefill.ipynb#3.-The-stall,-token-by-token) |
# | A short request stuck behind a long one | [04 · 5. A short prompt behind a long one](04_chunked_prefill.ipynb#5.-A-short-prompt-behind-a-long-one) |
# | Bigger batches bought with every user's latency | [05 · 1. Offline batches](05_batching.ipynb#1.-Offline-batches) |
# | KV cache full: queueing and preemption | [05 · 3. When the KV cache caps the batch](05_batching.ipynb#3.-When-the-KV-cache-caps-the-batch), [08 · 6. Preemption](08_inside_the_paged_kv_cache.ipynb#6.-Preemption:-more-sequences-than-the-pool-holds) |
# | The prefix-cache hit rate falls under load: other traffic evicts the shared prefix | [08 · 4. The block pool over time](08_inside_the_paged_kv_cache.ipynb#4.-The-block-pool-over-time), [08 · 5. Hit rate against the KV budget](08_inside_the_paged_kv_cache.ipynb#5.-Hit-rate-against-the-KV-budget) |
# | Optimizing throughput while the TTFT SLO burns | [07 · 4. Open loop: a rate sweep, and the knee](07_capacity_under_slos.ipynb#4.-Open-loop:-a-rate-sweep,-and-the-knee) |
# | A closed-loop load test: it cannot show the queue an overloaded product builds | [07 · 5. Open vs closed loop](07_capacity_under_slos.ipynb#5.-Open-vs-closed-loop:-which-one-can-show-the-queue-explode?) |
# | One pool for interactive chat and offline summarization | [07 · 6. Chat next to batch jobs](07_capacity_under_slos.ipynb#6.-Chat-next-to-batch-jobs-on-one-pool), [07 · 7. Four ways to keep chat fast](07_capacity_under_slos.ipynb#7.-Four-ways-to-keep-chat-fast,-measured-on-the-same-traffic) |

# %% [markdown]
# ## 9. Stop the server
#
# Nothing may keep running after a lesson: stop the server and check that none of its processes is left.

# %%
pids = [p.pid for p in server.processes()]
serving.stop_servers()
import psutil

left = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
print(f"stopped {len(pids)} server processes; still running: {left or 'none'}")
assert not left

# %% [markdown]
# ## Summary
#
# Written from this run's numbers:

# %%
from IPython.display import Markdown

Markdown(f"""
- Client TTFT was at least the engine's TTFT for all {len(side_by_side)} requests; the part outside the engine (HTTP, chat
  template and tokenization, detokenization, streaming) was {side_by_side.gap_ms.median():.1f} ms at the median.
- The server's `/metrics` put the TTFT p50 at {board['TTFT p50 (ms)']:.0f} ms (histogram estimate) against the engine's per-request
  median of {rerun.engine_ttft_s.median() * 1e3:.0f} ms; the repeated prompts hit the prefix cache at {board['prefix cache hit rate']:.0%}.
- Same request rate, same output lengths: output tokens/s {chat['output tokens/s (mean)']:.1f} (chat only) vs
  {mixed['output tokens/s (mean)']:.1f} (with agents) — {tps_change:.0%} apart — while TTFT p95 went {chat['TTFT p95 (ms)']:.0f} →
  {mixed['TTFT p95 (ms)']:.0f} ms (**{p95_ratio:.1f}×**) and the mean prompt grew {chat['prompt tokens (mean)']:.0f} →
  {mixed['prompt tokens (mean)']:.0f} tokens.
- Behind a gateway with Redis, {rates['response-cache hit rate (requests, gateway)']:.0%} of the FAQ requests were answered
  without the model while the engine's prefix cache hit {rates['prefix-cache hit rate (tokens, engine)']:.0%} of the prompt
  tokens it saw; the gateway added {engine_side.gateway_p50_ms:.2f} ms at the median ({engine_side.gateway_share_p50:.1%} of
  client TTFT).
- An agent's {storm_turns}-turn loop reached {off.prompt_tokens.iloc[-1]:,} prompt tokens: last-turn TTFT
  {off.ttft_s.iloc[-1] * 1e3:.0f} ms with nothing reused, {on.ttft_s.iloc[-1] * 1e3:.0f} ms with its prefix cached.
""")

# %% [markdown]
# ## Exercises
#
# 1. Raise the agents' share to 0.5 (lab `L06_traffic_mix`). Does output tokens/s still look flat? At what share does the
#    server stop keeping up — and what does the tokens/sec panel show then?
# 2. Section 3's gap is a few milliseconds on this machine. Send 8 requests at once instead of one at a time: what
#    happens to the client-side TTFT, and why can't the per-request engine numbers be read from `/metrics` any more?
# 3. Write the alert rule you would put on this service: which metric, which percentile, which threshold — and check it
#    would have fired on section 6's mixed traffic but not on chat only.
