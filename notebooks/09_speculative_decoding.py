# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 09 · Making decode faster without a bigger batch: speculative decoding
#
# Lesson 02 showed that decode is bound by memory bandwidth: each step reads every weight to produce **one** token per
# sequence, and most of the machine's compute sits idle. Lesson 05 filled that idle compute with more sequences. The
# other lever is **speculative decoding**: guess several next tokens cheaply, check them all in **one** forward pass of
# the model, and keep the ones the model agrees with. When guesses are often right, one weight read yields several
# tokens.
#
# The guesser here is vLLM's **n-gram (prompt lookup) proposer**: it takes the longest suffix of the sequence so far
# (between `prompt_lookup_min` and `prompt_lookup_max` tokens) that occurred earlier in the prompt or output, finds its
# **earliest** earlier occurrence, and proposes the k tokens that followed it there — fewer if the sequence ends
# sooner, none if no suffix matches (`vllm/v1/spec_decode/ngram_proposer.py`, `method="ngram"`). It costs nothing to run, and it is right exactly when the answer copies the input — editing a
# document, refactoring code, extracting a quote. The model then verifies the k proposals and adds one token of its
# own; greedy decoding keeps the longest run it agrees with, so the answer should not change.
#
# You will: measure what verifying k + 1 tokens costs on this machine, run three tasks with speculation off and on,
# plot speed-up against acceptance rate, check the answers are the same, see what speculation does to ITL and TPOT,
# and find where it stops paying: bigger batches and low acceptance.

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()

# %% [markdown]
# ## 1. Why it can work: one pass over k + 1 tokens costs about one decode step
#
# A decode step over n new tokens reads the same weights as a step over one, and does n times the arithmetic; it also
# pays whatever a step costs regardless of its size (scheduling, launching kernels, the sampler). While the extra
# arithmetic stays small against those, verifying k + 1 tokens costs about what producing one does. Here: the
# machine's measured limits, the lower bound of one forward pass over 1 … k + 1 tokens after a cached context, and a
# measured **proxy** of the verify pass — the engine's prefill time for n new tokens whose context is cached. The proxy
# is a lower bound of a real verify step: prefill computes logits at one position where verifying needs all k + 1,
# and a verify step also runs the rejection sampler and the proposer.

# %%
import pandas as pd

from kvlab import roofline, speculative

ks = kvlab.pick([2, 4, 8], [2, 4])
limits = roofline.measure_limits(quick=kvlab.quick())
base = kvlab.make_engine(enforce_eager=True, max_model_len=2048, enable_prefix_caching=True)
cost, run_dtype = roofline.engine_cost(base), kvlab.engine.engine_dtype(base)
verify = speculative.verify_cost(base, max(ks) + 1, repeats=kvlab.pick(7, 5))
passes = verify.groupby("new_tokens").pass_s.agg(p50="median", p95=lambda s: s.quantile(0.95)).mul(1e3)
context = int(verify.context_tokens.iloc[0])
passes["bound_ms"] = [cost.forward_bound_s(n, context, limits) * 1e3 for n in passes.index]
passes["GFLOP"] = [cost.forward_flops(n, context) / 1e9 for n in passes.index]
passes.round(2)

# %%
import plotly.graph_objects as go

fig = go.Figure()
fig.add_scatter(x=passes.index, y=passes.p50, name="measured pass p50 (proxy: a lower bound of verify)", mode="lines+markers",
                error_y={"type": "data", "array": passes.p95 - passes.p50, "symmetric": False})
fig.add_scatter(x=passes.index, y=passes.bound_ms, name="lower bound (roofline)", mode="lines", line_dash="dash")
fig.add_scatter(x=passes.index, y=passes.p50.iloc[0] * passes.index, name="n separate decode steps", mode="lines",
                line_dash="dot")
fig.update_layout(title=f"One forward pass over n new tokens after {context} cached ones costs about one step",
                  xaxis_title="new tokens in the pass (n = k + 1 when verifying k proposals)", yaxis_title="time (ms)")
fig.show()

# %%
one, most = passes.p50.iloc[0], passes.p50.iloc[-1]
print(f"one pass over {passes.index[-1]} tokens: {most:.1f} ms vs {one:.1f} ms for 1 token ({most / one:.2f}×) — "
      f"{passes.index[-1]} separate steps would take {passes.index[-1] * one:.0f} ms; the bound is "
      f"{passes.bound_ms.iloc[0]:.1f} → {passes.bound_ms.iloc[-1]:.1f} ms")
