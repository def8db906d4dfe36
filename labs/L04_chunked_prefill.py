# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab L04 · Chunked prefill
#
# Decoders stream from t = 0; a long prompt arrives mid-stream. One engine per configuration: chunked prefill off, and
# on with each token budget in `budgets`. Reports, per configuration, the long prompt's TTFT and the decoders'
# inter-token gaps (p50/p95/max) while it was prefilled.
#
# Headless: `papermill --engine kvlab labs/L04_chunked_prefill.ipynb out.ipynb --cwd labs -y "budgets: [128, 512]" -p long_prompt_tokens 4096`.
# Writes `results.csv/.parquet` (one row per configuration), `tokens.parquet` (every token of every run), `metadata.json`
# and `tradeoff.html`.

# %% tags=["parameters"]
model = ""  # Hugging Face id or local folder; empty: KVLAB_MODEL or the course model
decoders = 3  # chat requests streaming from the start
decoder_prompt_tokens = 64  # prompt tokens of each decoder
decoder_output_tokens = 48  # output tokens of each decoder
long_prompt_tokens = 2048  # tokens of the long prompt
long_arrival_s = 0.5  # when the long prompt arrives, seconds after the start
budgets = [256, 1024]  # max_num_batched_tokens values to try with chunked prefill on (tokens per step)
output_dir = ""  # where results go; empty: build/labs/L04_chunked_prefill

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()
p = kvlab.labs.validate_namespace("L04_chunked_prefill", globals())  # checks every parameter; applies quick mode's sizes

# %% [markdown]
# ## Run

# %%
import pandas as pd
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from kvlab import chunked_prefill, workload

tok = AutoTokenizer.from_pretrained(kvlab.resolve_model(p.model or None))
configs = {"chunked off": {"enable_chunked_prefill": False}}
configs |= {f"chunks of {b}": {"enable_chunked_prefill": True, "max_num_batched_tokens": b} for b in p.budgets}
rows, all_tokens = [], []
for name, args in tqdm(configs.items(), desc="configurations"):
    llm = kvlab.make_engine(p.model or None, enforce_eager=True, **args)
    arrivals = chunked_prefill.interference_arrivals(tok, p.decoders, p.decoder_prompt_tokens, p.decoder_output_tokens, p.long_prompt_tokens, p.long_arrival_s)
    tokens, reqs = workload.run_workload(llm, arrivals)
    rows.append({"config": name, "max_num_batched_tokens": args.get("max_num_batched_tokens", 0)} | chunked_prefill.interference_summary(tokens, reqs))
    all_tokens.append(tokens.assign(config=name))
    kvlab.close_engine(llm)
results = pd.DataFrame(rows)
results.round(1)

# %%
fig = chunked_prefill.tradeoff(results)
fig.show()

# %% [markdown]
# ## Save

# %%
out = kvlab.labs.output_dir("L04_chunked_prefill", p.output_dir)
kvlab.results.save_results(results, out, p, engine_settings={"configs": {k: str(v) for k, v in configs.items()}},
                           tables={"tokens.parquet": pd.concat(all_tokens)}, figures={"tradeoff.html": fig})
print(f"wrote {len(results)} configurations to {out}")

# %% [markdown]
# ## Exercises
#
# Answer from **your** numbers above — the tables, the plot, the files in `out` — not from the lessons' prose. Put each
# answer in `answers` and run the check: it says whether your reading agrees with this run's data (and, if not, where
# to look), without giving the answer away.

# %%
kvlab.exercises.show("L04")

# %%
answers = {"L04.1": None, "L04.2": None}  # replace None with your answers
kvlab.exercises.check(answers, out)

# %% [markdown]
# ## More to try
#
# 1. Which budget keeps the decoders' p95 gap under twice their normal pace? What does it cost the long prompt?
# 2. Plot `decoder_itl_max_ms` against `max_num_batched_tokens`. Is it linear? Why (or why not)?
