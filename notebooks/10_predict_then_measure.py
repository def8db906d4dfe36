# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 10 · Predict, then measure — a forecast that scores itself
#
# The question you came with: *how many users will my model serve on this machine at my SLO, and why is my TTFT
# high?* Lessons 01–09 answered it by measuring. This lesson answers it **before** measuring, then checks the answer.
#
# The forecast has two parts you have already met. **vLLM's own scheduler** (the `Scheduler` class the engine runs,
# built from the engine's config and KV cache layout, with no weights) decides every step: which requests run, how
# many tokens each gets, where chunked prefill cuts, which blocks are prefix-cache hits, when someone is preempted.
# **Lesson 05's step-time model** — fixed cost, cost per sequence, FLOPs ÷ peak, bytes ÷ bandwidth — says how long each
# such step takes. The forecast never executes the model.
#
# Then the discipline engineers skip: every prediction for a grid of workloads the model was **not** fitted on is
# written to `predictions.csv` — with its time and hash — before anything in that grid runs. Only then is the grid
# measured, and the forecast scored: median error per metric, the share of measurements inside their 80 % interval,
# and, for every large miss, whether the step model or the schedule was wrong.

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()

# %% [markdown]
# ## 1. The engines
#
# One engine per configuration, reused for everything: the course model with a chunked-prefill budget of 512 tokens
# per step (prefix caching on, vLLM's default), another budget for the chunked-prefill points (full mode), a
# **second model the step model is never calibrated on** — only its FLOPs and bytes change — and the course model with
# n-gram speculation (k = 4 draft tokens per step; started last, as it loads numba). Before any calibration, every
# request of the grid is checked against its engine's context and KV pool: a point that cannot fit stops here, in one
# sentence.

# %%
import pandas as pd

from kvlab import forecast, roofline, scorecard, slo, speculative, stepmodel
from kvlab.runtime import config

sizes = scorecard.grid_sizes(kvlab.quick())  # the held-out grid's sizes (quick mode: fewer points, same kinds)
budgets = sizes["budgets"]
engines = {key: kvlab.make_engine(max_model_len=4096, max_num_batched_tokens=b) for key, b in budgets.items()}
engines["second"] = kvlab.make_engine(scorecard.other_model(config.model_name()), max_model_len=4096,
                                      max_num_batched_tokens=512)
engines["spec"] = kvlab.make_engine(max_model_len=4096, max_num_batched_tokens=512,
                                    **speculative.ngram_config(scorecard.SPEC_K))
main = engines["main"]
setups = {key: forecast.setup_from_engine(llm) for key, llm in engines.items()}
toks = {key: llm.get_tokenizer() for key, llm in engines.items()}
scorecard.check_grid(scorecard.held_out_grid(toks, 1.0, **sizes), setups)  # every request fits its engine
print({key: llm.kvlab_settings["model"].split("/")[-1] for key, llm in engines.items()})

# %% [markdown]
# ## 2. Calibrate the step model on this machine
#
# The short sweep of lesson 05 (prefills of 64–512 tokens alone; batches of 1–8 sequences at 64-token prompts, of 8
# at 256 and of 1–4 at 512 and 1,024), under a minute — or lesson 02's saved calibration for this machine, model
# and engine settings, reused (the cell prints which, and its age). A reused calibration predicts at the speed a
# check step measures now (`model.speed`: 1.13 means every step is forecast 13 % longer than calibrated; a machine
# more than 15 % off is calibrated anew). A fit whose median residual is above 15 % stops here with one sentence.

# %%
model = stepmodel.calibrated(main)
print(f"{model.form} form, {model.points} step compositions, median |residual| {model.median_abs_residual():.1%}")
model.describe().round(4)

# %% [markdown]
# ## 3. One step on vLLM's scheduler, by hand
#
# Build the scheduler the engine runs from the engine's own config, hand it one request, and ask for a step. The
# `SchedulerOutput` says how many tokens each request processes; the step model turns that composition into time.
# The arithmetic of the "max" form, on the numbers:

# %%
from kvlab.prompts import distinct_prompts
from kvlab.workload import Arrival, poisson_arrivals