assert most < passes.index[-1] * one / 2  # verifying k + 1 tokens costs well under k + 1 decode steps

# %% [markdown]
# Why is it nearly free? The usual answer is "decode is bound by reading the weights, and one read serves all k + 1
# tokens". That is what a large model on a GPU shows; check it against this machine's own numbers:

# %%
from kvlab import sizing

weight_ms = cost.weights_read(1) / limits.bandwidth * 1e3
gpu, llama8b = roofline.H100_SXM_BF16, roofline.ModelCost.from_config(sizing.load_preset("Llama-3.1-8B")["config"], 2, 2 * 32 * 8 * 128 * 2)
gpu_read_ms = llama8b.weights_read(1) / gpu.bandwidth * 1e3
gpu_verify_ms = llama8b.forward_bound_s(max(ks) + 1, context, gpu) * 1e3
print(f"Here: reading the weights once takes {weight_ms:.1f} ms at the measured bandwidth — {weight_ms / one:.0%} of the "
      f"measured one-token pass ({one:.1f} ms). The rest, {one - weight_ms:.1f} ms, is cost every step pays whatever its "
      f"size, and the k + 1 tokens share it as they share the weight read.")
print(f"On an {gpu.device} (datasheet limits, no overhead: a lower bound), Llama-3.1-8B's weights take {gpu_read_ms:.1f} ms "
      f"to read, and a pass over {max(ks) + 1} tokens after {context} cached ones is bounded by {gpu_verify_ms:.1f} ms: "
      f"there the weight read is what the tokens share.")

# %% [markdown]
# ## 2. Three tasks, speculation off
#
# - **edit**: "fix any typos in this paragraph and return it" — paragraphs of the Python reference (`data/text`); the
#   answer copies the input;
# - **code**: "add type hints to this function and return it" — functions of Python's own standard library;
# - **chat**: open questions — nothing in the prompt to copy.
#
# Greedy, each request alone, streamed chunk by chunk (TPOT from the first to the last chunk, ITL between chunks). The
# step model of section 6 is fitted first, on plain (non-speculative) steps of this model and engine settings (lesson
# 02's sweep; its saved calibration, made on another engine with the same settings, reused when there is one): it says how long the task runs will take, and the answers are capped at the longest
# length (96 tokens, 64 at least) that fits about a minute and a half here.

# %%
from kvlab import stepmodel

steps_model = stepmodel.calibrated(base, limits=limits)  # plain steps of this model and settings (section 6 uses it)
requests = kvlab.pick(3, 2)


def tasks_seconds(max_tokens: int) -> float:
    """The step model's time for every task's requests on each engine (k = 0 and each k; speculation only shortens it)."""
    return (1 + len(ks)) * len(speculative.TASKS) * requests * steps_model.run_seconds(1, 256, max_tokens)


max_tokens = kvlab.fit_to_time(kvlab.pick([96, 64], [64]), tasks_seconds, kvlab.pick(90.0, 30.0))
print(f"up to {max_tokens} output tokens per request: the task runs should take at most {tasks_seconds(max_tokens):.0f} s here")
steps_of = {k: stepmodel.StepRecorder(base) for k in [0]}  # every engine step, per k (the engines come below)
with steps_of[0].recording():
    runs = [speculative.time_tasks(base, list(speculative.TASKS), requests, max_tokens, k=0)]
runs[0].groupby("task")[["prompt_tokens", "output_tokens", "client_tpot_s"]].median().round(4)

# %% [markdown]
# ## 3. Speculation on: speed-up against acceptance rate
#
# First the proposer's rule on a list of ten token ids you can check by eye, with lookups of 2–4 tokens and k = 3:
# the suffixes `9 4 5 7` and `4 5 7` never occurred before, `5 7` did — at positions 0 and 4 — and vLLM takes the
# **earliest** occurrence, so it proposes `9 2 5` (what followed the first `5 7`), not `9 4 5` (what followed the
# latest).

# %%
tokens = [5, 7, 9, 2, 5, 7, 9, 4, 5, 7]
print(speculative.ngram_proposal(tokens, k=3), "from", tokens)
assert speculative.ngram_proposal(tokens, k=3) == [9, 2, 5]
assert speculative.ngram_proposal([1, 2, 3, 4], k=3) == []  # no suffix of 2-4 tokens occurred before: no draft

