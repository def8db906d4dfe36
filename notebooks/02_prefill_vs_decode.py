# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Prefill vs decode — timed, and set against the machine's limits
#
# Lesson 00 named the two phases of a request. This lesson measures them properly, on one model, for short and long
# prompts — the course's micro-project:
#
# > *Measure TTFT vs decode speed for short vs long prompts on one model. Plot both; annotate which phase dominates each case.*
#
# The claim to test: **prefill sets TTFT and is compute-bound — above a prompt length this lesson computes for
# this machine —, decode sets TPOT and is memory-bandwidth-bound.** We measure this machine's compute and bandwidth
# limits first, turn them into lower bounds for every request, and see how close the engine gets.

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()

# %% [markdown]
# ## 1. What we measure, and what other tools call it
#
# Definitions as vLLM's benchmarks use them (`kvlab/timing.py` holds the code):
#
# - **TTFT** — arrival → first output token (queue + prefill). **Prefill time** — scheduled → first token.
# - **TPOT** — (last token − first token) ÷ (output tokens − 1): the stream's pace, first token excluded.
# - **ITL** — every gap between consecutive chunks of the stream; its tail shows stalls. Within one request whose
#   chunks carry one token each, its mean is that request's TPOT. Not in general: vLLM's `bench serve` pools the gaps
#   of all requests (long requests weigh more), and a chunk can carry several tokens (speculative decoding) — then
#   one gap covers several tokens.
# - **E2E latency** — arrival → last token = TTFT + decode time.
#
# Benchmark tools disagree on the names — and change them between versions. The table names the versions it
# describes; compare numbers only after checking definitions:

# %%
import pandas as pd

pd.DataFrame(kvlab.timing.NAMES_ACROSS_TOOLS)

# %% [markdown]
# ## 2. One engine, and this machine's limits
#
# First we measure the two limits that bound everything below, with torch, in the engine's dtype: peak
# **matrix-multiply FLOP/s** (what prefill needs) and peak **memory bandwidth** (what decode needs), keeping the best of
# several tries — and we measure again after the sweep, because on a shared machine a neighbour can make one
# measurement low, and a peak that is too low would make the bounds wrong. Then one engine, with prefix caching **off**
# for this lesson, so every request pays its full prefill.

# %%
from kvlab import prefill_decode, roofline, sizing, timing

limits = roofline.measure_limits(quick=kvlab.quick())  # in a fresh process; repeated after the sweep
llm = kvlab.make_engine(enable_prefix_caching=False)
cost = roofline.engine_cost(llm)
assert limits.dtype == kvlab.engine.engine_dtype(llm)
pd.Series({"matmul peak (GFLOP/s)": limits.matmul_flops / 1e9, "memory bandwidth (GB/s)": limits.bandwidth / 1e9,
           "dtype": limits.dtype, "threads": limits.threads,
           "weights read per decode step (MB)": cost.decode_step_bytes(0) / 1e6,
           "KV bytes per token": cost.kv_bytes_per_token}, name="this machine").to_frame()

# %% [markdown]
# ### Where prefill turns compute-bound
#
# Prefill must do `2 × weights` FLOPs per prompt token (plus attention), but it must also read every weight once,
# however short the prompt. Its lower bound is therefore the **larger** of the two times: compute time
# (FLOPs ÷ peak FLOP/s) or memory time (bytes ÷ bandwidth). Which one wins depends on the machine's **ridge point**
# — peak FLOP/s ÷ bandwidth, the FLOPs a kernel must do per byte it reads to keep the arithmetic units busy. Prefill
# does about 2 FLOPs per weight per token and reads each weight's bytes once, so it turns compute-bound from about
# `ridge × bytes per weight ÷ 2` prompt tokens. Here, and for one GPU from its datasheet:

# %%

