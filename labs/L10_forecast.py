# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab L10 · Predict, then measure
#
# As in lesson 10: the step model is calibrated on this machine (the short sweep), vLLM's own scheduler is driven with
# it over a held-out grid — unloaded prompts, batches, a long prompt arriving during decodes at each chunked-prefill
# budget, shared-prefix traffic, Poisson arrivals at fractions of the forecast capacity, the other course model — and
# every prediction is written to `predictions.csv` **before** the grid runs. Then the grid is measured and scored.
# The n-gram speculation point is the one forecast made after its run: its drafts depend on the text the model writes,
# so it is predicted *given* the acceptance vLLM counted in that run (the `given` column says what was taken).
#
# Headless: `papermill --engine kvlab labs/L10_forecast.ipynb out.ipynb --cwd labs -y "budgets: [512, 128]" -p ttft_slo_x 2`.
# Writes `predictions.csv` + `predictions.json` (time and SHA-256, before measuring), `results.csv/.parquet` (the
# scorecard: one row per point and metric with predicted, measured, lo80, hi80, error, inside), `summary.csv` (per
# metric), `capacity.csv` (SLO met/missed, forecast vs measured, per rate), `error_budget.csv`, `machine_speed.csv` (each
# point's canaries: a point measured while the machine was busy is measured once more), `metadata.json` and
# `scorecard.html`.

# %% tags=["parameters"]
model = ""  # Hugging Face id or local folder; empty: KVLAB_MODEL or the course model
budgets = [512, 256]  # chunked-prefill budgets, tokens per step (the first is the main engine's)
prompt_lengths = [96, 384, 1536, 3072]  # prompt tokens of the unloaded points (each request alone)
batch_sizes = [6, 16]  # sequences submitted together in the batch points
batch_prompt_tokens = 384  # prompt tokens per sequence in the batch points
long_prompts = [1024, 2048]  # prompt tokens of the long request arriving during decodes
prefixes = [256, 1024]  # shared-prefix lengths of the prefix-caching points, tokens
rate_fractions = [0.4, 0.7, 0.95, 1.25]  # Poisson rates as fractions of the forecast capacity
poisson_requests = 24  # most requests per Poisson rate
poisson_window_s = 25.0  # each Poisson rate sends the requests that arrive in this many seconds (at least 8)
output_tokens = 24  # output tokens per request (exact)
ttft_slo_x = 3.0  # SLO: TTFT p90 within this many times the forecast unloaded TTFT
tpot_slo_x = 2.0  # SLO: TPOT p90 within this many times the forecast unloaded TPOT
second_model = True  # also forecast the other course model, never calibrated on
speculation_k = 4  # draft tokens per step of the n-gram speculation point (0: no speculation point)
enforce_eager = True  # True: no torch.compile; False: compiled (slow first start)
output_dir = ""  # where results go; empty: build/labs/L10_forecast

# %%
import pandas as pd

import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()
p = kvlab.labs.validate_namespace("L10_forecast", globals())  # checks every parameter; applies quick mode's sizes

# %% [markdown]
# ## Engines and calibration

# %%
from kvlab import forecast, roofline, scorecard, speculative, stepmodel
from kvlab.runtime import config

context = max(4096, max([*p.prompt_lengths, *p.long_prompts, *p.prefixes]) + p.output_tokens + 64)
keys = {("main" if i == 0 else f"budget {b}"): b for i, b in enumerate(p.budgets)}
engines = {k: kvlab.make_engine(p.model or None, max_model_len=context, max_num_batched_tokens=b,
                                enforce_eager=p.enforce_eager) for k, b in keys.items()}
if p.second_model:
    engines["second"] = kvlab.make_engine(scorecard.other_model(p.model or config.model_name()), max_model_len=context,
                                          max_num_batched_tokens=p.budgets[0], enforce_eager=p.enforce_eager)
if p.speculation_k:  # last: the n-gram proposer loads numba (docs/engine-notes.md)
    engines["spec"] = kvlab.make_engine(p.model or None, max_model_len=context, max_num_batched_tokens=p.budgets[0],
                                        enforce_eager=p.enforce_eager, **speculative.ngram_config(p.speculation_k))