setup = forecast.setup_from_engine(main)
scheduler = forecast.new_scheduler(setup)
tok = main.get_tokenizer()
request = Arrival("one", distinct_prompts(tok, 700, 1, seed=3)[0], 8)
scheduler.add_request(forecast.new_request(request, setup))
out = scheduler.schedule()
step = stepmodel.composition(out, 0.0)
print("scheduled:", dict(out.num_scheduled_tokens), "— the budget is", budgets["main"], "tokens per step")

# %%
k, cost, lim = model.constants, model.cost, model.limits
compute_ms = k["compute_scale"] * stepmodel.step_flops(cost, step) / lim.matmul_flops * 1e3
weights_ms = cost.weights_read(step.tokens) / lim.bandwidth * 1e3
kv_ms = k["kv_scale"] * (stepmodel.step_bytes(cost, step) / lim.bandwidth * 1e3 - weights_ms)
hardware_ms = max(compute_ms, weights_ms + kv_ms) if model.form == "max" else compute_ms + weights_ms + kv_ms
by_hand = (k["fixed_ms"] + k["per_sequence_ms"] * len(step.sequences) + hardware_ms) * model.speed
print(f"({k['fixed_ms']:.2f} fixed + {k['per_sequence_ms']:.2f} × {len(step.sequences)} sequence + hardware "
      f"{hardware_ms:.2f} (compute {compute_ms:.2f}, weights {weights_ms:.2f} + KV {kv_ms:.2f})) × speed now "
      f"{model.speed:.2f} = {by_hand:.2f} ms")
assert abs(by_hand - model.step_ms(step)) < 1e-9, "the hand arithmetic and stepmodel.step_ms disagree"

# %% [markdown]
# `forecast.simulate` repeats exactly that — schedule, time the step, hand back a stand-in token, let the scheduler
# book it — until every request is done, adding each request between steps once its arrival time has come (as the
# engine loop of lessons 04 and 07 does). The 700-token prompt's forecast, step by step:

# %%
one = forecast.simulate(setup, [request], model)
one.steps.head(4).round(4)

# %% [markdown]
# ## 4. The capacity question, forecast
#
# The traffic: chats of 320 prompt tokens and 32 output tokens arriving as a Poisson process. The SLO is set from the
# forecast of one such request alone: TTFT p90 ≤ 3× and TPOT p90 ≤ 2× its unloaded value. The maximum sustainable
# rate is the largest rate whose forecast meets it (bisection, each rate a full simulated run) — for several draws of
# the arrival times, since a p90 over a few dozen requests moves with them.

# %%
objective = scorecard.relative_slo(setup, tok, model)
rated = scorecard.capacity(setup, tok, model, objective, sizes["poisson_requests"])
capacity = rated["rate"]
print(f"SLO: {objective.describe()}; forecast maximum sustainable rate: {capacity:.2f} req/s "
      f"(80 % of arrival draws: {rated['lo80']:.2f}–{rated['hi80']:.2f})")

# %% [markdown]
# ## 5. Write every prediction down — before anything runs
#
# The held-out grid: prompt lengths and batch sizes the calibration never had, a long prompt arriving while three
# requests decode (at each chunked-prefill budget), shared-prefix traffic with prefix caching on, Poisson arrivals at
# fractions of the forecast capacity (one above it), the second model, and four "edit" requests with n-gram
# speculation. Each prediction carries an 80 % interval, from the same forecast run with 12 drawn step models:
# constants drawn from their fitted uncertainty, a whole-run factor from the errors the model made on whole runs it
# was not fitted on (each calibration point's run predicted by a fit on the other points), the machine's run-to-run
# noise (the calibration's repeats), and each step's own error (where requests arrive over time, it changes which
# steps they join). KV blocks in use get no interval: for requests that arrive together, vLLM's block allocation
# decides them whatever the step times.
#
# One point cannot be written down beforehand: which drafts the n-gram proposer finds depends on the text the model
# writes. The speculation point is forecast after its run, **given** the acceptance vLLM counted in it (§7) — it is
# in the grid's hash, not in `predictions.csv`.
#
# The forecast also says how long measuring will take, so the grid is sized from it before anything runs: on a slower
# machine the Poisson rates below capacity (the points whose length is set in seconds) send the requests of a shorter
# window, never fewer than 8 per rate; the rate above capacity keeps its whole window (a short burst meets any SLO:
# the queue needs time to grow), and every other point is the same everywhere — except that on a machine too slow
# even then, every request outside the Poisson rates writes 16 tokens instead of 24; slower still, each prompt length
# alone runs twice instead of three times; and slowest, those requests write 12 tokens.

