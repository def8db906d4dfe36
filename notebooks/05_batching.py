# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · Batching — throughput against latency
#
# Decode is bound by memory bandwidth: each step reads all the weights to produce **one** token per sequence. Run many
# sequences in the same step and that one read of the **weights** serves all of them — throughput rises almost for free.
# Not the KV cache: every sequence still reads its *own* keys and values each step, so the gain shrinks as contexts grow
# and those reads take over, and it stops when compute or the KV budget runs out. The cost lands on latency: every
# request in a bigger batch waits for more work per step (TPOT) and for more prompts ahead of it (TTFT).
#
# You will measure: offline batches from 1 to many sequences — at a short and at a long context —, continuous arrivals at
# rising rates, and the point where the KV budget — lesson 01's number — caps how many sequences can run at once.

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()

# %% [markdown]
# ## 1. Offline batches
#
# B distinct prompts submitted together, exactly the same number of output tokens each, prefix cache emptied before each
# batch, a warm-up batch first, several repeats. *Decode throughput* = B ÷ TPOT: tokens per second while all B sequences
# decode together (valid only when they all fit at once — section 3 — and when all their prompts are prefilled in one
# step: the engine's per-step token budget is raised to 8,192 so no prompt's prefill chunk lands among the decode steps). *Output throughput* = the batch's output tokens ÷ its
# wall time, prefill and any waiting included.

# %%
import pandas as pd
import plotly.express as px

from kvlab import batching, roofline, timing

llm = kvlab.make_engine(enable_prefix_caching=False, max_num_batched_tokens=8192)  # a whole batch's prompts in one step
batch_sizes = kvlab.pick([1, 4, 8, 16, 32, 64], [1, 8, 16])
prompt_tokens, output_tokens = 128, kvlab.pick(64, 32)
batches = batching.batch_sweep(llm, batch_sizes, prompt_tokens, output_tokens, repeats=2)
summary = batching.batch_summary(batches)
summary.round(3)

# %% tags=["key-figure"]
from plotly.subplots import make_subplots

fig = make_subplots(specs=[[{"secondary_y": True}]])
fig.add_scatter(x=summary.batch_size, y=summary.decode_tok_s, name="decode throughput (tok/s)", mode="lines+markers", secondary_y=False)
fig.add_scatter(x=summary.batch_size, y=summary.ttft_s_p50 * 1e3, name="TTFT median (ms)", mode="lines+markers", line_dash="dot", secondary_y=True)
fig.add_scatter(x=summary.batch_size, y=summary.tpot_s_p50 * 1e3, name="TPOT median (ms)", mode="lines+markers", line_dash="dash", secondary_y=True)
fig.update_xaxes(type="log", title_text="batch size (sequences, log)")
fig.update_yaxes(title_text="tokens per second", secondary_y=False)
fig.update_yaxes(title_text="latency (ms)", secondary_y=True)
fig.update_layout(title="Bigger batches: throughput rises, and so do TTFT and TPOT", height=440)
fig.show()

# %%
b = summary.set_index("batch_size")
first, last = batch_sizes[0], batch_sizes[-1]
gain = b.decode_tok_s[last] / b.decode_tok_s[first]
print(f"batch {last} vs {first}: decode throughput {gain:.1f}×, TTFT {b.ttft_s_p50[last] / b.ttft_s_p50[first]:.1f}×, TPOT {b.tpot_s_p50[last] / b.tpot_s_p50[first]:.1f}×")
assert gain >= 2, gain
assert b.ttft_s_p50[last] > b.ttft_s_p50[first]

# %% [markdown]
# ### Batching shares the weights, not the KV cache
#
# One decode step of B sequences must read the weights once, but each sequence's KV cache of its whole context:
# `bytes = weights + B × KV bytes per token × context` (`roofline.ModelCost.batch_decode_step_bytes`). At a short
# context the weights dominate the bytes and B sequences cost little more than one; at a long context the KV term
# grows with B, and the gain from batching levels off.
#
# Bytes are not the whole step, though. First, how much of a batch-1 step here is the weight read at all — measured
# against this machine's bandwidth (in a fresh process, as lesson 02 does) — and what the same arithmetic says for an
# 8B model on a GPU:

# %%
from kvlab import sizing

cost = roofline.engine_cost(llm)
bandwidth = roofline.measure_limits(quick=kvlab.quick(), matmul=False).bandwidth
weight_ms, step_ms = cost.weights_read(1) / bandwidth * 1e3, b.tpot_s_p50[first] * 1e3
gpu, llama8b = roofline.H100_SXM_BF16, roofline.ModelCost.from_config(sizing.load_preset("Llama-3.1-8B")["config"], 2, 2 * 32 * 8 * 128 * 2)
gpu_ms = llama8b.weights_read(1) / gpu.bandwidth * 1e3
print(f"Here: a batch-{first} decode step took {step_ms:.1f} ms (median); reading the weights once takes {weight_ms:.1f} ms at "
      f"{bandwidth / 1e9:.0f} GB/s — {weight_ms / step_ms:.0%} of the step. The other {step_ms - weight_ms:.1f} ms is paid by every "
      f"step whatever its size (scheduling, kernel launches, sampling), so on this machine batching's gain comes mostly from "
      f"sharing that fixed cost, and only partly from sharing the weight read.")
