# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Prefix caching — the TTFT you save, and when you don't
#
# Most requests to a deployed assistant start the same way: a long system prompt, tool schemas, a RAG header. Prefill
# recomputes their keys and values for every request — unless the engine keeps them. vLLM's **prefix cache** does:
# it keeps finished KV blocks, keyed by the exact token ids they hold (and everything before them), and a new request
# reuses the longest run of whole blocks it shares with one already cached.
#
# You will measure: cold vs warm TTFT for a realistic prefix (up to 2,300 tokens, shorter on a slower CPU), the
# saving vs prefix length (and why it comes in whole blocks), what breaks a hit (token identity, not meaning), why
# synthetic unique prompts show zero benefit, a mixed-traffic run, and how all of this differs from an application's
# response cache.

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()

# %% [markdown]
# ## 1. One engine and a realistic prefix
#
# The prefix is a support assistant's system prompt plus the JSON schemas of its tools (`data/prefix/`); user turns
# follow it. One engine with prefix caching on, reused for the whole lesson.

# %%
import pandas as pd

from kvlab import caching, timing

llm = kvlab.make_engine(enable_prefix_caching=True)
tok = llm.get_tokenizer()
cap = kvlab.kv_capacity(llm)
block, context = cap.block_size, cap.max_model_len
# up to 7 of its 13 tools (~2,300 tokens; 5 in quick mode): fewer where the context is shorter or where one cold
# prefill of that prompt would take longer than the target below (a slower CPU: a shorter prompt, the same lesson)
target_s = kvlab.pick(6.0, 4.5)
n_tools, timed_s, timed_tokens = caching.tools_for_time(llm, kvlab.pick(7, 5), context, target_s)
system = caching.static_prefix(n_tools=n_tools)
print(f"a cold prefill of {timed_tokens:,} prompt tokens took {timed_s:.2f} s here (target ≤ {target_s:.1f} s) → {n_tools} tools")
turns = caching.user_turns()
example = caching.chat_ids(tok, system, turns[0])
shared = caching.common_prefix(example, caching.chat_ids(tok, system, turns[1]))
print(f"prompt: {len(example):,} tokens, of which {shared:,} are shared by every request "
      f"= {shared // block} full blocks of {block} tokens (+{shared % block} tokens in a partial block)")

# %% [markdown]
# ## 2. Cold vs warm TTFT
#
# Cold: the cache is emptied before each request, so the whole prompt is prefilled. Warm: an earlier request has cached
# the prefix; only the user turn is prefilled. `cached_tokens` is vLLM's `num_cached_tokens` for each request.

# %%
n_turns = kvlab.pick(6, 3)
cw = caching.cold_vs_warm(llm, system, turns[:n_turns])
cw[["cache", "label", "prompt_tokens", "cached_tokens", "ttft_s"]].round(3)

# %% tags=["key-figure"]
s = timing.summarize(cw, ["ttft_s"], by=["cache"]).set_index("cache")
cold_s, warm_s = s.ttft_s_p50["cold"], s.ttft_s_p50["warm"]  # this machine's speed: later sections are sized from it
cold_ms, warm_ms = cold_s * 1e3, warm_s * 1e3
print(f"median TTFT: cold {cold_ms:.0f} ms, warm {warm_ms:.0f} ms → {cold_ms / warm_ms:.1f}× faster, {cold_ms - warm_ms:.0f} ms saved per request")
import plotly.express as px

px.strip(cw, x="cache", y=cw.ttft_s * 1e3, color="cache", title="TTFT with the prefix cold vs cached",
         labels={"y": "TTFT (ms)"}).show()

# %% [markdown]
# ## 3. TTFT saved vs prefix length — in whole blocks
#
# Now a shared prefix of several lengths (real text, exact token counts) plus a short unique suffix. The cache reuses
# **whole blocks** only. A prefix that ends exactly on a block boundary is reused entirely; one token shorter and the
# last block also holds suffix tokens, so it differs and a whole block is recomputed. The check: at the longest prefix
# the warm request saves at least half of what the prefix adds to a cold TTFT (a fixed ratio such as "warm is under
# half of cold" holds on a CPU, not for a small model on a GPU, whose fixed cost per step dwarfs its prefill).
# Repeats: three where a pass over the lengths is forecast (from section 2's cold TTFT per token) to fit about
# 35 seconds on this machine, else two.

