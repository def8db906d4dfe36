# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 · Inside the paged KV cache — blocks, sharing, eviction and preemption, watched live
#
# Lesson 01 sized the KV cache and lesson 03 timed what reusing it saves. This lesson watches the cache itself.
# vLLM's *PagedAttention* keeps keys and values in fixed-size **blocks**: a sequence holds ⌈tokens ÷ block size⌉ of
# them through a block table; a full block whose whole prefix matches another request's is **shared**; blocks of
# finished requests stay **cached** until their memory is needed, then the **least recently used** is evicted; and
# when a running sequence cannot get its next block, **another** running sequence is **preempted** (the last admitted,
# under first-come-first-served) and admitted again later — partly from the prefix cache, partly recomputed.
#
# The engine reports every change to its cached blocks as **KV cache events** (`BlockStored`, `BlockRemoved`,
# `AllBlocksCleared`; `vllm/distributed/kv_events.py`), published on a ZMQ socket. `kvlab.kvevents.Subscriber`
# listens on a private `ipc://` socket (nothing on the network) and turns them into a table.

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()

# %% [markdown]
# ## 1. An engine that reports its blocks
#
# The subscriber starts before the engine (so no event is missed) and is closed at the end of the lesson. The engine
# groups its layers into **KV cache groups** (vLLM's `get_kv_cache_groups`): all layers alike make one group; a model
# with sliding-window and full-attention layers has several, and vLLM stores every block once **per group** (each
# `BlockStored` event names its group). This lesson follows the full-attention group's blocks.

# %%
import pandas as pd

from kvlab import kvevents, paged
from kvlab.caching import prefix_counters

sub = kvevents.Subscriber().start()
llm = kvlab.make_engine(enforce_eager=True, **sub.engine_args())
cap = kvlab.kv_capacity(llm)
B, tok = cap.block_size, llm.get_tokenizer()
print(cap)
groups = kvlab.kv_groups(llm)  # one for an attention-only model; sliding-window and full layers make several
full = int(groups[groups.full_attention].group.min()) if groups.full_attention.any() else 0
groups

# %% [markdown]
# ## 2. One request's blocks
#
# A prompt of 3 blocks and part of a fourth (17 tokens with 128-token blocks). Only **full** blocks are cached (their
# hash covers their tokens and their whole prefix): the engine stores ⌊tokens ÷ block size⌋ = 3 of them, and the
# partial block is not cached — in an attention-only model like this one (vLLM 0.32 does cache partial blocks of
# hybrid Mamba models: `BlockPool.cache_partial_block`, used by `HybridKVCacheCoordinator`).
# This is lesson 03's block granularity, seen from inside.

# %%
from kvlab.prompts import distinct_prompts, prompt_of_length