ridge, from_tokens = roofline.ridge_point(limits), cost.compute_bound_from(limits)
gpu = roofline.H100_SXM_BF16
gpu_cost = roofline.ModelCost.from_config(llm.llm_engine.vllm_config.model_config.hf_config, 2, cost.kv_bytes_per_token * 2 // cost.bytes_per_param)
llama8b = roofline.ModelCost.from_config(sizing.load_preset("Llama-3.1-8B")["config"], 2, 2 * 32 * 8 * 128 * 2)
pd.DataFrame([
    {"machine": f"this machine ({limits.dtype})", "ridge (FLOP/byte)": ridge, "bytes per weight": cost.bytes_per_param,
     "prefill compute-bound from (tokens)": from_tokens},
    {"machine": f"{gpu.device}, this model in bf16", "ridge (FLOP/byte)": roofline.ridge_point(gpu), "bytes per weight": 2,
     "prefill compute-bound from (tokens)": gpu_cost.compute_bound_from(gpu)},
    {"machine": f"{gpu.device}, Llama-3.1-8B in bf16", "ridge (FLOP/byte)": roofline.ridge_point(gpu), "bytes per weight": 2,
     "prefill compute-bound from (tokens)": llama8b.compute_bound_from(gpu)},
]).round(1)

# %% [markdown]
# The higher a machine's ridge, the longer the prompts that are bound by reading the weights rather than by
# arithmetic. An 8B model's 16-token prompt on an H100, from the datasheet:

# %%
short = 16
print(f"Llama-3.1-8B, {short}-token prompt on the {gpu.device}: {llama8b.prefill_flops(short) / gpu.matmul_flops * 1e3:.2f} ms "
      f"of compute, {llama8b.prefill_bytes(short) / gpu.bandwidth * 1e3:.1f} ms to read {llama8b.prefill_bytes(short) / 1e9:.0f} GB "
      f"of weights. Its ridge is {roofline.ridge_point(gpu) / ridge:.0f}× this machine's ({ridge:.0f} FLOP/byte here); "
      f"here prompts shorter than {from_tokens:,} tokens are bound by the weight read, longer ones by arithmetic.")

# %% [markdown]
# ### One prompt's bounds, by hand
#
# Before the sweep computes them for every point, here are the two bounds for one 1,024-token prompt on this
# machine, written out: prefill's FLOPs (2 per weight per token, the attention's causal triangle, the LM head once)
# over the peak, its bytes (the weights once, the prompt's KV written) over the bandwidth, and the larger of the two;
# one decode step at 1,040 tokens of context reads the weights and that context's KV.

# %%
import math

n = 1024
weight_bytes = (cost.linear_params + cost.lm_head_params) * cost.bytes_per_param
flops = 2 * cost.linear_params * n + 2 * cost.lm_head_params + 2 * 2 * cost.attn_width * cost.layers * n * (n + 1) / 2
compute_s, memory_s = flops / limits.matmul_flops, (weight_bytes + cost.kv_bytes_per_token * n) / limits.bandwidth
tpot_by_hand = (weight_bytes + cost.kv_bytes_per_token * (n + 16)) / limits.bandwidth
print(f"TTFT ≥ max({flops / 1e9:.0f} GFLOP ÷ {limits.matmul_flops / 1e9:.0f} GFLOP/s = {compute_s * 1e3:.1f} ms, "
      f"{(weight_bytes + cost.kv_bytes_per_token * n) / 1e6:.0f} MB ÷ {limits.bandwidth / 1e9:.1f} GB/s = {memory_s * 1e3:.1f} ms) "
      f"= {max(compute_s, memory_s) * 1e3:.1f} ms; TPOT ≥ {tpot_by_hand * 1e3:.2f} ms")
if cost.expert_params:
    print("A mixture-of-experts model reads only the experts its tokens use: the library's bounds count them; the hand figures above do not.")
else:
    assert math.isclose(max(compute_s, memory_s), cost.ttft_bound_s(n, limits), rel_tol=1e-9)
    assert math.isclose(tpot_by_hand, cost.decode_step_bytes(n + 16) / limits.bandwidth, rel_tol=1e-9)

# %% [markdown]
# ## 3. The sweep: TTFT and TPOT vs prompt length
#
# One request at a time, warm-up first, each prompt cut from a different place in real text (`data/text/`), exact
# token lengths, the same number of output tokens each time, three to five repeats (a point stops repeating once its
# median is known to ±10 %; a noisy point gets more). A request far slower than the others at
# its prompt length is a **stall** of the shared machine, not the engine (`docs/stalls.md`): the sweep flags it (above
# its point's median + 5 robust standard deviations, and at least 1.5× the median), measures that point once more,
# prints how many it flagged, and the percentiles leave the flagged ones out. They are shown below the table, not hidden.
#
# First, section 4's model of one engine step is fitted (a short sweep of its own, about a minute, saved in the build
# folder: lessons 05, 09 and 10 reuse it on this machine, model and engine settings instead of measuring it again). It
# forecasts how long one pass over the prompt lengths takes here, and the ceiling of five repeats shrinks to what fits
# about 45 seconds (three at least; on a machine where three do not fit, each request writes 16 tokens instead of 32,
# and where even that does not, the sweep ends at 2,048 tokens instead of 4,096).

# %%
from kvlab import stepmodel

steps_model = stepmodel.calibrated(llm, limits=limits)  # section 4's step model, also the sweep's clock
context = kvlab.kv_capacity(llm).max_model_len  # a model with a shorter context runs the lengths that fit
lengths = [n for n in kvlab.pick([128, 256, 512, 1024, 2048, 4096], [128, 1024]) if n + 32 <= context]


def sweep_seconds(option: tuple[int, int, int]) -> float:
    """Forecast seconds of the sweep at (repeats, output tokens, longest prompt): an untimed warm-up (≤ 8 tokens out),
    then the passes."""
    repeats, tokens, longest = option
    return sum(steps_model.run_seconds(1, n, min(8, tokens)) + repeats * steps_model.run_seconds(1, n, tokens)
               for n in lengths if n <= longest)


options = [(5, 32, lengths[-1]), (4, 32, lengths[-1]), (3, 32, lengths[-1]), (3, 16, lengths[-1])]
options += [(3, 16, n) for n in lengths[-2:-1] if n >= 2048]  # a slow machine's sweep ends one length earlier
repeats, decode_tokens, longest = kvlab.fit_to_time(kvlab.pick(options, options[-1:]), sweep_seconds, kvlab.pick(45.0, 20.0))
prompt_lengths = [n for n in lengths if n <= longest]
print(f"{repeats} repeats (3 at least) of {decode_tokens} output tokens after a warm-up, prompts of {prompt_lengths[0]}–"
      f"{longest} tokens: about {sweep_seconds((repeats, decode_tokens, longest)):.0f} s here")
recorder = stepmodel.StepRecorder(llm)  # every engine step of the sweep: its composition and its duration
with recorder.recording():
    runs = prefill_decode.sweep(llm, prompt_lengths, [decode_tokens], repeats, min_repeats=3, desc="prompt lengths")
limits = roofline.best_of(limits, roofline.measure_limits(quick=kvlab.quick()))  # the peak seen before or after
runs = roofline.add_bounds(runs, cost, limits)
summary = timing.summarize(runs, ["ttft_s", "tpot_s", "prefill_s"], by=["prompt_tokens"])
summary = summary.merge(runs.groupby("prompt_tokens", as_index=False)[["ttft_bound_s", "tpot_bound_s"]].median())
(summary.set_index("prompt_tokens").drop(columns="requests") * 1e3).round(1).add_suffix(" (ms)")

# %%
runs[runs.outlier][["prompt_tokens", "repeat", "ttft_s", "tpot_s"]]  # the stalls, if any: kept, flagged, not in the percentiles

# %% tags=["key-figure"]
from_tokens = cost.compute_bound_from(limits)  # with the peaks seen before or after the sweep
fig = kvlab.prefill_decode.metric_vs_prompt(summary, "ttft_s", "ttft_bound_s", "TTFT grows with the prompt (prefill)", "TTFT (ms, log)", log_y=True)
kvlab.prefill_decode.mark_compute_bound(fig, from_tokens, summary.prompt_tokens.max()).show()
tpot_change = summary.sort_values("prompt_tokens").tpot_s_p50.pipe(lambda t: t.iloc[-1] / t.iloc[0] - 1)
kvlab.prefill_decode.metric_vs_prompt(summary, "tpot_s", "tpot_bound_s", f"TPOT {tpot_change:+.0%} from the shortest to the "
                                      "longest prompt (decode)", "TPOT (ms)").show()

# %% [markdown]
# The checks below run on every execution of this notebook, on any machine: over an 8× (or wider) range of prompt
# lengths, TTFT must grow by at least a quarter of what the extra prompt tokens must cost at this machine's peaks (the
# growth of the bound — a fixed multiple such as "3×" holds on this CPU but not for a small model on a GPU, where the
# engine's fixed cost per step dwarfs prefill), TPOT must change far less than TTFT, and no request may beat its lower
# bound (that would mean the bound is wrong).

# %%
med = summary.set_index("prompt_tokens")
length_ratio = prompt_lengths[-1] / prompt_lengths[0]
ttft_ratio = med.ttft_s_p50.iloc[-1] / med.ttft_s_p50.iloc[0]
tpot_ratio = med.tpot_s_p50.max() / med.tpot_s_p50.min()
print(f"prompt {length_ratio:.0f}× longer → TTFT {ttft_ratio:.1f}×, TPOT {tpot_ratio:.2f}×")
print(f"measured ÷ bound: TTFT {runs.ttft_over_bound.min():.2f}–{runs.ttft_over_bound.max():.2f}, TPOT {runs.tpot_over_bound.min():.2f}–{runs.tpot_over_bound.max():.2f}")
print(f"ridge point {ridge:.1f} FLOP/byte: prefill is compute-bound from {from_tokens} prompt tokens here; "
      f"bounds in the sweep: {', '.join(f'{k} ({n})' for k, n in runs.ttft_bound_kind.value_counts().items())}")
extra_ttft, extra_bound = med.ttft_s_p50.iloc[-1] - med.ttft_s_p50.iloc[0], med.ttft_bound_s.iloc[-1] - med.ttft_bound_s.iloc[0]
print(f"extra TTFT for the longest prompt: {extra_ttft * 1e3:.0f} ms; the extra work's minimum at this machine's peaks: "
      f"{extra_bound * 1e3:.0f} ms")
assert length_ratio >= 8 and extra_ttft >= 0.25 * extra_bound > 0, (length_ratio, extra_ttft, extra_bound)
assert tpot_ratio - 1 < (ttft_ratio - 1) / 4, (tpot_ratio, ttft_ratio)
assert (runs.ttft_over_bound >= 0.9).all() and (runs.tpot_over_bound >= 0.9).all(), "a request beat its bound: the bound is wrong"

# %% [markdown]
# ## 4. How close to the machine's limit?
#
# Divide the work each phase must do by the time it took: prefill's achieved FLOP/s against the matmul peak, decode's
# achieved bytes/s against the bandwidth peak. 100 % would be a perfect engine on this machine.

# %%
eff = runs.groupby("prompt_tokens").agg(prefill_gflops=("prefill_flops_achieved", "median"),
                                        decode_gbs=("decode_bandwidth_achieved", "median"))
eff["prefill % of matmul peak"] = 100 * eff.prefill_gflops / limits.matmul_flops
eff["decode % of bandwidth peak"] = 100 * eff.decode_gbs / limits.bandwidth
eff["prefill_gflops"] /= 1e9
eff["decode_gbs"] /= 1e9
eff.round(1)

# %% [markdown]
# ### Where each step's time goes
#
# The bounds say what a step cannot beat; how much of a measured step is each thing? `kvlab.stepmodel` fits one step's
# duration from its composition — a **fixed** cost per step, a cost **per sequence**, and the step's FLOPs ÷ the
# matmul peak and its bytes ÷ the bandwidth with fitted scales (or their maximum, whichever fits this machine's steps
# better) — on the short calibration sweep of its own run before section 3 (prefills up to 512 tokens, batches of up
# to 4), then splits the sweep's steps above into those terms: every prompt length's prefill step, and the decode steps after it.

# %%
prefill_terms = stepmodel.prefill_attribution(steps_model, recorder.steps)
prefill_terms = prefill_terms[prefill_terms.prompt_tokens.isin(prompt_lengths)]
decode_terms = stepmodel.attribution_by(steps_model, recorder.steps, lambda s: next(
    (p for p in prompt_lengths if p <= s.sequences[0][1] < p + decode_tokens), None) if s.tokens == 1 else None, "prompt_tokens")
stepmodel.attribution_figure(prefill_terms, "prompt_tokens", "A prefill step, term by term: predicted (bars), measured (◆)").show()
stepmodel.attribution_figure(decode_terms, "prompt_tokens", "A decode step after each prompt, term by term: predicted (bars), measured (◆)").show()
steps_model.describe().round(4)

# %%
short, longest = prefill_terms.iloc[0], prefill_terms.iloc[-1]
dec = decode_terms.iloc[0]
shares = {t: dec[t] / dec.predicted_ms for t in stepmodel.TERM_COLUMNS}
miss = (pd.concat([prefill_terms, decode_terms]).eval("predicted_ms / measured_ms - 1")).abs()
print(f"{steps_model.form} model: prefill of {int(short.prompt_tokens):,} tokens {short.measured_ms:.0f} ms measured, "
      f"{short.compute / short.predicted_ms:.0%} of it compute; {int(longest.prompt_tokens):,} tokens {longest.measured_ms:.0f} ms, "
      f"{longest.compute / longest.predicted_ms:.0%} compute. A decode step ({dec.measured_ms:.1f} ms): "
      f"{shares['fixed'] + shares['per-sequence']:.0%} fixed cost, {shares['weight reads']:.0%} weight reads, "
      f"{shares['KV reads']:.0%} KV reads, {shares['compute']:.0%} compute; median |miss| over these steps {miss.median():.0%}")
assert longest.compute / longest.predicted_ms > short.compute / short.predicted_ms  # longer prompts: more of it arithmetic

# %% [markdown]
# On a GPU the same model, given an H100's datasheet limits and no fitted overhead (a **lower bound**, not a
# prediction), and Llama-3.1-8B's FLOPs and bytes, splits a decode step almost entirely into the weight read:

# %%
gpu_model = steps_model.with_limits(gpu).for_model(llama8b)
gpu_split = gpu_model.attribution([stepmodel.decode_step(1, 1024), stepmodel.Step(0.0, ((1024, 0),))]).round(3)
gpu_split.assign(step=["decode at 1,024 tokens", "prefill of 1,024 tokens"])[["step", "predicted_ms", "weight reads", "KV reads", "compute"]]

# %% [markdown]
# ## 5. Where the time goes: short vs long prompts × output lengths
#
# Now a short and a long prompt (2,048 tokens, fewer if the model's context is shorter: long enough for prefill to
# matter, without section 3's slowest prefill nine times over), each with a few output lengths. The engine is warm
# from section 3, so no warm-up here. The middle output length is section 3's own (32 tokens, 16 on a slow machine), so
# a point section 3 already timed (its prompt length and output length) is taken from it rather than timed again.
# Each bar splits one request's median time into prefill and decode; the label names the phase that dominates. Three repeats per point, two where the step model says three would take more than
# half a minute here.

# %%
split_outputs = kvlab.pick([8, decode_tokens, 128], [8, decode_tokens])  # the sweep's own output length: reused
split_prompts = [prompt_lengths[0], min(kvlab.pick(2048, 1024), context - max(split_outputs))]
swept = set(zip(runs.prompt_tokens, runs.output_tokens, strict=True))  # section 3's points, not timed again
split_pass = sum(steps_model.run_seconds(1, p, n) for p in split_prompts for n in split_outputs if (p, n) not in swept)
split_repeats = kvlab.fit_to_time(kvlab.pick([3, 2], [2]), lambda r: r * split_pass, kvlab.pick(30.0, 15.0))
split = prefill_decode.sweep(llm, split_prompts, split_outputs, split_repeats, warmup=0, desc="phase split", reuse=runs)
print(f"{split_repeats} repeats of each point not timed in section 3 (one repeat of those: about {split_pass:.0f} s here)")
kvlab.prefill_decode.phase_split(split).show()

# %% [markdown]
# **The crossover.** For N output tokens, decode costs about (N − 1) × TPOT, and prefill grows with the prompt. The
# prompt length where the two are equal is where the dominant phase flips. We interpolate it from the sweep's medians:

# %%
medians = runs.groupby("prompt_tokens", as_index=False)[["prefill_s", "tpot_s"]].median()
crossings = {n: prefill_decode.crossover(medians, n) for n in split_outputs}
kvlab.prefill_decode.crossover_plot(medians, split_outputs, crossings).show()
pd.Series({f"{n} output tokens": (f"{c:,.0f} prompt tokens" if c else "outside the measured range") for n, c in crossings.items()}, name="prefill = decode at")

# %% [markdown]
# ## 6. The client's view: a token-by-token stream
#
# A client sees only events: the first one marks its TTFT, the rest its TPOT and ITL. Here we drive the engine one step at
# a time, timestamp every token as it arrives, and compare with the engine's own numbers for the same request.

# %%
tok = llm.get_tokenizer()
stream_tokens = kvlab.pick(64, 16)
streams = pd.DataFrame([timing.stream_timing(llm, kvlab.prompts.prompt_of_length(tok, p, offset=999 + p), stream_tokens) for p in split_prompts])
streams["itl_p50_ms"] = streams.itl_s.map(lambda g: timing.summarize(pd.DataFrame({"x": g}), ["x"]).x_p50.iloc[0] * 1e3)
streams["itl_p95_ms"] = streams.itl_s.map(lambda g: timing.p95(g) * 1e3)
streams["itl_max_ms"] = streams.itl_s.map(lambda g: max(g) * 1e3)
view = streams[["prompt_tokens", "output_tokens", "client_ttft_s", "engine_ttft_s", "client_tpot_s", "engine_tpot_s", "itl_p50_ms", "itl_p95_ms", "itl_max_ms"]]
view.round(4)

# %%
kvlab.prefill_decode.itl_scatter(streams).show()
gap_ms = ((streams.client_ttft_s - streams.engine_ttft_s) * 1e3)
print(f"client TTFT − engine TTFT: {gap_ms.min():.1f} to {gap_ms.max():.1f} ms (in-process: no network, no HTTP)")

# %% [markdown]
# ## 7. Where decode's time goes: a fit over model widths
#
# Section 4 found decode well short of the bandwidth peak. Is the rest of the step slow memory traffic, or something
# else? Take the same model made wider — hidden size, heads and MLP scaled together, the layer count kept, random
# weights (the text is gibberish; shapes and times are real) — so a step's fixed work (scheduling, sampling, Python,
# the kernels launched per layer) stays the same and only the bytes change. If **TPOT = overhead + bytes ÷ bandwidth**,
# a straight line through (bytes per step, TPOT) gives both: the intercept is the engine's fixed cost per step on this
# machine, the slope's inverse the bandwidth decode really achieves. One engine per width (eager on CPU), one
# cold request at a time, as many repeats as section 3 could afford here; the main engine is closed first so nothing
# else runs.

# %%
kvlab.close_engine(llm)
widths = prefill_decode.decode_by_width([1, 1.34, 2], prompt_tokens=128,
                                     output_tokens=kvlab.pick(32, 16), repeats=repeats, min_repeats=3)  # section 3's
clean = kvlab.outliers.clean(widths)
fit = roofline.fit_decode(clean.step_bytes, clean.tpot_s)
# the bandwidth peak once more, now, beside the fit: a shared machine's bandwidth drifts over minutes (29–59 GB/s seen here)
peak = roofline.best_of(limits, roofline.measure_limits(quick=kvlab.quick(), matmul=False)).bandwidth
by_width = timing.summarize(widths, ["tpot_s"], by=["hidden_size"]).merge(
    widths.groupby("hidden_size", as_index=False)[["weight_bytes", "step_bytes"]].first())
by_width["memory share of the step"] = [fit.memory_share(b) for b in by_width.step_bytes]
by_width.assign(weight_mb=by_width.weight_bytes / 1e6, step_mb=by_width.step_bytes / 1e6, tpot_p50_ms=by_width.tpot_s_p50 * 1e3,
                tpot_p95_ms=by_width.tpot_s_p95 * 1e3)[["hidden_size", "requests", "weight_mb", "step_mb", "tpot_p50_ms",
                                                        "tpot_p95_ms", "memory share of the step"]].round(2)

# %%
kvlab.prefill_decode.decode_fit(widths, fit, peak).show()
course = fit.memory_share(cost.decode_step_bytes(128 + 16))
step_8b = llama8b.decode_step_bytes(1024)  # Llama-3.1-8B in bf16, 1,024 tokens of context
gpu_memory_ms = step_8b / gpu.bandwidth * 1e3
print(f"overhead per step: {fit.overhead_s * 1e3:.1f} ± {fit.overhead_se_s * 1e3:.1f} ms; achieved bandwidth "
      f"{fit.bandwidth / 1e9:.1f} GB/s (1 SE: {fit.bandwidth_lo / 1e9:.1f}–{fit.bandwidth_hi / 1e9:.1f}) of a measured peak "
      f"{peak / 1e9:.1f} GB/s; R² {fit.r2:.3f} over {len(clean)} requests")
print(f"this model's decode step is {course:.0%} memory traffic here; an 8B model on an H100 must read "
      f"{step_8b / 1e9:.1f} GB per step ({gpu_memory_ms:.1f} ms at the datasheet bandwidth), so with this machine's fixed "
      f"cost per step it would be {gpu_memory_ms / (gpu_memory_ms + fit.overhead_s * 1e3):.0%} memory traffic")
if fit.bandwidth_hi < float("inf"):  # the slope is over one standard error above zero: the bytes measurably cost time
    assert fit.bandwidth <= peak, f"decode cannot move bytes faster than the measured peak {peak:.3g} B/s: the fit or the peak is wrong: {fit}"
else:
    print("The slope is within one standard error of zero: these models' bytes are too small a part of the step to "
          "measure on this machine (the step is the engine's fixed cost); wider models would resolve it.")
assert fit.bandwidth_lo <= peak and fit.overhead_s > 0, (fit, peak)

# %% [markdown]
# The slope's bandwidth is below the peak — no step beats memory — and the intercept is the part of the step no
# bandwidth would speed up. That is why "decode is memory-bound" needs a number: for a small model on a CPU much of
# the step is the engine's fixed cost; for an 8B model the bytes dominate, and more so on a GPU, whose engine runs the
# same step with far less per-step overhead (CUDA graphs) — the GPU sentence above uses this machine's overhead, an
# upper guess; run this section on a GPU (exercise 5) to measure it there.

# %% [markdown]
# ## Summary
#
# Written from this run's numbers:

# %%
from IPython.display import Markdown

longest, shortest = prompt_lengths[-1], prompt_lengths[0]
lowest = min(runs.ttft_over_bound.min(), runs.tpot_over_bound.min())
bound_sentence = kvlab.claim(lowest >= 1, f"No request beat its bound (lowest measured ÷ bound: TTFT {runs.ttft_over_bound.min():.2f}, TPOT {runs.tpot_over_bound.min():.2f}).",
                             f"The fastest prefill came within {1 - lowest:.0%} *under* its bound — inside the noise of measuring the peak on a shared machine (the check allows 10 %).")
tpot_change = med.tpot_s_p50.iloc[-1] / med.tpot_s_p50.iloc[0] - 1
decode_words = kvlab.claim(
    tpot_change > -0.15,
    "decode's pace hardly depended on the prompt" if abs(tpot_change) < 0.15 else
    f"decode slowed too, by {tpot_change:.0%} (each step reads the longer context's KV), but far less than prefill grew",
    f"TPOT *fell* {-tpot_change:.0%} — a longer context cannot speed a decode step up, so on this run the short prompts' "
    "decodes were slowed by something else (a busy machine: see the stalls below); rerun to measure it")


def pct(x):
    return f"{x:.0f} %"
Markdown(f"""
- This machine's ridge point is **{ridge:.1f} FLOP/byte** ({limits.dtype}), so prefill is **compute-bound from
  {from_tokens} prompt tokens** (an H100 in bf16: {roofline.ridge_point(gpu):.0f} FLOP/byte, from {gpu_cost.compute_bound_from(gpu)} tokens for this model).
- Going from {shortest:,} to {longest:,} prompt tokens ({length_ratio:.0f}×), median **TTFT grew {ttft_ratio:.1f}×**
  ({med.ttft_s_p50.iloc[0] * 1e3:.0f} → {med.ttft_s_p50.iloc[-1] * 1e3:.0f} ms) while median **TPOT changed {tpot_ratio:.2f}×**
  ({med.tpot_s_p50.iloc[0] * 1e3:.1f} → {med.tpot_s_p50.iloc[-1] * 1e3:.1f} ms): prefill sets TTFT; {decode_words}.
- Prefill reached **{eff.prefill_gflops.max():.0f} GFLOP/s**, {pct(eff['prefill % of matmul peak'].max())} of this machine's
  matmul peak ({limits.matmul_flops / 1e9:.0f} GFLOP/s). Decode moved **{eff.decode_gbs.median():.1f} GB/s**,
  {pct(eff['decode % of bandwidth peak'].median())} of the measured bandwidth ({limits.bandwidth / 1e9:.1f} GB/s).
  {bound_sentence}
- {'; '.join(f"for {n} output tokens prefill and decode take equal time at ≈ {c:,.0f} prompt tokens" if c else f"for {n} output tokens the phases do not cross between {shortest:,} and {longest:,} prompt tokens" for n, c in crossings.items())}.
- Streaming, the client saw TTFT {gap_ms.min():.1f}–{gap_ms.max():.1f} ms later than the engine's own figure; its ITL p95 was
  {streams.itl_p95_ms.max():.0f} ms against a median of {streams.itl_p50_ms.median():.0f} ms.
- Over {len(by_width)} widths of the same model, TPOT = **{fit.overhead_s * 1e3:.1f} ± {fit.overhead_se_s * 1e3:.1f} ms per step**
  + bytes ÷ **{fit.bandwidth / 1e9:.1f} GB/s** (peak {peak / 1e9:.1f} GB/s): this model's step is
  **{course:.0%} memory traffic** on this machine, the rest fixed cost.
- {kvlab.outliers.report(runs, ["ttft_s", "tpot_s"])}
""")

# %% [markdown]
# ## Exercises
#
# 1. Using the crossover plot: for a chat app whose answers average 200 tokens, which phase dominates at a 1,000-token
#    prompt? At an 8,000-token RAG prompt?
# 2. Prefill's achieved FLOP/s rises with prompt length. Why are short prompts less efficient? (Hint: how many tokens share
#    each read of the weights? Compare with the prompt length from which prefill is compute-bound here.)
# 3. Restart the engine with the other dtype (`dtype="float32"` if the environment report chose bfloat16, else
#    `dtype="bfloat16"`; or `enforce_eager=False` for a compiled engine — its first start takes a minute or two) and
#    re-run sections 3–4. Which percentage moves?
# 4. The TPOT bound grows with the prompt. Which term of `decode_step_bytes` causes that, and at what prompt length would it
#    equal the weights?
# 5. On a GPU, run section 7 (`prefill_decode.decode_by_width`) with your own model: how large is the fixed cost per step
#    there, and what share of an 8B model's step is memory traffic once it is measured rather than guessed?