# %%
lengths = sorted({max(2, tokens // block) * block for tokens in kvlab.pick([256, 512, 1024, 2048], [256, 1024])
                  if tokens + 64 <= context})  # whole blocks, with the suffix and answer inside the model's context
lengths_and_one_short = sorted(set(lengths + [length - 1 for length in lengths]))
per_token_s = cold_s / len(example)  # section 2's cold prefill, per prompt token: this machine's speed
one_repeat_s = sum(per_token_s * n + warm_s for n in lengths_and_one_short)  # a cold and a warm request each
repeats = kvlab.fit_to_time(kvlab.pick([3, 2], [2]), lambda r: r * one_repeat_s, kvlab.pick(35.0, 15.0))
print(f"one pass over {len(lengths_and_one_short)} prefix lengths: about {one_repeat_s:.0f} s here → {repeats} repeats")
sweep = caching.prefix_length_sweep(llm, lengths_and_one_short, suffix_tokens=32, repeats=repeats)
by_len = sweep.groupby(["prefix_tokens", "cache"]).agg(ttft_ms=("ttft_s", lambda x: 1e3 * x.median()), cached=("cached_tokens", "median")).unstack("cache")
by_len.columns = [f"{metric}_{cache}" for metric, cache in by_len.columns]
by_len["saved_ms"] = by_len.ttft_ms_cold - by_len.ttft_ms_warm
by_len["blocks_reused"] = by_len.cached_warm / block
by_len.round(1)

# %%
import plotly.graph_objects as go

fig = go.Figure()
for cache in ["cold", "warm"]:
    part = by_len[f"ttft_ms_{cache}"].loc[lengths]
    fig.add_scatter(x=lengths, y=part, mode="lines+markers", name=cache)
fig.update_layout(title="TTFT vs shared prefix length (medians)", xaxis_title="shared prefix (tokens)", yaxis_title="TTFT (ms)")
fig.show()
longest = lengths[-1]
ratio_longest = by_len.ttft_ms_warm[longest] / by_len.ttft_ms_cold[longest]
grown = by_len.ttft_ms_cold[longest] - by_len.ttft_ms_cold[lengths[0]]  # the part of cold TTFT the prefix adds
print(f"longest prefix ({longest:,} tokens): warm/cold = {ratio_longest:.2f}; the cache saved {by_len.saved_ms[longest]:.0f} ms "
      f"there, while cold TTFT grew by {grown:.0f} ms from {lengths[0]:,} to {longest:,} tokens")
assert by_len.saved_ms[longest] >= 0.5 * grown > 0, (by_len.saved_ms[longest], grown)  # the cache removes what the prefix adds

# %% [markdown]
# The whole-block rule holds for a model whose layers all attend to the whole context — **one KV cache group**. A model
# with sliding-window layers next to full ones (Gemma-3's five local to one global) has several groups, and a hit must
# hold in every group: vLLM's hybrid coordinator takes the longest prefix that the full-attention group has in whole
# blocks *and* for which each sliding-window group still has the last ⌈(window − 1) ÷ block⌉ blocks before it cached
# (`vllm/v1/core/kv_cache_coordinator.py`, `HybridKVCacheCoordinator.find_longest_cache_hit`;
# `single_type_kv_cache_manager.py`, `SlidingWindowManager.find_longest_cache_hit`). Blocks that slid out of an earlier
# request's window may never have been kept, so a prefix can hit less — or nothing. For such a model the cell below
# replays the same requests on vLLM's own scheduler (no weights: lesson 10's tool) and checks the engine against it.

# %%
groups = kvlab.kv_groups(llm)
print(f"{len(groups)} KV cache group(s): " + "; ".join(f"{r.kind} ({r.layers} layers)" for r in groups.itertuples()))
if len(groups) == 1:  # whole blocks of the shared prefix
    assert (by_len.cached_warm.loc[lengths] == lengths).all()
    assert (by_len.cached_warm.loc[[n - 1 for n in lengths]].values == [n - block for n in lengths]).all()
else:  # what vLLM's scheduler finds for the same two requests, each prefix length on an empty cache
    from kvlab import forecast

    setup = forecast.setup_from_engine(llm)
    by_len["replayed_warm"] = [forecast.replay_hits(setup, list(caching.sweep_pair(tok, n, 32, 0, repeats)), 4)[1]
                               for n in by_len.index]
    print(by_len[["cached_warm", "replayed_warm"]].assign(whole_blocks=[n // block * block for n in by_len.index]))
    assert (by_len.cached_warm == by_len.replayed_warm).all(), by_len[["cached_warm", "replayed_warm"]]

# %% [markdown]
# ### A request never reuses its whole prompt
#
# One more rule, and it is vLLM's, not the cache's: **the last prompt token is always computed**, because its logits
# give the first output token (`vllm/v1/core/kv_cache_manager.py`: `max_cache_hit_length = request.num_tokens - 1`).
# With whole blocks, a prompt of exactly N blocks sent twice therefore hits N − 1 of them, not N: the last block
# contains the last token.

# %%
from kvlab import prompts

n_blocks = max(2, min(4, context // block - 1))
whole = prompts.prompt_of_length(tok, n_blocks * block, offset=7_000)
llm.reset_prefix_cache()
timing.generate_timed(llm, whole, 1)  # caches its full blocks
again = timing.generate_timed(llm, whole, 1)
print(f"a prompt of exactly {n_blocks} blocks ({n_blocks * block} tokens), sent again: {again.num_cached_tokens} tokens from "
      f"the cache = {again.num_cached_tokens // block} blocks; the last block is computed again")
assert again.num_cached_tokens == (n_blocks - 1) * block

# %% [markdown]
# ## 4. Token identity: what breaks a hit
#
# The cache key is the token sequence, not its meaning. We cache the original prefix once, then send variants of it
# with the same user turn and read how many tokens each reused:

# %%
identity = caching.identity_experiment(llm, system, turns[0])
identity[["label", "prompt_tokens", "tokens shared with original", "cached_tokens", "ttft_s"]].round(3)

# %%
ident = identity.set_index("label")
assert ident.cached_tokens["one character changed at the start"] == 0
assert ident.cached_tokens["first sentence paraphrased"] == 0
assert ident.cached_tokens["one character changed at the end"] >= ident["tokens shared with original"]["one character changed at the end"] - block
print("edit at the start → nothing reused; same edit at the end → all full blocks before it reused; paraphrase → nothing.")

# %% [markdown]
# **Versioning on purpose.** If your instructions change, the cache must not serve old KV — and it cannot, since the tokens
# differ. Where you put the version string decides *how much* is invalidated: **first** in the prompt, bumping it busts
# the whole prefix (a clean cut-over); **last**, everything before it is still reused.
#
# ## 5. Synthetic unique prompts: zero benefit
#
# Benchmarks often send random or unique prompts. Measured with caching on, after all the traffic above:

# %%
before = caching.prefix_counters(llm)
unique = caching.timed_requests(llm, kvlab.prompts.distinct_prompts(tok, len(example), kvlab.pick(4, 3), seed=99), max_tokens=4)
after = caching.prefix_counters(llm)
print(f"cached tokens per unique prompt: {unique.cached_tokens.tolist()}; engine counter: {after['hits'] - before['hits']} hit tokens of {after['queries'] - before['queries']} queried")
assert (unique.cached_tokens == 0).all()

# %% [markdown]
# ## 6. Mixed traffic
#
# A more realistic stream: 80 % of requests share the prefix (with random user turns), 20 % are unique prompts of the
# same length, in random order — once with caching, once with the cache emptied before every request (the same as
# caching off). Hit rate from the engine's own counters. The number of requests (10, 8 or 6) is the most whose forecast
# from section 2's cold and warm medians fits about 35 seconds on this machine.

# %%
traffic_s = lambda n: n * cold_s + cold_s + n * (0.2 * cold_s + 0.8 * warm_s)  # noqa: E731 - off: all cold; on: 80 % warm
n_requests = kvlab.fit_to_time(kvlab.pick([10, 8, 6], [6]), traffic_s, kvlab.pick(35.0, 20.0))
print(f"{n_requests} requests per setting: about {traffic_s(n_requests):.0f} s here (cold {cold_s:.2f} s, warm {warm_s:.2f} s)")
mixed_on, counters_on = caching.mixed_traffic(llm, system, turns, n_requests, 0.8, seed=1, caching=True)
mixed_off, counters_off = caching.mixed_traffic(llm, system, turns, n_requests, 0.8, seed=1, caching=False)
mixed = pd.concat([mixed_on, mixed_off])
table = timing.summarize(mixed, ["ttft_s"], by=["caching"]).set_index("caching")
table["token hit rate"] = table.index.map({"on": counters_on["token_hit_rate"], "off": counters_off["token_hit_rate"]})
table.round(3)

# %%
px.box(mixed, x="caching", y=mixed.ttft_s * 1e3, color="label", points="all",
       title="Mixed traffic (80 % shared prefix): TTFT with and without prefix caching", labels={"y": "TTFT (ms)", "label": "request"}).show()

# %% [markdown]
# ## 7. A response cache is a different thing: Redis behind a gateway
#
# A deployed stack puts a **gateway** between the client and the engine (`kvlab/runtime/gateway.py`: the same OpenAI chat API,
# forwarding to lesson 06's vLLM server). It answers an *exact repeat* of a greedy request (temperature 0, one choice) from
# **Redis** — a real `redis-server` on 127.0.0.1, no persistence — and that hit skips the model entirely. Everything
# else goes to the engine, whose prefix cache may still skip part of prefill. Two caches, two hit rates, two metrics.
#
# The same questions down each path: a **cold prefill** (a system prompt no request had before), a **warm prefix**
# (the shared system prompt already cached), a **response-cache hit** (the same request again), and two edits that
# miss both caches: the first sentence **paraphrased** (new tokens from the start: no prefix hit; a new key: no Redis
# hit) and a **version string bumped** at the top. The in-process engine goes first: the server takes its place. It
# runs the model inside its engine core on every core, as the in-process engine did (`distributed_executor_backend="uni"`;
# lesson 06 shows vLLM's CPU default, which keeps a core for the scheduler).

# %%
from kvlab.runtime import gateway, serving
from kvlab.runtime.redis_server import RedisServer

kvlab.close_engine(llm)
server_context = kvlab.model.fit_context(4096)  # 4,096 tokens, or the model's own context where it is shorter
server = serving.start_server(enable_prefix_caching=True, enable_prompt_tokens_details=True, enforce_eager=True,
                              max_model_len=server_context, distributed_executor_backend="uni")
cache_server = RedisServer().start()
gw = gateway.Gateway(server.url, server.model, cache_server.redis_url, ttl_s=600).start()
short_system = caching.static_prefix(n_tools=caching.tools_that_fit(tok, 1, server_context))  # 1 tool: a quicker cold prefill
asked = turns[:3]  # three per path in both modes: a median of three is not moved by one stall of the shared machine
n_edits = kvlab.pick(len(asked), 1)  # the edits' checks are per request (who answered, tokens cached), not medians
edits = {"paraphrased": caching.edited_prompts(short_system, "paraphrase", n_edits),
         "version bumped": caching.edited_prompts(short_system, "version bump", n_edits)}
paths = caching.three_paths(gw.client(), short_system, asked, max_tokens=8, variants=edits)
paths["ttft_ms"] = paths.ttft_s * 1e3
by_path = paths.groupby("label", sort=False).agg(requests=("ttft_ms", "size"), answered_by=("answered_by", "first"),
                                                 engine_cached_tokens=("cached_tokens", "median"),
                                                 ttft_p50_ms=("ttft_ms", "median"), ttft_p95_ms=("ttft_ms", lambda s: s.quantile(0.95)))
by_path.round(1)

# %%
px.bar(by_path.reset_index(), x="label", y="ttft_p50_ms", color="answered_by", log_y=True, error_y=by_path.ttft_p95_ms.values - by_path.ttft_p50_ms.values,
       labels={"label": "path", "ttft_p50_ms": "client TTFT p50 (ms, log; bar to p95)", "answered_by": "answered by"},
       title="Through the gateway: Redis skips the model, a prefix hit skips part of prefill, an edit misses both").show()

# %%
hit_ms = paths[paths.answered_by == "response cache"].gateway_ms.median()  # the gateway's own time, from its header
cold_p50, warm_p50, redis_p50 = (by_path.ttft_p50_ms[k] for k in ("cold prefill", "warm prefix", "response cache"))
print(f"client TTFT p50: cold {cold_p50:.0f} ms → warm prefix {warm_p50:.0f} ms → Redis {redis_p50:.1f} ms; inside the gateway a "
      f"Redis hit took {hit_ms:.2f} ms (median), the rest is HTTP and the client")
assert redis_p50 < warm_p50 < cold_p50, by_path.ttft_p50_ms.to_dict()
assert (paths[paths.label.isin(edits)].answered_by == "engine").all()  # a new key: Redis misses
assert (paths[paths.label.isin(edits)].cached_tokens <= block).all()  # new tokens from (nearly) the start: the prefix misses
gw.stop()
cache_server.stop()
server.stop()

# %% [markdown]
# ## Summary
#
# Written from this run's numbers:

# %%
from IPython.display import Markdown

on, off = table.loc["on"], table.loc["off"]
p95_change = on.ttft_s_p95 / off.ttft_s_p95 - 1
p95_sentence = kvlab.claim(
    abs(p95_change) <= 0.1, f"The p95 barely moved ({p95_change:+.0%}): it is set by the unique 20 %, which no prefix cache helps.",
    f"The p95 rose {p95_change:.0%} with caching on: the tail is the unique 20 %, which no prefix cache helps, and over "
    f"{len(mixed_on)} requests it moves with where they land in the queue." if p95_change > 0 else
    f"Even p95 dropped ({p95_change:+.0%}): few unique requests landed in the tail this time.")
Markdown(f"""
- With a {shared:,}-token shared prefix, median TTFT fell from **{cold_ms:.0f} ms cold to {warm_ms:.0f} ms warm**
  ({cold_ms / warm_ms:.1f}×, {cold_ms - warm_ms:.0f} ms saved per request).
- The saving grows with the prefix: at {longest:,} tokens warm TTFT was **{ratio_longest:.2f}×** cold. Reuse comes in whole
  blocks of {block} tokens: a prefix one token short of a block boundary reused {block} tokens less.
- A one-character edit at the start reused **{int(ident.cached_tokens['one character changed at the start'])}** tokens; the same
  edit at the end reused **{int(ident.cached_tokens['one character changed at the end']):,}**; a paraphrase reused
  **{int(ident.cached_tokens['first sentence paraphrased'])}**. Unique prompts reused **{int(unique.cached_tokens.sum())}**.
- Mixed traffic (80 % shared): token hit rate **{counters_on['token_hit_rate']:.0%}**, TTFT p50 {on.ttft_s_p50 * 1e3:.0f} ms /
  p95 {on.ttft_s_p95 * 1e3:.0f} ms with caching vs p50 {off.ttft_s_p50 * 1e3:.0f} ms / p95 {off.ttft_s_p95 * 1e3:.0f} ms without.
  {p95_sentence}
- Through the gateway, client TTFT p50 was {cold_p50:.0f} ms for a cold prefill, {warm_p50:.0f} ms with the prefix
  cached and **{redis_p50:.1f} ms** for a Redis hit ({hit_ms:.2f} ms of it inside the gateway); a paraphrase and a
  version bump missed both caches.
""")

# %% [markdown]
# ## Exercises
#
# 1. Your team adds today's date at the top of the system prompt. Predict the hit rate, then measure it with
#    `caching.identity_experiment` on a prompt built that way.
# 2. Where in a RAG prompt should the retrieved documents go — before or after the fixed instructions — to keep hits high?
# 3. Re-run section 6 with `shared_fraction` 0.5 and 0.95. How do p50 and p95 move? Why does p95 lag?
# 4. The warm TTFT is not zero. What is still being prefilled, and what else is in TTFT?
# 5. Start the gateway with `ttl_s=2` and send one question twice, three seconds apart. Which path answers the
#    second — and what does a TTL trade (stale answers against hit rate)?