# %%
models = {key: model for key in [*budgets, "spec"]} | {"second": model.for_model(roofline.engine_cost(engines["second"]))}
measure_target_s = kvlab.pick(120.0, 60.0)  # the grid is sized so its forecast measuring time fits this
grid, point_s = scorecard.grid_for_time(toks, capacity, sizes, setups, models, measure_target_s)
rates = [p for p in grid if p.kind == "poisson"]
print(f"forecast time to measure the grid: {point_s.sum():.0f} s (target {measure_target_s:.0f} s); Poisson rates "
      f"send {', '.join(str(len(p.arrivals)) for p in rates)} requests (the counts behind their p50 and p90); "
      f"{grid[0].arrivals[0].max_tokens} output tokens per request, {len(grid[0].arrivals)} runs per prompt length alone")
predictions, central = scorecard.predict_grid(grid, setups, models)
out_dir = config.build_dir() / "forecast" / "lesson10"
stamp = scorecard.write_predictions(predictions, grid, out_dir)
print(f"{len(grid)} points, {len(predictions)} predictions written at {stamp['written_at']} — sha256 {stamp['sha256'][:16]}…")
predictions.head(8).round(2)

# %% [markdown]
# ## 6. Measure the grid
#
# The measuring cell checks that `predictions.csv` exists, is unchanged since it was written, and predicts *this*
# grid — otherwise it refuses. (Here it is asked first for a folder with no predictions.)
#
# The machine is shared: another process on the cores slows every step, and no forecast of this machine's steps can
# know it. So between points the main engine runs a **canary** — the same 4 short sequences every time, its steps timed
# against the step model's prediction for them. A point whose canary before or after ran more than 10 % slower than
# the fastest canary of the grid was measured while the machine was busy: it is measured once more, and the run beside
# the calmer canaries is kept (chosen by the canaries, never by the point's error; at most a quarter of the points,
# and a tenth of the forecast measuring time).

# %%
try:
    scorecard.measure_grid(engines, grid, out_dir / "nothing-here")
except kvlab.KVLabError as refused:
    print("Refused:", refused)

# %%
import time

started = time.time()
measured = scorecard.measure_grid(engines, grid, out_dir, model=models["main"], retry_s=0.1 * point_s.sum())
assert stamp["written_unix"] < started, "predictions must be on disk before the first point runs"
speed = scorecard.machine_speed(measured)
drift = float(speed[["before", "after"]].stack().median())  # the canaries: measured ÷ predicted step time
print(f"measuring took {time.time() - started:.0f} s, forecast {point_s.sum():.0f} s (canaries and warm-ups aside)")
print(f"measured {len(measured)} points, starting {started - stamp['written_unix']:.1f} s after the predictions were written; "
      f"canaries: median {drift:.2f}× the step model's time, the slowest "
      f"{speed.slower.max():+.0%} against the fastest; {int(speed.remeasured.sum())} point(s) measured again")

# %% [markdown]
# ## 7. The scorecard
#
# Per metric: the median |error| (predicted ÷ measured − 1; for the prefix-cache hit rate, the difference in points)
# and the share of measurements inside their 80 % interval. KV blocks in use are vLLM's own allocation, so where all
# requests arrive at once the forecast should be exact to the block.

# %%
given, given_central = scorecard.predict_given_acceptance(grid, setups, models, measured)
central |= given_central
card = scorecard.score(pd.concat([predictions, given], ignore_index=True), measured)
card.to_csv(out_dir / "scorecard.csv", index=False)
board = scorecard.summary(card)
board.round(3)

# %% tags=["key-figure"]
scorecard.scatter(card)

