# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab L05 · Batch sweep
#
# Offline batches of B distinct prompts, each with exactly the same prompt and output length: TTFT and TPOT (median,
# p95), decode throughput (B ÷ TPOT), output throughput (prefill included) and preemptions, per batch size.
#
# Headless: `papermill --engine kvlab labs/L05_batch_sweep.ipynb out.ipynb --cwd labs -y "batch_sizes: [1, 8, 64]" -p kv_cache_gib 0.25`.
# Writes `results.csv/.parquet` (one row per request), `summary.csv` (one row per batch size), `metadata.json` and
# `throughput.html`.

# %% tags=["parameters"]
model = ""  # Hugging Face id or local folder; empty: KVLAB_MODEL or the course model
batch_sizes = [1, 4, 16, 32]  # sequences submitted together
prompt_tokens = 128  # prompt tokens per sequence
output_tokens = 32  # output tokens per sequence (exact)
repeats = 2  # batches per size, after one warm-up batch
kv_cache_gib = 1.0  # KV cache budget, GiB (small values cap the batch: see preemptions)
enforce_eager = True  # True: no torch.compile; False: compiled (slow first start)
output_dir = ""  # where results go; empty: build/labs/L05_batch_sweep

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()
p = kvlab.labs.validate_namespace("L05_batch_sweep", globals())  # checks every parameter; applies quick mode's sizes

# %% [markdown]
# ## Run

# %%
from kvlab import batching

llm = kvlab.make_engine(p.model or None, enable_prefix_caching=False, enforce_eager=p.enforce_eager, kv_cache_gib=p.kv_cache_gib,
                        max_model_len=max(1024, p.prompt_tokens + p.output_tokens))
capacity = kvlab.kv_capacity(llm)
runs = batching.batch_sweep(llm, p.batch_sizes, p.prompt_tokens, p.output_tokens, p.repeats)
summary = batching.batch_summary(runs)
# how many sequences the KV budget holds at once: each rounds up to whole blocks (160 tokens take 256 with 128-token blocks)
fit = kvlab.sizing.sequences_that_fit(capacity.num_blocks, capacity.block_size, p.prompt_tokens + p.output_tokens)
summary["fit_at_once"] = fit
print(f"{capacity}; a {p.prompt_tokens + p.output_tokens}-token sequence takes "
      f"{kvlab.sizing.blocks_needed(p.prompt_tokens + p.output_tokens, capacity.block_size)} blocks → {fit} sequences at once")
summary.round(3)

# %%
import plotly.express as px

fig = px.line(summary, x="batch_size", y=["decode_tok_s", "output_tok_s"], markers=True, log_x=True,
              title=f"Throughput vs batch size ({capacity.tokens:,} tokens of KV)", labels={"value": "tokens per second", "variable": ""})
fig.show()

# %% [markdown]
# ## Save

# %%
out = kvlab.labs.output_dir("L05_batch_sweep", p.output_dir)
kvlab.results.save_results(runs, out, p, engine_settings=llm.kvlab_settings | {"kv_capacity": capacity.as_dict()},
                           tables={"summary.csv": summary}, figures={"throughput.html": fig})
kvlab.close_engine(llm)
print(f"wrote {len(runs)} requests to {out}")

# %% [markdown]
# ## Exercises
#
# Answer from **your** numbers above — the tables, the plot, the files in `out` — not from the lessons' prose. Put each
# answer in `answers` and run the check: it says whether your reading agrees with this run's data (and, if not, where
# to look), without giving the answer away.

# %%
kvlab.exercises.show("L05")

# %%
answers = {"L05.1": None, "L05.2": None}  # replace None with your answers
kvlab.exercises.check(answers, out)

# %% [markdown]
# ## More to try
#
# 1. At which batch size does decode throughput stop doubling when the batch doubles?
# 2. Lower `kv_cache_gib` until `preemptions` appear. Compare that batch size with `fit_at_once` — and with the naive
#    `capacity.tokens ÷ (prompt + output)`, which forgets that every sequence rounds up to whole blocks.
