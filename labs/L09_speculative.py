# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab L09 · Speculative decoding: acceptance, speed-up, and where it stops paying
#
# n-gram (prompt lookup) speculation, as in lesson 09: per task and k, the engine's acceptance rate
# (`vllm:spec_decode_num_accepted_tokens` ÷ `…_num_draft_tokens`), TPOT and E2E with speculation off and on (median
# and p95), whether the greedy answers stay identical token for token, and the gain as the batch grows. Each k is its
# own engine (the speculative config is fixed at start-up); k = 0 (off) always runs as the baseline.
#
# Headless: `papermill --engine kvlab labs/L09_speculative.ipynb out.ipynb --cwd labs -p ks "[1, 3, 5]" -y "tasks: [edit, chat]"`.
# Writes `results.csv/.parquet` (one row per request, task, k and repeat), `summary.csv` (per task and k: TPOT p50/p95,
# E2E p50, acceptance, speed-up), `batches.csv` and `batch_summary.csv` (the batch runs), `metadata.json` and
# `speedup.html`.

# %% tags=["parameters"]
model = ""  # Hugging Face id or local folder; empty: KVLAB_MODEL or the course model
tasks = ["edit", "code", "chat"]  # tasks to run: 'edit' (fix a paragraph), 'code' (type-hint a function), 'chat' (open questions)
ks = [2, 4, 8]  # proposed tokens per step (k) to compare with speculation off
prompt_lookup_min = 2  # shortest n-gram the proposer matches (tokens)
prompt_lookup_max = 4  # longest n-gram the proposer matches (tokens)
requests = 4  # distinct requests per task (each alone, streamed)
repeats = 1  # times each task's requests are run
output_tokens = 96  # most output tokens per request (greedy, stops at end of text)
batch_sizes = [1, 4, 8, 16]  # batch sizes for the gain-vs-batch run (edit task, largest k vs off)
batch_output_tokens = 64  # output tokens per request in the batch runs (exact)
seed = 0  # which paragraphs, functions and questions the tasks use
enforce_eager = True  # True: no torch.compile; False: compiled (slow first start)
output_dir = ""  # where results go; empty: build/labs/L09_speculative

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()
p = kvlab.labs.validate_namespace("L09_speculative", globals())  # checks every parameter; applies quick mode's sizes

# %% [markdown]
# ## Run: speculation off, then one engine per k
#
# The batch runs (the edit task's prompts submitted together) use speculation off and the largest k.

# %%
import pandas as pd

from kvlab import speculative

out = kvlab.labs.output_dir("L09_speculative", p.output_dir)
runs, batches, settings = [], [], {}
edit = speculative.task_messages("edit", 4, p.seed)  # the batch runs reuse these four prompts
for k in [0, *p.ks]:
    llm = kvlab.make_engine(p.model or None, enforce_eager=p.enforce_eager, max_model_len=2048,
                            **speculative.ngram_config(k, p.prompt_lookup_min, p.prompt_lookup_max))
    try:
        runs.append(speculative.time_tasks(llm, p.tasks, p.requests, p.output_tokens, p.repeats, p.seed, k=k))
        if k in (0, max(p.ks)):
            prompts = [kvlab.runtime.templates.chat_template_ids(llm.get_tokenizer(), m) for m in edit]
            batches.append(speculative.batch_run(llm, prompts, p.batch_sizes, p.batch_output_tokens, k=k))
        settings[f"k={k}"] = llm.kvlab_settings
    finally:
        kvlab.close_engine(llm)
runs = pd.concat(runs, ignore_index=True)
summary = speculative.speedups(runs)
summary.round(3)

# %%
import plotly.express as px

spec = summary[summary.k > 0]
fig = px.scatter(spec, x="acceptance_rate", y="speedup", color="task", symbol=spec.k.astype(str),
                 labels={"acceptance_rate": "acceptance rate (accepted ÷ proposed tokens)",
                         "speedup": "TPOT speed-up (off ÷ on)", "symbol": "k"},
                 title="Speed-up against acceptance rate, one point per task × k")
fig.update_traces(marker_size=12)
fig.add_hline(y=1, line_dash="dot", annotation_text="no gain")
fig.show()

# %% [markdown]
# ## Same answers, and the gain as the batch grows

# %%
same = pd.concat([speculative.same_outputs(runs[runs.k == 0], runs[runs.k == k]).assign(k=k) for k in p.ks],
                 ignore_index=True)
results = speculative.tidy(runs).merge(same[["task", "request", "repeat", "k", "identical", "first_difference"]],
                                       on=["task", "request", "repeat", "k"], how="left")
results["identical"] = results.identical.fillna(True).astype(bool)  # k = 0 is the reference itself
batch_runs = pd.concat(batches, ignore_index=True)
batch_summary = speculative.speedups(batch_runs, by=("batch_size",))
dtype = kvlab.hardware.model_dtype()[0]
print(f"{int(same.identical.sum())} of {len(same)} answers identical token for token with speculation ({dtype}; the "
      "verify pass rounds differently from single steps, so in 16-bit formats near-ties flip more often than in float32)")
batch_summary.round(3)

# %% [markdown]
# ## Save

# %%
kvlab.results.save_results(results, out, p, engine_settings=settings,
                           tables={"summary.csv": summary, "batches.csv": batch_runs, "batch_summary.csv": batch_summary},
                           figures={"speedup.html": fig})
print(f"wrote {len(results)} requests ({len(p.tasks)} tasks × {len(p.ks) + 1} settings) to {out}")

# %% [markdown]
# ## Exercises
#
# Answer from **your** numbers above — the tables, the plot, the files in `out` — not from the lessons' prose. Put each
# answer in `answers` and run the check: it says whether your reading agrees with this run's data (and, if not, where
# to look), without giving the answer away.

# %%
kvlab.exercises.show("L09")

# %%
answers = {"L09.1": None, "L09.2": None, "L09.3": None, "L09.4": None}  # replace None with your answers
kvlab.exercises.check(answers, out)

# %% [markdown]
# ## More to try
#
# 1. Run with `prompt_lookup_min=1`. Does acceptance on chat rise — and TPOT with it?
# 2. Run `tasks=["code"]` with `ks=[1, 2, 3, 4, 6, 8, 12]`: where does the speed-up stop growing with k, and why?
# 3. With a model of your own on a GPU, what batch size makes speculation stop paying?