# %% [markdown]
# Each point's 80 % interval is the vertical bar; the dashed line is a perfect forecast.
#
# The takeaway is a median |TPOT error| within 15 % (20 % in quick mode). The canaries say whether the machine kept
# the speed the predictions were made at: with their median within 10 % of the step model's time, a larger miss is
# the model's and fails the lesson; on a machine that drifted further, the miss is printed with the canaries' speed.

# %%
blocks = card[card.metric == "peak_blocks"]
tpot_error = float(card[card.metric.str.startswith("tpot")].error.abs().median())
coverage, inside, drawn = scorecard.coverage(card)  # over the metrics with an interval (not KV blocks)
print(f"KV blocks in use: {int((blocks.predicted == blocks.measured).sum())} of {len(blocks)} points exact; "
      f"median |TPOT error| {tpot_error:.0%}; {inside} of {drawn} measurements ({coverage:.0%}) inside their 80 % "
      "interval (a calibrated interval: 70–90 %)")
assert (blocks.predicted == blocks.measured).all(), blocks[["point", "predicted", "measured"]]
steady = not abs(drift - 1) > 0.10  # no canaries (nan): judged as steady, so a miss still fails
tpot_bound = kvlab.pick(0.15, 0.20)
tpot_ok = tpot_error <= tpot_bound
kvlab.claim(tpot_ok, f"median |TPOT error| {tpot_error:.0%}, within {tpot_bound:.0%}",
            f"median |TPOT error| {tpot_error:.0%}, over {tpot_bound:.0%}, with the canaries at {drift:.2f}× "
            "the step model's time: " + ("the machine kept its speed, so the miss is the model's" if steady else
                                         "the machine drifted; rerun on a quieter machine to tell the model's error "
                                         "from the machine's"), show=True, teaches="median |TPOT error| within 15 % (quick mode: 20 %)")
assert tpot_ok or not steady, f"median |TPOT error| {tpot_error:.0%} with the canaries at {drift:.2f}×"

# %% [markdown]
# The speculation point, forecast given what vLLM counted in its run: the share of decode steps that had a draft
# (coverage), the draft length, and how often each draft position was accepted. vLLM's scheduler then verifies k + 1
# tokens per step and rolls back the rejected ones, exactly as in the engine; the step model times those wider steps.
# Tokens per step is what speculation buys; TPOT is what the learner feels.

# %%
spec_card = card[card.kind == "speculation"]
print(given.given.iloc[0])
spec_card[["metric", "predicted", "lo80", "hi80", "measured", "error", "inside"]].round(3)

# %% [markdown]
# Did the forecast call the SLO right? Each Poisson point's forecast and its measured run are judged the same way
# (p90 of each objective after the first 20 % of requests; a ratio ≤ 1 meets), and each side's maximum sustainable
# rate is interpolated from its points as lesson 07 does.

# %%
calls, sustainable = scorecard.capacity_check(grid, measured, central, objective)
print(f"maximum sustainable rate over these points: forecast {sustainable['predicted']['rate']}, measured "
      f"{sustainable['measured']['rate']} req/s (error {sustainable['error']:+.0%})")
calls.round(3)

# %% [markdown]
# ## 8. Where the misses came from
#
# For every point-metric off by more than 15 %: the step model's error on that point's **own measured steps** (their
# recorded compositions, predicted, against their recorded durations) and the term that dominates them, beside the
# schedule — steps, prefix-cache hits and preemptions, forecast against engine. A miss mostly explained by the step
# error is a step-time miss — and where the point's canary also ran slow, the machine was busy; otherwise the schedule
# differed.

# %%
engine_of = {p.name: p.engine for p in grid}
budget = scorecard.error_budget(card, measured, central, models, engine_of)
budget.round(3) if len(budget) else print("No point-metric missed by more than 15 %.")

# %% [markdown]
# ## 9. Why is my TTFT high?
#
# At the rate above the forecast capacity, each request's TTFT split three ways: **queue** (arrived, not yet scheduled),
# its **own prefill** (what its prompt costs alone), and **shared steps** (its prefill steps also carried other
# requests' tokens — decodes, other prefills). Measured from the engine's own per-request timestamps (queued,
# scheduled, first token), next to the forecast's split.