setups = {k: forecast.setup_from_engine(llm) for k, llm in engines.items()}
toks = {k: llm.get_tokenizer() for k, llm in engines.items()}
shape = dict(prompt_lengths=p.prompt_lengths, batches=[(n, p.batch_prompt_tokens) for n in p.batch_sizes],
             budgets=keys, long_prompts=p.long_prompts, prefixes=p.prefixes, rate_fractions=p.rate_fractions,
             poisson_requests=p.poisson_requests, poisson_window_s=p.poisson_window_s,
             second_batches=[1, 8] if p.second_model else [], output_tokens=p.output_tokens,
             speculation_k=p.speculation_k)
scorecard.check_grid(scorecard.held_out_grid(toks, 1.0, **shape), setups)  # every request fits, before calibrating
model = stepmodel.calibrated(engines["main"])  # a saved calibration for this machine and settings, else a new one
model.describe().round(4)

# %% [markdown]
# ## Predictions, written before anything runs

# %%
models = {k: model for k in keys} | ({"second": model.for_model(roofline.engine_cost(engines["second"]))} if p.second_model else {})
models |= {"spec": model} if p.speculation_k else {}
objective = scorecard.relative_slo(setups["main"], toks["main"], model, p.ttft_slo_x, p.tpot_slo_x)
capacity = scorecard.capacity(setups["main"], toks["main"], model, objective, p.poisson_requests)["rate"]
grid = scorecard.held_out_grid(toks, capacity, **shape)
predictions, central = scorecard.predict_grid(grid, setups, models)
out = kvlab.labs.output_dir("L10_forecast", p.output_dir)
stamp = scorecard.write_predictions(predictions, grid, out)
print(f"SLO {objective.describe()}; forecast capacity {capacity:.2f} req/s; {len(predictions)} predictions for "
      f"{len(grid)} points written at {stamp['written_at']} (sha256 {stamp['sha256'][:16]}…)")

# %% [markdown]
# ## Measure and score

# %%
measured = scorecard.measure_grid(engines, grid, out, model=models["main"])
given, given_central = scorecard.predict_given_acceptance(grid, setups, models, measured)
central |= given_central
card = scorecard.score(pd.concat([predictions, given], ignore_index=True), measured)
summary = scorecard.summary(card)
calls, sustainable = scorecard.capacity_check(grid, measured, central, objective)
budget = scorecard.error_budget(card, measured, central, models, {g.name: g.engine for g in grid})
summary.round(3)

# %%
fig = scorecard.scatter(card)
fig.show()

# %% [markdown]
# ## Save

# %%
settings = {k: llm.kvlab_settings for k, llm in engines.items()}
kvlab.results.save_results(card, out, p, engine_settings=settings | {"slo": objective.as_dict(), "capacity_rps": capacity,
                                                                     "step_model": model.constants,
                                                                     "step_model_speed": model.speed, "predictions": stamp,
                                                                     "sustainable": sustainable},
                           tables={"summary.csv": summary, "capacity.csv": calls, "error_budget.csv": budget,
                                   "machine_speed.csv": scorecard.machine_speed(measured)},
                           figures={"scorecard.html": fig})
for llm in engines.values():
    kvlab.close_engine(llm)
print(f"wrote {len(card)} scored predictions to {out}")

# %% [markdown]
# ## Exercises
#
# Answer from **your** numbers above — the tables, the plot, the files in `out` — not from the lessons' prose. Put each
# answer in `answers` and run the check: it says whether your reading agrees with this run's data (and, if not, where
# to look), without giving the answer away.

# %%
kvlab.exercises.show("L10")

# %%
answers = {"L10.1": None, "L10.2": None, "L10.3": None}  # replace None with your answers
kvlab.exercises.check(answers, out)

# %% [markdown]
# ## More to try
#
# 1. Add a budget of 128 tokens. Which TTFT prediction moves most, and does the measurement follow?
# 2. Set `ttft_slo_x` to 1.5. How does the forecast capacity change, and were the SLO calls still right?