# %% [markdown]
# One engine per k (the speculative config is fixed when the engine starts), prompt lookup of 2–4 tokens. The
# engine's counters say how many proposed tokens it accepted (`vllm:spec_decode_num_accepted_tokens` ÷
# `…_num_draft_tokens`, `vllm/v1/spec_decode/metrics.py`) — but only over steps that had a draft
# (`Scheduler.make_spec_decoding_stats` records nothing for a step without one), and when no suffix matches, the
# proposer drafts nothing. So next to acceptance we report **coverage**: the share of decode steps that had a draft
# (drafts ÷ decode steps, a decode step being every stream chunk after the first). What a step yields is then
# **tokens per decode step** = 1 + accepted ÷ decode steps (the token every step samples, plus the drafts it accepted):
# if a verify step cost no more than a plain one, the speed-up would equal it. The speed-up is TPOT p50 with
# speculation off ÷ on.
# Two engines are compared, so their plain steps are too: every step is recorded, and where a speculative engine's
# plain steps (one token, no draft) run faster or slower than the plain engine's, that share of the speed-up belongs to
# the engine, not to the drafts — the check below says how much it was here.

# %%
batch_sizes, batch_k = kvlab.pick([1, 4, 16], [1, 8]), 4  # batches run with k = 4 (section 6)
edit_prompts = [kvlab.runtime.templates.chat_template_ids(base.get_tokenizer(), m) for m in speculative.task_messages("edit", 4)]
batches = [speculative.batch_run(base, edit_prompts, batch_sizes, 64, k=0)]
kvlab.close_engine(base)
for k in ks:
    eng = kvlab.make_engine(enforce_eager=True, max_model_len=2048, **speculative.ngram_config(k))
    steps_of[k] = stepmodel.StepRecorder(eng)
    with steps_of[k].recording():
        runs.append(speculative.time_tasks(eng, list(speculative.TASKS), requests, max_tokens, k=k))
    if k == batch_k:
        batches.append(speculative.batch_run(eng, edit_prompts, batch_sizes, 64, k=k))
    kvlab.close_engine(eng)
runs = pd.concat(runs, ignore_index=True)
table = speculative.speedups(runs)
table.round(3)

# %% tags=["key-figure"]
import plotly.express as px

spec = table[table.k > 0]
fig = px.scatter(spec, x="tokens_per_step", y="speedup", color="task", symbol=spec.k.astype(str), size_max=12,
                 hover_data=["acceptance_rate", "coverage"],
                 labels={"tokens_per_step": "tokens per decode step (1 + accepted ÷ decode steps)",
                         "speedup": "TPOT speed-up (off ÷ on)", "symbol": "k"},
                 title="Speculation pays where the answer copies the input: speed-up follows the tokens a step yields")
fig.update_traces(marker_size=12)
top_x = max(1.0, float(spec.tokens_per_step.max()))
fig.add_scatter(x=[1, top_x], y=[1, top_x], mode="lines", line_dash="dash", line_color="gray", name="free verification (y = x)")
fig.add_hline(y=1, line_dash="dot", annotation_text="no gain")
fig.show()

# %%
acc = spec.pivot_table(index="k", columns="task", values="acceptance_rate")
cov = spec.pivot_table(index="k", columns="task", values="coverage")
print("acceptance rate by task and k:\n" + acc.round(2).to_string())
print("coverage (steps with a draft ÷ decode steps) by task and k:\n" + cov.round(2).to_string())
assert ((cov >= 0) & (cov <= 1)).all().all(), cov
if kvlab.config.model_name() == kvlab.DEFAULT_MODEL:  # a model that copies its input; random weights do not
    assert (acc["edit"] > acc["chat"]).all() and (acc["code"] > acc["chat"]).all()
    assert (cov["edit"] > cov["chat"]).all(), cov  # an edit finds its suffix in the prompt far more often
else:
    print(f"(The check that edit and code beat chat is skipped: it holds for the course model, and this is {kvlab.config.model_name()}.)")