print(f"On an {gpu.device} (datasheet bandwidth, no overhead: a lower bound), Llama-3.1-8B's weights take {gpu_ms:.1f} ms to "
      f"read per step: there the weight read is the step, and it is what a batch shares.")

# %%
long_prompt = 1024
long_sizes = [1, 8]
long_batches = batching.batch_sweep(llm, long_sizes, long_prompt, output_tokens, repeats=kvlab.pick(2, 1))
long_summary = batching.batch_summary(long_batches)
rows = []
for context, table in ((prompt_tokens, summary), (long_prompt, long_summary)):
    base = table.set_index("batch_size").decode_tok_s[1]
    mid = context + output_tokens / 2  # the average context a decode step reads
    for r in table.itertuples():
        rows.append({"prompt tokens": context, "batch size": r.batch_size, "measured gain": r.decode_tok_s / base,
                     "bandwidth model": r.batch_size * cost.batch_decode_step_bytes(1, mid) / cost.batch_decode_step_bytes(r.batch_size, mid),
                     "KV share of the step's bytes": r.batch_size * cost.kv_bytes_per_token * mid / cost.batch_decode_step_bytes(r.batch_size, mid)})
gains = pd.DataFrame(rows)
gains.round(2)

# %%
px.line(gains, x="batch size", y=["measured gain", "bandwidth model"], color="prompt tokens", markers=True, line_dash="variable",
        title="Decode throughput ÷ batch 1: batching pays less at long context (each sequence reads its own KV)",
        labels={"value": "decode throughput relative to batch 1", "batch size": "batch size (sequences)"}).show()
top = max(long_sizes)
g = gains.set_index(["prompt tokens", "batch size"])["measured gain"]
print(f"batch {top}: decode throughput ×{g[prompt_tokens, top]:.1f} at {prompt_tokens}-token prompts, ×{g[long_prompt, top]:.1f} at {long_prompt:,}")
assert g[long_prompt, top] < g[prompt_tokens, top], "the long context should gain less from batching"

# %% [markdown]
# ## 2. Continuous arrivals
#
# A server doesn't get batches; it gets arrivals. vLLM's *continuous batching* adds new requests to the running batch at
# every step. Here, the same number of requests arrive as a Poisson process at rising rates: the faster they come, the more
# run at once — throughput rises, and so does each request's latency.

# %%
from transformers import AutoTokenizer

from kvlab import workload

tok = AutoTokenizer.from_pretrained(kvlab.resolve_model())
rates = kvlab.pick([2, 4, 10, 32], [1, 16])  # the lowest rate sets the wall time: 24 requests at 2/s take 12 s or more
n_requests = kvlab.pick(24, 12)
rows = []
for rate in rates:
    _, reqs = workload.run_workload(llm, workload.poisson_arrivals(tok, n_requests, rate, prompt_tokens, output_tokens, seed=4))
    reqs["tpot_s"] = (reqs.last_token_s - reqs.first_token_s) / (reqs.output_tokens - 1)
    span = reqs.last_token_s.max() - reqs.arrival_s.min()
    rows.append({"arrival rate (req/s)": rate, "mean requests in flight": workload.concurrency(reqs),
                 "output throughput (tok/s)": reqs.output_tokens.sum() / span,
                 "TTFT p50 (ms)": reqs.ttft_s.median() * 1e3, "TTFT p95 (ms)": timing.p95(reqs.ttft_s) * 1e3,
                 "TPOT p50 (ms)": reqs.tpot_s.median() * 1e3, "TPOT p95 (ms)": timing.p95(reqs.tpot_s) * 1e3})
arrivals = pd.DataFrame(rows)
arrivals.round(1)

# %%
px.line(arrivals, x="mean requests in flight", y=["output throughput (tok/s)", "TPOT p50 (ms)", "TTFT p50 (ms)"], markers=True, log_y=True,
        title="Continuous batching: more in flight → more throughput, slower tokens", labels={"value": "tok/s or ms (log)", "variable": ""}).show()

# %% [markdown]
# ## 3. When the KV cache caps the batch
#
# Every running sequence holds KV blocks (lesson 01). With a small KV budget only a few sequences fit; the scheduler keeps
# the rest waiting, and if running sequences grow past the budget it **preempts** one — another running request, the
# last admitted — freeing its blocks; admitted again later, it finds part of its prompt in the prefix cache and
# recomputes the rest (lesson 08 counts both).
# We give a second engine a budget of a few blocks and predict, from lesson 01's arithmetic, how many sequences fit.