ids = prompt_of_length(tok, 3 * B + B // 8 + 1)  # 3 full blocks + a partial one, whatever the block size
before = prefix_counters(llm)
first = paged.run_sequential(llm, [("first", ids), ("again", ids)], max_tokens=2)
sub.wait_quiet()
per_group = sub.table().query("event == 'stored'").groupby("group").size()
events = sub.table(group=full)
after = prefix_counters(llm)
events[["seq", "event", "block_hash", "parent_hash", "position", "tokens"]]

# %%
stored = events[events.event == "stored"]
hits = after["hits"] - before["hits"]
print(f"{len(ids)} prompt tokens → {len(stored)} blocks stored of {B} tokens (⌊{len(ids)} ÷ {B}⌋ = {len(ids) // B}); "
      f"the second identical request found {first.cached_tokens.iloc[1]} cached tokens; the engine's hit counter: {hits:.0f} tokens")
print(f"{len(groups)} KV cache group(s); blocks stored per group: {per_group.to_dict()}")
assert len(stored) == len(ids) // B and hits == len(stored) * B == first.cached_tokens.iloc[1]

# %% [markdown]
# ## 3. Two requests, one shared prefix
#
# Two prompts that share their first 2 blocks and differ after. The second request stores only its own block: its
# first new block's parent is the last shared block — the chain of hashes *is* the prefix.

# %%
sub.clear()
llm.reset_prefix_cache()
prefix = prompt_of_length(tok, 2 * B, offset=50_000)
a, b = prefix + prompt_of_length(tok, B + 5, offset=60_000), prefix + prompt_of_length(tok, B + 5, offset=70_000)
pair = paged.run_sequential(llm, [("A", a), ("B", b)], max_tokens=2)
sub.wait_quiet()
events = sub.table(group=full)
events["owner"] = kvevents.owners(events, {"A": a, "B": b}, B)
events[events.event == "stored"][["seq", "block_hash", "parent_hash", "position", "owner"]]

# %%
st = events[events.event == "stored"]
b_own = st[st.owner == "B"].iloc[0]
shared_last = st[st.owner == "A, B"].iloc[-1]
print(f"blocks stored: {len(st)} (2 shared + 1 of A's + 1 of B's); B found {pair.cached_tokens.iloc[1]} cached tokens; "
      f"B's first own block {b_own.block_hash} has parent {b_own.parent_hash} = the last shared block {shared_last.block_hash}")
assert (st.owner == "A, B").sum() == 2 and len(st) == 4 and b_own.parent_hash == shared_last.block_hash
assert pair.cached_tokens.iloc[1] == 2 * B
kvlab.close_engine(llm)

# %% [markdown]
# ## 4. The block pool over time
#
# Now a pool of only a few blocks, and a shared prefix (say a system prompt) of 4 blocks. Three phases (a model with
# several KV cache groups gets the same number of blocks in each group: `paged.pool_blocks`):
#
# 1. shared-prefix requests alternate with unique ones — the prefix is used again and again, so it stays recently
#    used: when the pool is full, the *unique* requests' old blocks are evicted;
# 2. only unique requests — the prefix becomes the least recently used and is evicted;
# 3. a shared-prefix request again: a miss, the prefix is computed and stored anew.

# %%
import time

pool_blocks, prefix_blocks = 12, 4
small = paged.engine_with_blocks(pool_blocks, B, cap.bytes_per_block, max_model_len=pool_blocks * B // 2, groups=len(groups),
                                 enforce_eager=True, **sub.engine_args())
sys_prefix = prompt_of_length(tok, prefix_blocks * B, offset=90_000)
shared = [sys_prefix + s for s in distinct_prompts(tok, 40, 6, seed=1)]
unique = distinct_prompts(tok, 3 * B + 10, 8, seed=2)
phases = [("1 · mixed", [("shared", shared[0]), *[r for i in range(4) for r in (("unique", unique[i]), ("shared", shared[i + 1]))]]),
          ("2 · unique only", [("unique", u) for u in unique[4:8]]),
          ("3 · shared again", [("shared", shared[5])])]
sub.clear()
t0, rows, marks = time.time(), [], {}
for phase, requests in phases:
    marks[phase] = time.time() - t0
    rows.append(paged.run_sequential(small, requests, max_tokens=2).assign(phase=phase))
sub.wait_quiet()
end = time.time()
pool = pd.concat(rows, ignore_index=True)
pool_events = sub.table(group=full)
labels = kvevents.owners(pool_events, {"shared prefix": sys_prefix, **{f"unique {i}": u for i, u in enumerate(unique)}}, B)
life = kvevents.lifetimes(pool_events, labels.where(labels.str.startswith("shared") | (labels == ""), "unique"))
pool.groupby(["phase", "label"]).agg(requests=("cached_tokens", "size"), cached_tokens=("cached_tokens", "mean"),
                                     ttft_ms=("ttft_s", lambda s: s.median() * 1e3)).round(1)

# %% tags=["key-figure"]
fig = kvlab.paged.block_pool(life, t0, end, title=f"A {pool_blocks}-block pool: the shared prefix survives while it is used, "
                             "and is evicted first once it is not")
for phase, at in marks.items():
    fig.add_vline(x=at, line_dash="dot", annotation_text=phase, annotation_position="top right")
fig.show()

# %%
removed = pool_events.assign(owner=labels, phase=pd.cut(pool_events.ts - t0, [*marks.values(), float("inf")],
                                                      labels=list(marks), right=False))[pool_events.event == "removed"]
evicted = removed.assign(kind=removed.owner.where(removed.owner == "shared prefix", "unique")).pivot_table(
    index="phase", columns="kind", values="block_hash", aggfunc="count", fill_value=0, observed=False)
evicted

# %%
last = pool[pool.phase == "3 · shared again"].iloc[0]
assert (pool[(pool.phase == "1 · mixed") & (pool.label == "shared")].cached_tokens.iloc[1:] == prefix_blocks * B).all()
prefix_removed = removed[removed.owner == "shared prefix"]
assert (prefix_removed.phase == "2 · unique only").all() and len(prefix_removed) == prefix_blocks
assert last.cached_tokens < prefix_blocks * B
kvlab.close_engine(small)

# %% [markdown]
# ## 5. Hit rate against the KV budget
#
# *Why does the prefix-cache hit rate fall under load?* Because the shared prefix competes for blocks with everything
# else. A finished request's cached blocks go to the back of the free queue, new blocks come from the front
# (`vllm/v1/core/block_pool.py`, `free_blocks`), so a prefix survives until the blocks cached *since its last use* no
# longer fit beside it — with one partial block in use (uncached blocks are reused first) and the one block vLLM
# keeps as its "null block": **prefix + cached since + 1 + 1 ≤ pool**. For a known request order that is arithmetic
# (`paged.predicted_prefix_hits`); the smallest pool where every shared request hits is `paged.survival_budget`. The same requests (half shared-prefix, half unique, sent one after another) run on pools of
# several sizes — in whole blocks, each an engine of exactly that many — and the engine's counters say what happened.

# %%
traffic = paged.shared_prefix_traffic(tok, kvlab.pick(20, 12), 0.5, prefix_blocks * B, 40, 3 * B + 10, seed=4)
prefix_ids = next(ids[: prefix_blocks * B] for label, ids in traffic if label == "shared")
need = paged.survival_budget(traffic, prefix_blocks, B, output_tokens=2)
budgets = sorted({max(prefix_blocks + 2, need - 4), need - 1, need, need + 4})
print(f"prefix {prefix_blocks} blocks; lesson 01's arithmetic: every shared request hits from {need} blocks "
      f"({need * B:,} tokens, {paged.pool_blocks(need, len(groups)) * cap.bytes_per_block / 2**20:.1f} MiB) up")
budget_runs, engine_rows, budget_events = paged.budget_sweep(traffic, budgets, prefix_ids, B, cap.bytes_per_block, 2,
                                                             (prefix_blocks + 1) * B, subscriber=sub, enforce_eager=True,
                                                             group=full, groups=len(groups))
by_budget = paged.budget_table(budget_runs, engine_rows, B, cap.bytes_per_block, len(groups)).set_index("budget_blocks")
by_budget[["budget_tokens", "budget_mib", "token_hit_rate", "shared_requests", "prefix_hits", "predicted_hits",
           "shared_ttft_p50_ms", "shared_ttft_p95_ms", "prefix_blocks_evicted"]].round(3)

# %%
fig = kvlab.paged.hit_rate_by_budget(by_budget.reset_index(), need)
fig.show()

# %% [markdown]
# The events and the engine's counters tell the same story, per budget: every request stores its full computed blocks
# except those it found cached (the hit counter), and every eviction (`BlockRemoved`) is a block the pool handed out
# again — vLLM's own block-residency histogram (`kv_cache_metrics=True`), which also counts uncached partial blocks.

# %%
checked = budget_runs[budget_runs.label == "shared"].dropna(subset=["predicted_hit"])
agree = (checked.predicted_hit.astype(bool) == checked.hit).mean()
by_budget[["engine_hit_tokens", "cached_tokens", "stored_events", "expected_stored", "removed_events", "reallocated_blocks",
           "idle_before_evict_p50_s"]]

# %%
hit_rates = by_budget.token_hit_rate
print(f"the arithmetic predicted {agree:.0%} of {len(checked)} shared requests' hit or miss; hit rate "
      f"{hit_rates.iloc[0]:.0%} at {budgets[0]} blocks → {hit_rates.iloc[-1]:.0%} at {budgets[-1]}")
assert (by_budget.engine_hit_tokens == by_budget.cached_tokens).all() and (by_budget.stored_events == by_budget.expected_stored).all()
assert (by_budget.removed_events <= by_budget.reallocated_blocks).all()
assert hit_rates.iloc[0] < hit_rates.iloc[-1]
assert by_budget.prefix_hits.loc[need] == by_budget.shared_requests.loc[need] - 1  # all but the cold first one

# %% [markdown]
# ## 6. Preemption: more sequences than the pool holds
#
# Twelve sequences submitted together into a 13-block pool (12 usable: one is the null block), each with a prompt of
# 2 blocks minus 8 tokens that grows past its second block while decoding. The scheduler admits as many as have
# blocks for their prompts; when a running one needs its next block and none is free, the scheduler preempts
# **another** running request — the most recently admitted (under priority scheduling: the lowest-priority, latest) —
# unless the one asking is itself that request (`vllm/v1/core/sched/scheduler.py`, `Scheduler.schedule`). The victim's
# blocks go back to the free queue, but its full blocks keep their hashes there (prefix caching is on), so when it is
# admitted again some of its tokens are prefix-cache hits and only the rest is recomputed: the scheduler's own stats
# count both (`PrefixCacheStats.preempted_queries`, `preempted_hits`; vLLM's Prometheus counters leave them out, so
# `paged.PreemptedHits` listens to the engine's steps). Then the same work with `max_num_seqs` set to the number that
# fits — lesson 01's arithmetic: usable blocks ÷ blocks per sequence.

# %%
seq_blocks, pre_pool, n_seqs = 3, 13, 12
prompt_t, out_t = 2 * B - 8, 24  # 2 blocks at admission, a third one after 9 output tokens
fits = (pre_pool - paged.RESERVED_BLOCKS) // seq_blocks
runs = {}
for name, extra in {"max_num_seqs default": {}, f"max_num_seqs = {fits}": {"max_num_seqs": fits}}.items():
    eng = paged.engine_with_blocks(pre_pool, B, cap.bytes_per_block, max_model_len=seq_blocks * B, groups=len(groups),
                                   enforce_eager=True, **extra)
    runs[name] = paged.preemption_run(eng, n_seqs, prompt_t, out_t).assign(setting=name)
    kvlab.close_engine(eng)
pre = pd.concat(runs.values(), ignore_index=True)
pre.groupby("setting").agg(sequences=("e2e_s", "size"), preempted=("preemptions", lambda s: int((s > 0).sum())),
                           preemptions=("preemptions", "sum"), e2e_p50_s=("e2e_s", "median"), e2e_max_s=("e2e_s", "max")).round(2)

# %%
default, capped = runs["max_num_seqs default"], runs[f"max_num_seqs = {fits}"]
print(f"({pre_pool} − {paged.RESERVED_BLOCKS}) blocks ÷ {seq_blocks} blocks per sequence = {fits} sequences fit; default: {int(default.preemptions.sum())} "
      f"preemptions; max_num_seqs = {fits}: {int(capped.preemptions.sum())}")
if (default.preemptions > 0).any():  # a preempted request's stream stalls while it waits and its KV is recomputed
    hit, spared = default[default.preemptions > 0], default[default.preemptions == 0]
    print(f"preempted requests: TPOT median {hit.tpot_s.median() * 1e3:.0f} ms vs {spared.tpot_s.median() * 1e3:.0f} ms for the "
          f"others; all {n_seqs} done after {default.e2e_s.max():.2f} s vs {capped.e2e_s.max():.2f} s with max_num_seqs = {fits}")
assert default.preemptions.sum() > 0 and capped.preemptions.sum() == 0
again = default.iloc[0]
print(f"re-admissions: {again.run_readmissions}; they looked up {again.run_readmitted_tokens:,} tokens: "
      f"{again.run_readmitted_hit_tokens:,} were prefix-cache hits, {again.run_readmitted_tokens - again.run_readmitted_hit_tokens:,} recomputed")
assert again.run_readmissions >= 1 and 0 <= again.run_readmitted_hit_tokens <= again.run_readmitted_tokens

# %%
sub.close()
print(f"subscriber closed; its socket folder is gone: {not sub.folder.exists()}")

# %% [markdown]
# ## Summary
#
# Written from this run's numbers:

# %%
from IPython.display import Markdown

Markdown(f"""
- A prompt of {len(ids)} tokens stored **{len(stored)} blocks** of {B} tokens; the partial last block was never cached,
  and the engine's hit counter ({hits:.0f} tokens) equals the stored blocks × {B}.
- Two prompts sharing 2 blocks stored them once: 4 blocks for 2 requests; the second request's own block chains onto
  the last shared one.
- In a {pool_blocks}-block pool, a {prefix_blocks}-block prefix that kept being used survived every unique request
  (the unique blocks were evicted instead); with unique traffic only it was evicted ({len(prefix_removed)} blocks), and
  the next shared request found {last.cached_tokens} cached tokens.
- On the same traffic, the engine's token hit rate went {hit_rates.iloc[0]:.0%} at
  {budgets[0]} blocks → {hit_rates.iloc[-1]:.0%} at {budgets[-1]}; the arithmetic (prefix + blocks
  cached since its last use + 2) said every shared request hits from **{need} blocks**, and called {agree:.0%} of the
  shared requests' hits and misses right. Shared-prefix TTFT p95: {by_budget.shared_ttft_p95_ms.iloc[0]:.0f} →
  {by_budget.shared_ttft_p95_ms.iloc[-1]:.0f} ms.
- {n_seqs} sequences of {seq_blocks} blocks in a {pre_pool}-block pool: **{int(default.preemptions.sum())} preemptions**;
  with max_num_seqs = {fits} (usable blocks ÷ blocks per sequence): {int(capped.preemptions.sum())}; the whole batch took
  {default.e2e_s.max():.2f} s with preemptions and {capped.e2e_s.max():.2f} s without.
""")

# %% [markdown]
# ## Exercises
#
# 1. In section 2, change the prompt to exactly 3 blocks. How many blocks are stored, and how many tokens does the
#    second request find cached? (lesson 03 said a request never reuses its *whole* prompt — why?)
# 2. In section 4, make the pool 16 blocks. Does the prefix survive phase 2 now? Work out with section 5's arithmetic
#    how many unique requests it takes to evict it, then check with `paged.predicted_prefix_hits`.
# 3. In section 6, what does preemption cost the preempted requests (their TPOT) and the batch as a whole — and what
#    does the `max_num_seqs` cap cost the requests that wait for a slot instead?