best = spec.loc[spec.speedup.idxmax()]
chat = spec[spec.task == "chat"]
print(f"best: {best.task} at k = {best.k}: acceptance {best.acceptance_rate:.0%}, TPOT {best.tpot_p50_ms:.1f} ms "
      f"({best.speedup:.2f}×); chat: acceptance {chat.acceptance_rate.min():.0%}–{chat.acceptance_rate.max():.0%}, "
      f"speed-up {chat.speedup.min():.2f}–{chat.speedup.max():.2f}×")
print(f"{best.task}, k = {best.k}: {best.tokens_per_step:.2f} tokens per decode step gave {best.speedup:.2f}× — "
      f"{best.speedup / best.tokens_per_step:.0%} of what free verification would give; "
      + ("the rest is what verifying cost" if best.speedup <= best.tokens_per_step else
         "more than its tokens alone: see each engine's plain step below"))
plain = pd.Series({k: stepmodel.plain_decode_ms(r.steps) for k, r in steps_of.items()})  # one token, no draft
engine_gain = plain[0] / plain[ks]  # per k: > 1 where the speculative engine's own plain steps are faster
print("a plain step (one sequence, one token, no draft), median ms, by k:", plain.round(1).to_dict())
kvlab.claim(bool(engine_gain.between(0.95, 1.05).all()), "the speculative engines' plain steps cost what the plain engine's do",
            f"the speculative engines' plain steps took {plain[ks].min():.1f}–{plain[ks].max():.1f} ms against {plain[0]:.1f} ms "
            f"without speculation: up to {engine_gain.max() - 1:+.0%} of each speed-up is the engine, not the drafts", show=True)
per_request = speculative.request_speedups(runs)  # each request against itself at k = 0, its own steps' tokens
# free verification at its engine's speed; a slower plain step is not held against the drafts: a speculative run has
# few plain steps, so that side is noise (measured once, float32, busy machine: 47.7 against 38.0 ms at k = 2)
ceiling = per_request.tokens_per_step * per_request.k.map(engine_gain.clip(lower=1.0))
beyond = per_request[per_request.speedup > 1.1 * ceiling]  # a step yields no more than its tokens, beyond noise
kvlab.claim(beyond.empty, "no request's speed-up exceeded its tokens per step (at its engine's plain-step speed)",
            f"{len(beyond)} of {len(per_request)} requests beat free verification by over 10 % — TPOT noise", show=True)
if kvlab.config.model_name() == kvlab.DEFAULT_MODEL:  # enough tokens per request for TPOT to be steady
    ratio = per_request.speedup / ceiling  # above 1: faster than free verification (measured: up to 1.16 on chat)
    assert ratio.median() <= 1.05 and ratio.max() <= 1.3, per_request.assign(ceiling=ceiling)

# %% [markdown]
# ### A verify step, term by term
#
# Every step of every engine was recorded. A step that verifies drafts processes 1 + d tokens for its sequence (d ≤ k
# drafted). The step model — fitted on this machine's plain steps, before speculation — splits each into its terms; a
# verify step also runs the proposer and the rejection sampler, which the model does not know, so any gap between its
# prediction and the measurement is theirs and noise's.

# %%
def tokens_per_step(step):  # one sequence decoding or verifying: its tokens this step; else left out
    return step.tokens if len(step.sequences) == 1 and step.sequences[0][1] > 0 else None


verify = stepmodel.attribution_by(steps_model, [s for k in steps_of for s in steps_of[k].steps], tokens_per_step, "tokens per step")
stepmodel.attribution_figure(verify, "tokens per step", "A decode or verify step, term by term: predicted (bars), measured (◆)").show()
verify.round(2)

# %%
v1, vk = verify.iloc[0], verify.iloc[-1]
print(f"1 token per step: {v1.measured_ms:.1f} ms measured ({(v1['fixed'] + v1['per-sequence']) / v1.predicted_ms:.0%} fixed cost, "
      f"{v1['weight reads'] / v1.predicted_ms:.0%} weight reads); {int(vk['tokens per step'])} tokens per step: {vk.measured_ms:.1f} ms "
      f"({vk.measured_ms / v1.measured_ms:.2f}×, predicted {vk.predicted_ms / v1.predicted_ms:.2f}×) — the extra tokens share the fixed "
      f"cost and the weight read; the proposer and rejection sampler add {vk.measured_ms - vk.predicted_ms:+.1f} ms beyond the model "
      f"(the H100 case, a lower bound: section 1).")