# %%
kvlab.close_engine(llm)
tight = kvlab.make_engine(enable_prefix_caching=False, enforce_eager=True, max_model_len=1024, kv_cache_gib=0.05)
cap = kvlab.kv_capacity(tight)
blocks_per_seq = kvlab.sizing.blocks_needed(prompt_tokens + output_tokens, cap.block_size)  # whole blocks, rounded up
predicted = kvlab.sizing.sequences_that_fit(cap.num_blocks, cap.block_size, prompt_tokens + output_tokens)
print(f"{cap}\neach sequence needs {blocks_per_seq} blocks → at most {predicted} sequences at once")
capped = batching.batch_sweep(tight, [predicted, 4 * predicted], prompt_tokens, output_tokens, repeats=1)
capped_summary = batching.batch_summary(capped)
capped_summary[["batch_size", "ttft_s_p50", "ttft_s_p95", "tpot_s_p50", "output_tok_s", "preemptions"]].round(3)

# %%
cs = capped_summary.set_index("batch_size")
waits = capped[capped.batch_size == 4 * predicted].queue_s
capped_gain = cs.output_tok_s[4 * predicted] / cs.output_tok_s[predicted]
print(f"{4 * predicted} sequences on a budget for {predicted}: median queue {waits.median() * 1e3:.0f} ms, max {waits.max() * 1e3:.0f} ms, "
      f"{int(cs.preemptions[4 * predicted])} preemptions; output throughput {cs.output_tok_s[4 * predicted]:.0f} vs "
      f"{cs.output_tok_s[predicted]:.0f} tok/s at {predicted} ({capped_gain:.1f}×, for 4× the demand)")
assert cs.ttft_s_p95[4 * predicted] > cs.ttft_s_p95[predicted]
kvlab.close_engine(tight)

# %% [markdown]
# ## Summary
#
# Written from this run's numbers:

# %%
from IPython.display import Markdown

Markdown(f"""
- From batch {first} to batch {last}, decode throughput rose **{gain:.1f}×** ({b.decode_tok_s[first]:.0f} → {b.decode_tok_s[last]:.0f} tok/s)
  while median TPOT went {b.tpot_s_p50[first] * 1e3:.0f} → {b.tpot_s_p50[last] * 1e3:.0f} ms and median TTFT
  {b.ttft_s_p50[first] * 1e3:.0f} → {b.ttft_s_p50[last] * 1e3:.0f} ms: the batch helps the machine, each user waits longer.
- A batch-{first} step took {step_ms:.1f} ms here, of which reading the weights is {weight_ms:.1f} ms ({weight_ms / step_ms:.0%}):
  most of what a batch shares on this machine is a fixed per-step cost; for an 8B model on an {gpu.device} the weight
  read alone is {gpu_ms:.1f} ms per step.
- Batching shares the weight read, not the KV reads: at batch {top}, decode throughput grew **×{g[prompt_tokens, top]:.1f}** with
  {prompt_tokens}-token prompts but only **×{g[long_prompt, top]:.1f}** with {long_prompt:,}-token prompts, where each sequence's own KV
  made up {gains.set_index(["prompt tokens", "batch size"])["KV share of the step's bytes"][long_prompt, top]:.0%} of the step's bytes (bandwidth model:
  ×{gains.set_index(["prompt tokens", "batch size"])["bandwidth model"][prompt_tokens, top]:.1f} and ×{gains.set_index(["prompt tokens", "batch size"])["bandwidth model"][long_prompt, top]:.1f}).
- With continuous arrivals, {arrivals['mean requests in flight'].iloc[-1]:.1f} requests in flight gave
  {arrivals['output throughput (tok/s)'].iloc[-1]:.0f} tok/s against {arrivals['output throughput (tok/s)'].iloc[0]:.0f} tok/s at
  {arrivals['mean requests in flight'].iloc[0]:.1f} in flight; TTFT p95 went {arrivals['TTFT p95 (ms)'].iloc[0]:.0f} →
  {arrivals['TTFT p95 (ms)'].iloc[-1]:.0f} ms.
- A {cap.tokens:,}-token KV budget fits **{predicted}** sequences of {prompt_tokens + output_tokens} tokens (lesson 01's arithmetic);
  sending {4 * predicted} made the extra ones queue (median {waits.median() * 1e3:.0f} ms) with
  {int(cs.preemptions[4 * predicted])} preemptions; 4× the demand gave only {capped_gain:.1f}× the output throughput
  ({cs.output_tok_s[predicted]:.0f} → {cs.output_tok_s[4 * predicted]:.0f} tok/s), and p95 TTFT went
  {cs.ttft_s_p95[predicted] * 1e3:.0f} → {cs.ttft_s_p95[4 * predicted] * 1e3:.0f} ms.
""")

# %% [markdown]
# ## Exercises
#
# 1. Where does decode throughput stop growing on this machine? What limit has it reached (lesson 02)?
# 2. With `roofline.ModelCost.from_config(kvlab.sizing.load_preset("Llama-3.1-8B")["config"], 2, 131072)` and its
#    `batch_decode_step_bytes`, find the context length at which an 8B model's KV reads (bf16, 8 KV heads
#    of 128) equal its weight reads at batch 32. What does batching still buy beyond it?
# 3. Your SLO is TTFT p95 < 1 s. What is the largest arrival rate that meets it here?
# 4. Double `kv_cache_gib` of the tight engine. Predict the new number of sequences before you run it.
