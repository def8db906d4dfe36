# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab L01 · Capacity planning
#
# How many sequences of a given context length fit on a card, and what is the longest context for a target number
# of concurrent users? Pure arithmetic from the model's `config.json` (lesson 01 proves it against a live engine),
# so this lab runs in seconds for any model, card and dtype. The numbers are **upper bounds**: the engine measures its
# real overhead when it starts, and reserves more than the window for sliding-window layers (lesson 01, section 5;
# `kvlab.sizing.vllm_kv_plan` gives the engine's own arithmetic).
#
# Run it headless: `papermill --engine kvlab labs/L01_capacity_planning.ipynb out.ipynb -p model Qwen2.5-7B-Instruct -y "memory_gib: [24, 80]"`.
# Results: `results.csv`, `results.parquet`, `metadata.json` and `capacity.html` in `output_dir`.

# %% tags=["parameters"]
model = "Llama-3.1-8B"  # preset name in data/models/, or a path to a config.json or a model folder
memory_gib = [80.0, 141.0]  # accelerator memory per card, GiB
utilization = 0.92  # fraction of memory the engine may use (vLLM's gpu_memory_utilization; 0.92 is vLLM's default), 0-1
overhead_gib = 1.5  # memory a running engine needs besides weights and KV (activations, CUDA graphs), GiB
context_lengths = [4096, 8192, 32768, 131072]  # tokens per sequence
kv_dtype = "bf16"  # KV cache element type: fp32, fp16, bf16 or fp8
weight_dtype = "bf16"  # weight element type: fp32, fp16, bf16, fp8 or int4
block_size = 16  # tokens per KV block (vLLM: 16 on GPU, 128 on CPU)
target_sequences = 16  # concurrent sequences to find the largest context for
output_dir = ""  # where results go; empty: build/labs/L01_capacity_planning

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()
p = kvlab.labs.validate_namespace("L01_capacity_planning", globals())  # checks every parameter; applies quick mode's sizes

# %% [markdown]
# ## Plan every card × context

# %%
from kvlab import sizing

arch = sizing.load_arch(p.model)
results = sizing.kv_capacity_grid([p.model], p.memory_gib, p.context_lengths, p.utilization, p.kv_dtype, p.weight_dtype, p.block_size,
                               p.target_sequences, p.overhead_gib)
results = results.assign(model=arch.name)
results[["memory_gib", "context", "weight_gib", "kv_budget_gib", "kv_tokens", "max_sequences", "largest_context_for_target", "beyond_model_context"]].round(2)

# %%
fig = kvlab.sizing.kv_capacity_lines(results)
fig.show()

# %% [markdown]
# ## Save

# %%
out = kvlab.labs.output_dir("L01_capacity_planning", p.output_dir)
kvlab.results.save_results(results, out, p, figures={"capacity.html": fig})
print(f"wrote {len(results)} rows to {out}")

# %% [markdown]
# ## Exercises
#
# Answer from **your** numbers above — the tables, the plot, the files in `out` — not from the lessons' prose. Put each
# answer in `answers` and run the check: it says whether your reading agrees with this run's data (and, if not, where
# to look), without giving the answer away.

# %%
kvlab.exercises.show("L01")

# %%
answers = {"L01.1": None, "L01.2": None}  # replace None with your answers
kvlab.exercises.check(answers, out)

# %% [markdown]
# ## More to try
#
# 1. At which context does the model fit fewer than `target_sequences` on the smallest card? Compare with
#    `largest_context_for_target`.
# 2. Re-run with `kv_dtype="fp8"`. Which column doubles, and which does not change?
# 3. Re-run with `weight_dtype="int4"`: how much KV budget do quantized weights free on the smallest card?
