# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab L08 · KV budget: how much cache does a shared prefix need to survive?
#
# The same traffic — a share of requests starting with one shared prefix (a system prompt), the rest unique prompts —
# runs on engines whose KV pool is exactly a given number of blocks (lesson 08). Per budget: the engine's prefix-cache
# hit rate, how many shared requests found the prefix cached (and whether lesson 08's arithmetic predicted it), their
# TTFT p50/p95, and every block stored and evicted from the engine's KV cache events. The events are checked against the
# engine's counters: blocks stored = full blocks computed − blocks hit; BlockRemoved events ≤ blocks the pool handed out
# again (vLLM's `kv_block_lifetime_seconds` histogram).
#
# By default the budgets are multiples of the *survival budget* — the smallest pool where every shared request hits,
# computed from the traffic — so the defaults straddle the interesting point on any model and block size;
# `budget_unit="blocks"`, `"tokens"` or `"GiB"` take absolute sizes.
#
# Headless: `papermill --engine kvlab labs/L08_kv_budget.ipynb out.ipynb --cwd labs -p shared_share 0.3 -p concurrency 4`.
# Writes `results.csv/.parquet` (one row per request and budget), `budgets.csv` (one row per budget), `events.csv` (the
# engine's KV cache events, one row per block), `metadata.json` and `hit_rate.html`.

# %% tags=["parameters"]
model = ""  # Hugging Face id or local folder; empty: KVLAB_MODEL or the course model
budgets = [0.6, 0.8, 0.9, 1.0, 1.25]  # KV budgets to run, in budget_unit (each rounded down to whole blocks)
budget_unit = "survival"  # 'survival': multiples of the smallest pool where every shared request hits (computed from the traffic: fits any model and block size); 'blocks', 'tokens' or 'GiB'
shared_prefix_tokens = 512  # tokens of the shared prefix (a system prompt); whole blocks of it are shared
shared_share = 0.5  # share (0-1) of requests that start with the shared prefix
suffix_tokens = 40  # tokens after the shared prefix, different in every shared request
unique_prompt_tokens = 400  # tokens of each unique (no shared prefix) prompt
requests = 20  # requests per budget (the same traffic on every budget)
output_tokens = 2  # output tokens per request (exact)
concurrency = 1  # requests submitted together; 1: one after another (the LRU prediction holds only then)
seed = 4  # order of shared and unique requests
enforce_eager = True  # True: no torch.compile; False: compiled (slow first start)
output_dir = ""  # where results go; empty: build/labs/L08_kv_budget

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()
p = kvlab.labs.validate_namespace("L08_kv_budget", globals())  # checks every parameter; applies quick mode's sizes

# %% [markdown]
# ## The pool's geometry and the traffic
#
# The traffic is checked against the model's context before any engine starts. One short-lived engine reads the block
# size and the bytes one token's KV costs (lesson 01); budgets are then whole blocks, printed next to that arithmetic.

# %%
import pandas as pd

from kvlab import paged

longest = paged.check_traffic(p.shared_prefix_tokens, p.suffix_tokens, p.unique_prompt_tokens, p.output_tokens,
                              kvlab.model.max_context(p.model or None))
probe = kvlab.make_engine(p.model or None, enforce_eager=p.enforce_eager, max_model_len=longest)
cap, tok, groups = kvlab.kv_capacity(probe), probe.get_tokenizer(), kvlab.kv_groups(probe)
kvlab.close_engine(probe)
n_groups = len(groups)  # a budget counts blocks in every KV cache group (paged.pool_blocks); events: a full-attention one
full = int(groups[groups.full_attention].group.min()) if groups.full_attention.any() else 0
B = cap.block_size
prefix_blocks = paged.prefix_blocks_of(p.shared_prefix_tokens, B)
traffic = paged.shared_prefix_traffic(tok, p.requests, p.shared_share, prefix_blocks * B, p.suffix_tokens,
                                      p.unique_prompt_tokens, seed=p.seed)
prefix_ids = next((ids[: prefix_blocks * B] for label, ids in traffic if label == "shared"), [])
survival = paged.survival_budget(traffic, prefix_blocks, B, p.output_tokens)
pools = paged.to_blocks(p.budgets, p.budget_unit, B, cap.bytes_per_block, survival, n_groups)
for blocks in pools:  # one clear sentence for a budget too small, before any engine of the sweep starts
    paged.check_budget(blocks, B, longest)