# %% [markdown]
# ## 4. Same answers?
#
# Greedy speculation keeps only what the model itself would have produced — in exact arithmetic. The verifying pass
# computes several positions at once, which sums floating-point numbers in another order than one-at-a-time decoding;
# when two candidate tokens are nearly tied the other one can win, and the answers part from there. How often depends
# on the precision: bfloat16 keeps 8 bits of mantissa, float32 24. So we count twice: in this run's dtype, and — where
# that is not float32 — in float32 on the first request of each task (two more small engines). Where an answer differs, the first
# differing position is shown.

# %%
same = pd.concat([speculative.same_outputs(runs[runs.k == 0], runs[runs.k == k]).assign(k=k) for k in ks], ignore_index=True)
share = same.identical.mean()
print(f"{run_dtype}: {same.identical.sum()} of {len(same)} answers identical token for token ({share:.0%})")
exact = same if run_dtype == "float32" else speculative.identity_check("float32", 4, list(speculative.TASKS), 1, max_tokens)
exact_share = exact.identical.mean()
print(f"float32: {exact.identical.sum()} of {len(exact)} identical ({exact_share:.0%})")
differ = same[~same.identical]
differ if len(differ) else print("no answer differs: nothing to show")

# %%
assert exact_share >= 0.9  # in float32 a near-tie is rare; in 16-bit formats the rounding decides more often

# %% [markdown]
# ## 5. What it does to the metrics: ITL is no longer TPOT
#
# With speculation a chunk of the stream carries every token accepted in one step. The gap between chunks (ITL, as
# vLLM's `bench serve` records it: one gap per chunk) then covers several tokens, while TPOT still divides the decode
# time by the tokens. A tool that reports per-chunk gaps as "inter-token latency" now overstates the time per token —
# lesson 02's table of names (AIPerf's `inter_chunk_latency` is the gap; its `inter_token_latency` is TPOT).

# %%
edit_k = max(ks)
streams = runs[(runs.task == "edit") & runs.k.isin([0, edit_k])]
gaps = streams[["k", "itl_s"]].explode("itl_s").astype({"itl_s": float})
chunks = streams[["k", "chunk_tokens"]].explode("chunk_tokens").astype({"chunk_tokens": int})
per_k = pd.DataFrame({"TPOT p50 (ms)": streams.groupby("k").client_tpot_s.median() * 1e3,
                      "mean ITL (ms, pooled like vLLM bench)": gaps.groupby("k").itl_s.mean() * 1e3,
                      "ITL p95 (ms)": gaps.groupby("k").itl_s.quantile(0.95) * 1e3,
                      "tokens per chunk (mean)": chunks.groupby("k").chunk_tokens.mean()})
per_k.round(2)

# %%
fig = px.histogram(gaps.assign(itl_ms=gaps.itl_s * 1e3, k=gaps.k.astype(str)), x="itl_ms", color="k", barmode="overlay",
                   nbins=60, histnorm="percent", labels={"itl_ms": "gap between stream chunks (ms)", "k": "k"},
                   title=f"edit task: with k = {edit_k} the stream comes in bursts — fewer, larger chunks, longer gaps")
fig.update_layout(yaxis_title="share of that k's gaps (%)")  # normalised: speculation has fewer gaps to count
fig.show()

# %%
on = per_k.loc[edit_k]
print(f"k = {edit_k}: {on['tokens per chunk (mean)']:.2f} tokens per chunk; mean ITL {on['mean ITL (ms, pooled like vLLM bench)']:.1f} ms "
      f"vs TPOT {on['TPOT p50 (ms)']:.1f} ms; without speculation: {per_k.loc[0, 'mean ITL (ms, pooled like vLLM bench)']:.1f} "
      f"vs {per_k.loc[0, 'TPOT p50 (ms)']:.1f} ms")
if on["tokens per chunk (mean)"] > 1.2:  # drafts were accepted: the stream comes in bursts, so ITL per chunk > TPOT
    assert on["mean ITL (ms, pooled like vLLM bench)"] > on["TPOT p50 (ms)"], per_k
else:  # the course model copies its input; a model that does not (random weights) accepts few drafts
    assert kvlab.config.model_name() != kvlab.DEFAULT_MODEL, per_k
    print(f"(The burst check is skipped: {kvlab.config.model_name()} accepted too few drafts for bursts, "
          f"{on['tokens per chunk (mean)']:.2f} tokens per chunk.)")

