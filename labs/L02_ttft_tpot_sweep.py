# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab L02 · TTFT and TPOT sweep
#
# Prompt lengths × output lengths × repeats on one engine, each request cold (prefix caching off), warm-up first.
# Every request is set against this machine's limits (matmul FLOP/s for prefill, memory bandwidth for decode).
#
# Headless: `papermill --engine kvlab labs/L02_ttft_tpot_sweep.ipynb out.ipynb --cwd labs -y "prompt_lengths: [256, 2048]" -p enforce_eager False`.
# Writes `results.csv/.parquet` (one row per request), `summary.csv` (medians and p95 per point), `metadata.json`
# (parameters, machine, engine settings, measured limits) and `ttft_tpot.html`.

# %% tags=["parameters"]
model = ""  # Hugging Face id or local folder; empty: KVLAB_MODEL or the course model
prompt_lengths = [128, 512, 1024, 2048]  # prompt tokens per request
output_lengths = [32]  # output tokens per request (exact: end-of-sequence is ignored)
repeats = 3  # timed requests per (prompt, output) point, after one warm-up
dtype = "auto"  # model dtype: auto (the machine's choice: bfloat16 on a CPU with native bf16, else float32), float32, bfloat16, float16
enforce_eager = True  # True: no torch.compile (fast start); False: compiled (faster decode, slow first start)
kv_cache_gib = 1.0  # KV cache budget, GiB
output_dir = ""  # where results go; empty: build/labs/L02_ttft_tpot_sweep

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()
p = kvlab.labs.validate_namespace("L02_ttft_tpot_sweep", globals())  # checks every parameter; applies quick mode's sizes

# %% [markdown]
# ## Run

# %%
from kvlab import prefill_decode, roofline, timing

engine_args = dict(enable_prefix_caching=False, enforce_eager=p.enforce_eager, kv_cache_gib=p.kv_cache_gib)
if p.dtype != "auto":
    engine_args["dtype"] = p.dtype
limits = roofline.measure_limits(None if p.dtype == "auto" else p.dtype, quick=kvlab.quick(), model=p.model or None)  # fresh process; again after
llm = kvlab.make_engine(p.model or None, **engine_args)
cost = roofline.engine_cost(llm)
settings = {"model": llm.kvlab_settings["model"], "dtype": kvlab.engine.engine_dtype(llm), "enforce_eager": p.enforce_eager}
runs = prefill_decode.sweep(llm, p.prompt_lengths, p.output_lengths, p.repeats, **settings)
limits = roofline.best_of(limits, roofline.measure_limits(limits.dtype, quick=kvlab.quick(), model=p.model or None))
runs = roofline.add_bounds(runs, cost, limits)
summary = timing.summarize(runs, ["ttft_s", "tpot_s", "e2e_s", "ttft_over_bound", "tpot_over_bound"], by=["prompt_tokens", "output_tokens"])
summary.round(4)

# %%
fig = kvlab.prefill_decode.metric_vs_prompt(summary[summary.output_tokens == p.output_lengths[0]].merge(
    runs.groupby("prompt_tokens", as_index=False).ttft_bound_s.median()), "ttft_s", "ttft_bound_s",
    f"TTFT vs prompt length ({settings['dtype']}, {'eager' if p.enforce_eager else 'compiled'})", "TTFT (ms)")
fig.show()

# %% [markdown]
# ## Save

# %%
out = kvlab.labs.output_dir("L02_ttft_tpot_sweep", p.output_dir)
kvlab.results.save_results(runs, out, p, engine_settings=llm.kvlab_settings | {"limits": limits.as_dict()},
                           tables={"summary.csv": summary}, figures={"ttft_tpot.html": fig})
kvlab.close_engine(llm)
print(f"wrote {len(runs)} requests to {out}")

# %% [markdown]
# ## Exercises
#
# Answer from **your** numbers above — the tables, the plot, the files in `out` — not from the lessons' prose. Put each
# answer in `answers` and run the check: it says whether your reading agrees with this run's data (and, if not, where
# to look), without giving the answer away.

# %%
kvlab.exercises.show("L02")

# %%
answers = {"L02.1": None, "L02.2": None, "L02.3": None}  # replace None with your answers
kvlab.exercises.check(answers, out)

# %% [markdown]
# ## More to try
#
# 1. Which column of `summary.csv` grows with the prompt and which does not? Put a number on each.
# 2. Run the lab twice, with `enforce_eager` True and False. Which metric does compilation improve, and by how much?
# 3. The TTFT bound is the larger of compute time and weight-read time (`ttft_bound_kind` says which). Run with
#    `prompt_lengths` that start below the length where prefill turns compute-bound on this machine (lesson 02 prints
#    it: ridge point × bytes per weight ÷ 2). Is `ttft_over_bound` at the short prompts close to 1? What would it be on
#    a GPU, where that length is ~300 tokens?