# %%
over = max((p for p in grid if p.kind == "poisson"), key=lambda p: p.rate_rps)
alone = scorecard.unloaded(tok, scorecard.POISSON_PROMPT, 4, seed=5)
alone_prefill = float(scorecard.measure_point(main, alone)[0].engine_prefill_s.median())
split = scorecard.ttft_split(measured[over.name][0], central[over.name].requests, alone_prefill)
scorecard.ttft_split_figure(split, f"TTFT parts at {over.rate_rps:.2f} req/s ({over.name})")

# %%
parts = split.groupby("side")[["queue", "own prefill", "shared steps"]].mean() * 1e3
parts.round(1)

# %% [markdown]
# ## 10. Beyond this machine, on paper
#
# The same forecast for Llama-3.1-8B on two GPUs: vLLM's scheduler with a GPU's sizes (16-token blocks, a KV pool of
# what 90 % of the GPU's memory holds after the weights, a budget of 8,192 tokens per step, 256 sequences), and the
# step model with the datasheet's peaks and **no fitted overheads** — only a stated guess of
# `forecast.GPU_FIXED_MS` per step for the host's work. Nothing here was measured on a GPU; one published
# measurement is set beside it: Llama-3.1-8B-Instruct in bf16 on an A100 40GB, vLLM 0.23, 1,024 tokens in and 128
# out — "about 75 tokens/sec" at one request, and 6.6× that throughput at 8
# (johnmusgrave.com/p/vllm-throughput-latency-sweep-on).

# %%
from kvlab import sizing

llama8b = roofline.ModelCost.from_config(sizing.load_preset("Llama-3.1-8B")["config"], 2, 2 * 32 * 8 * 128 * 2)
gpus = {"A100 40GB": (roofline.A100_40GB_BF16, 40), "H100 80GB": (roofline.H100_SXM_BF16, 80)}
paper = []
for name, (limits, gib) in gpus.items():
    gpu_setup = forecast.paper_setup(setup, forecast.kv_tokens_on(gib, llama8b))
    gpu_model = forecast.paper_model(model, limits, llama8b)
    for batch in (1, 8, 32):
        arrivals = [Arrival(f"{name} {i}", p, 128, 0.0) for i, p in enumerate(distinct_prompts(tok, 1024, batch, seed=200))]
        tpot = float(forecast.simulate(gpu_setup, arrivals, gpu_model).requests.tpot_s.median())
        paper.append({"GPU": name, "batch": batch, "TPOT p50 (ms)": tpot * 1e3, "output tok/s": batch / tpot})
paper = pd.DataFrame(paper)
paper.round(1)

# %%
a100 = paper[paper.GPU == "A100 40GB"].set_index("batch")["output tok/s"]
published = {1: 75.0, 8: 6.6 * 75.0}
for batch, tok_s in published.items():
    print(f"A100, batch {batch}: forecast {a100[batch]:.0f} tok/s, published ≈ {tok_s:.0f} tok/s "
          f"({a100[batch] / tok_s - 1:+.0%})")

# %% [markdown]
# And the capacity question on paper, for the H100: chats of 1,024 tokens in and 128 out arriving as a Poisson
# process, under TTFT p90 ≤ 500 ms and TPOT p90 ≤ 50 ms. Each rate sends the requests of a fixed window of time, so a
# backlog has time to build (a short burst "meets" any SLO), and the search stops at the compute bound: every
# prompt's FLOPs ÷ the peak.

# %%
gpu_slo = slo.SLO(ttft_ms=500, tpot_ms=50, percentile=90)
window_s = kvlab.pick(10.0, 5.0)


def gpu_arrivals(rate: float) -> list[Arrival]:
    return poisson_arrivals(tok, max(60, int(rate * window_s)), rate, 1024, 128, seed=300)


h100, h100_gib = gpus["H100 80GB"]
compute_bound_rps = h100.matmul_flops / (2 * llama8b.linear_params * (1024 + 128))  # matmul FLOPs alone: an upper bound
h100_rate = forecast.max_rate(forecast.paper_setup(setup, forecast.kv_tokens_on(h100_gib, llama8b)), gpu_arrivals,
                              forecast.paper_model(model, h100, llama8b), gpu_slo, 1.0, compute_bound_rps, iters=5)