# %% [markdown]
# ## 6. When it hurts: bigger batches and low acceptance
#
# Speculation spends idle compute. A batch spends it too: with B sequences, a step already does B tokens of work per
# weight read, and verifying k + 1 tokens for each multiplies that by k + 1 — past the ridge point the pass becomes
# compute-bound and stops being free. The edit prompts, submitted together in batches of several sizes, speculation off
# and on (64 output tokens each):

# %%
batch_runs = pd.concat(batches, ignore_index=True)
by_batch = speculative.speedups(batch_runs, by=("batch_size",))
fig = px.line(by_batch[by_batch.k > 0], x="batch_size", y="speedup", markers=True, log_x=True,
              labels={"batch_size": "sequences in the batch", "speedup": "TPOT speed-up (off ÷ on)"},
              title=f"The gain of speculation (k = {batch_k}) as the batch grows (edit task)")
fig.add_hline(y=1, line_dash="dot", annotation_text="no gain")
fig.show()
by_batch.round(3)

# %%
gains = by_batch[by_batch.k > 0].set_index("batch_size").speedup
print(f"speed-up at batch {gains.index[0]}: {gains.iloc[0]:.2f}×; at batch {gains.index[-1]}: {gains.iloc[-1]:.2f}× "
      f"({kvlab.claim(gains.iloc[-1] < gains.iloc[0], 'speculation gained less in the larger batch', 'speculation gained no less in the larger batch on this run')}); chat (low acceptance) at batch 1: "
      f"{chat.speedup.min():.2f}–{chat.speedup.max():.2f}×")

# %% [markdown]
# ## Summary
#
# Written from this run's numbers:

# %%
from IPython.display import Markdown

free_words = kvlab.claim(most / one < 1.5, "verifying proposals is nearly free", f"verifying proposals costs {most / one:.1f} one-token passes, "
                         f"still well under {passes.index[-1]}")
share_words = (f"the tokens share what every step pays: here the weight read is {weight_ms / one:.0%} of a one-token pass and the "
               f"rest is fixed per-step cost; on an {gpu.device}, Llama-3.1-8B's weight read ({gpu_read_ms:.1f} ms, a lower "
               "bound) is what they share")
Markdown(f"""
- One forward pass over {passes.index[-1]} new tokens took **{most:.1f} ms** against {one:.1f} ms for one
  ({most / one:.2f}×): {free_words}, because {share_words}.
- Acceptance rate (engine counters) at k = {edit_k}: edit {acc.loc[edit_k, 'edit']:.0%}, code {acc.loc[edit_k, 'code']:.0%},
  chat {acc.loc[edit_k, 'chat']:.0%}. The best speed-up was **{best.speedup:.2f}×** ({best.task}, k = {best.k}); chat
  got {chat.speedup.min():.2f}–{chat.speedup.max():.2f}×.
- {same.identical.sum()} of {len(same)} greedy answers were identical token for token with and without speculation in
  {run_dtype}{'' if run_dtype == 'float32' else f'; in float32 {exact.identical.sum()} of {len(exact)} — the verify pass rounds differently, and 16-bit rounding flips near-ties'}.
- With speculation the edit task's stream carried {on['tokens per chunk (mean)']:.2f} tokens per chunk: mean ITL
  {on['mean ITL (ms, pooled like vLLM bench)']:.1f} ms against TPOT {on['TPOT p50 (ms)']:.1f} ms — per-chunk and
  per-token metrics part ways.
- In batches the gain went {gains.iloc[0]:.2f}× (batch {gains.index[0]}) → {gains.iloc[-1]:.2f}× (batch {gains.index[-1]}).
""")

# %% [markdown]
# ## Exercises
#
# 1. Section 3: which k gave the best speed-up on the code task, and why does a larger k not always help (look at the
#    per-position acceptance: `speculative.counters(engine)["accepted_per_position"]`)?
# 2. Add a task of your own to `speculative.task_messages` — say, "extract every sentence that mentions a list" —
#    and predict its acceptance before you run it.
# 3. Section 6: at what batch size would you turn speculation off on this machine? Work out from section 1's
#    roofline at which batch × (k + 1) the verifying pass becomes compute-bound (`roofline.ridge_point(limits)`).