kinds = pd.Series([label for label, _ in traffic]).value_counts().to_dict()
print(f"block size {B} tokens, {cap.bytes_per_token:,} B of KV per token ({cap.bytes_per_block:,} B per block); prefix {prefix_blocks} blocks; traffic: {kinds}")
print(f"survival budget (prefix + blocks cached since its last use + 1 partial + 1 null block): {survival} blocks")
pd.DataFrame({"budget_blocks": pools, "tokens": [b * B for b in pools],
              "MiB": [round(paged.pool_blocks(b, n_groups) * cap.bytes_per_block / 2**20, 2) for b in pools],
              "× survival": [round(b / survival, 2) for b in pools]})

# %% [markdown]
# ## The sweep: one engine per budget, the engine's events collected
#
# The event subscriber listens on a private `ipc://` socket and is closed after the sweep, whatever happens.

# %%
from kvlab import kvevents

with kvevents.Subscriber().start() as sub:
    results, engine, events = paged.budget_sweep(traffic, pools, prefix_ids, B, cap.bytes_per_block, p.output_tokens,
                                                 longest, subscriber=sub, concurrency=p.concurrency, model=p.model or None,
                                                 enforce_eager=p.enforce_eager, group=full, groups=n_groups)
table = paged.budget_table(results, engine, B, cap.bytes_per_block, n_groups)
table[["budget_blocks", "budget_tokens", "token_hit_rate", "shared_requests", "prefix_hits", "predicted_hits",
       "shared_ttft_p50_ms", "shared_ttft_p95_ms", "prefix_blocks_evicted", "removed_events"]].round(3)

# %%
fig = kvlab.paged.hit_rate_by_budget(table, survival, title=f"{prefix_blocks}-block shared prefix, "
                                     f"{p.shared_share:.0%} of {p.requests} requests: hit rate and TTFT against the KV budget")
fig.show()

# %% [markdown]
# ## Save, then cross-check the events against the engine's counters
#
# Results are written first, so a failed check keeps them.

# %%
settings = {"model": str(kvlab.model.resolve_model(p.model or None)), "block_size": B, "bytes_per_token": cap.bytes_per_token, "bytes_per_block": cap.bytes_per_block,
            "survival_blocks": survival, "budget_blocks": pools, "enforce_eager": p.enforce_eager}
out = kvlab.labs.output_dir("L08_kv_budget", p.output_dir)
kvlab.results.save_results(results, out, p, engine_settings=settings,
                           tables={"budgets.csv": table, "events.csv": events}, figures={"hit_rate.html": fig})
print(f"wrote {len(results)} requests on {len(pools)} budgets and {len(events)} events to {out}")

# %%
checks = table.assign(cached_tokens_agree=table.engine_hit_tokens == table.cached_tokens,
                      stored_agree=table.stored_events == table.expected_stored,
                      removed_within_reallocated=table.removed_events <= table.reallocated_blocks)
print(checks[["budget_blocks", "engine_hit_tokens", "cached_tokens", "stored_events", "expected_stored",
              "removed_events", "reallocated_blocks"]].to_string(index=False))
assert checks.cached_tokens_agree.all() and checks.removed_within_reallocated.all()
if p.concurrency == 1:  # submitted together, two requests may compute the same block before either stores it
    assert checks.stored_agree.all()
else:
    print(f"concurrency {p.concurrency}: stored events vs full blocks computed − hit is shown, not asserted")

# %% [markdown]
# ## Exercises
#
# Answer from **your** numbers above — the tables, the plot, the files in `out` — not from the lessons' prose. Put each
# answer in `answers` and run the check: it says whether your reading agrees with this run's data (and, if not, where
# to look), without giving the answer away.

# %%
kvlab.exercises.show("L08")

# %%
answers = {"L08.1": None, "L08.2": None, "L08.3": None, "L08.4": None}  # replace None with your answers
kvlab.exercises.check(answers, out)

# %% [markdown]
# ## More to try
#
# 1. Run with `concurrency=4`. Does the prefix need a larger pool to survive when requests overlap — and why (lesson
#    08: blocks in flight)?
# 2. Halve `shared_share`. The prefix is used less often: how does the survival budget move, and the hit rate at the
#    smallest budget?
# 3. Give the budgets in GiB (`budget_unit="GiB"`) for a model of your own. How many GiB does its system prompt need
#    to survive your traffic?