print(f"H100, Llama-3.1-8B: forecast maximum sustainable rate {h100_rate:.1f} req/s at {gpu_slo.describe()} "
      f"(compute bound {compute_bound_rps:.0f} req/s)")

# %% [markdown]
# ## Summary
#
# Written from this run's numbers:

# %%
from IPython.display import Markdown

ttft_error = float(card[card.metric.str.startswith("ttft")].error.abs().median())
right_calls = f"{int(calls.right.sum())} of {len(calls)}"
rate_words = {side: "below the lowest rate measured" if r["rate"] is None else
              f"{r['rate']:.2f} req/s" + (" or more" if r["at_least"] else "") for side, r in sustainable.items() if side != "error"}
worst = card.loc[card.error.abs().idxmax()]
biggest = parts.loc["measured"].idxmax()
spec_tps = spec_card.set_index("metric").loc["tokens_per_step"]
Markdown(f"""
- The step model ({model.form} form, {len(model.constants)} constants) was fitted on {model.points} step compositions;
  vLLM's scheduler, driven with those step times, forecast {len(grid)} held-out points and {len(predictions)} numbers,
  written at {stamp['written_at']} before anything ran.
- Median |error|: TPOT **{tpot_error:.0%}**, TTFT **{ttft_error:.0%}**; {coverage:.0%} of measurements fell inside their
  80 % interval. KV blocks in use: exact at {int((blocks.predicted == blocks.measured).sum())} of {len(blocks)} points.
- The forecast capacity at *{objective.describe()}* was {capacity:.2f} req/s (arrival draws: {rated['lo80']:.2f}–{rated['hi80']:.2f}).
  Over the measured rates the maximum sustainable rate was {rate_words['measured']}, the forecast of the same points
  said {rate_words['predicted']}; met or missed was called right at {right_calls} rates.
- Speculation (k = {scorecard.SPEC_K}), given the acceptance measured in its run: tokens per step predicted
  {spec_tps.predicted:.2f}, measured {spec_tps.measured:.2f} ({spec_tps.error:+.0%}); TPOT p50 error
  {spec_card.set_index("metric").loc["tpot_p50_ms", "error"]:+.0%}.
- The largest miss: {worst.metric} at "{worst.point}", predicted {worst.predicted:.1f}, measured {worst.measured:.1f}.
- On paper (datasheet peaks, {forecast.GPU_FIXED_MS:g} ms per step assumed): Llama-3.1-8B at batch 1 on an A100 40GB
  {a100[1]:.0f} tok/s against the published ≈ 75 ({a100[1] / 75 - 1:+.0%}); at batch 8 {a100[8]:.0f} against ≈ {6.6 * 75:.0f}
  ({a100[8] / (6.6 * 75) - 1:+.0%}): datasheet peaks are not reached, so on paper the forecast is optimistic. On an H100,
  TPOT at batch 1 and 32: {paper.set_index(["GPU", "batch"]).loc[("H100 80GB", 1), "TPOT p50 (ms)"]:.1f} and
  {paper.set_index(["GPU", "batch"]).loc[("H100 80GB", 32), "TPOT p50 (ms)"]:.1f} ms; maximum sustainable rate at
  *{gpu_slo.describe()}* {h100_rate:.1f} req/s — not measured here.
- At {over.rate_rps:.2f} req/s the largest part of the measured TTFT was **{biggest}** ({parts.loc['measured', biggest]:.0f} ms
  of {parts.loc['measured'].sum():.0f} ms on average; forecast {parts.loc['forecast'].sum():.0f} ms).
""")

# %% [markdown]
# ## Exercises
#
# 1. Change the SLO to TTFT p90 ≤ 2× unloaded. Predict the new capacity, write it down, then measure two rates around it.
# 2. Forecast the same Poisson traffic with `max_num_batched_tokens=256` (a new engine's `setup_from_engine`). Which
#    TTFT part grows, and why?
# 3. Pick the point with the largest miss. Is it a step-time miss or a schedule miss? Plot its measured steps'
#    durations against `model.predict_ms` of the same steps.
# 4. Calibrate on the second model and forecast the first. Do the constants move? Which one would you expect to?

# %%
for llm in engines.values():
    kvlab.close_engine(llm)
