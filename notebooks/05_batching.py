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
# sequences in the same step and that one read serves all of them — throughput rises almost for free, until compute or the
# KV cache runs out. The cost lands on latency: every request in a bigger batch waits for more work per step (TPOT) and
# for more prompts ahead of it (TTFT).
#
# You will measure: offline batches from 1 to many sequences, continuous arrivals at rising rates, and the point where the
# KV budget — lesson 01's number — caps how many sequences can run at once.

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()

# %% [markdown]
# ## 1. Offline batches
#
# B distinct prompts submitted together, exactly the same number of output tokens each, prefix cache emptied before each
# batch, a warm-up batch first, several repeats. *Decode throughput* = B ÷ TPOT: tokens per second while all B sequences
# decode together (valid only when they all fit at once — section 3). *Output throughput* = the batch's output tokens ÷ its
# wall time, prefill and any waiting included.

# %%
from kvlab import experiments, timing

llm = kvlab.make_engine(enable_prefix_caching=False)
batch_sizes = kvlab.pick([1, 2, 4, 8, 16, 32, 64], [1, 4, 16])
prompt_tokens, output_tokens = 128, kvlab.pick(64, 32)
batches = experiments.batch_sweep(llm, batch_sizes, prompt_tokens, output_tokens, repeats=kvlab.pick(3, 2))
summary = experiments.batch_summary(batches)
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
# ## 2. Continuous arrivals
#
# A server doesn't get batches; it gets arrivals. vLLM's *continuous batching* adds new requests to the running batch at
# every step. Here, the same number of requests arrive as a Poisson process at rising rates: the faster they come, the more
# run at once — throughput rises, and so does each request's latency.

# %%
import pandas as pd
from transformers import AutoTokenizer

from kvlab import workload

tok = AutoTokenizer.from_pretrained(kvlab.resolve_model())
rates = kvlab.pick([0.5, 2, 8, 32], [1, 16])
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
import plotly.express as px

px.line(arrivals, x="mean requests in flight", y=["output throughput (tok/s)", "TPOT p50 (ms)", "TTFT p50 (ms)"], markers=True, log_y=True,
        title="Continuous batching: more in flight → more throughput, slower tokens", labels={"value": "tok/s or ms (log)", "variable": ""}).show()

# %% [markdown]
# ## 3. When the KV cache caps the batch
#
# Every running sequence holds KV blocks (lesson 01). With a small KV budget only a few sequences fit; the scheduler keeps
# the rest waiting, and if running sequences grow past the budget it **preempts** one (frees its blocks, recomputes later).
# We give a second engine a budget of a few blocks and predict, from lesson 01's arithmetic, how many sequences fit.

# %%
kvlab.close_engine(llm)
tight = kvlab.make_engine(enable_prefix_caching=False, enforce_eager=True, max_model_len=1024, kv_cache_gib=0.05)
cap = kvlab.kv_capacity(tight)
blocks_per_seq = -(-(prompt_tokens + output_tokens) // cap.block_size)  # ceil: whole blocks
predicted = cap.num_blocks // blocks_per_seq
print(f"{cap}\neach sequence needs {blocks_per_seq} blocks → at most {predicted} sequences at once")
capped = experiments.batch_sweep(tight, [predicted, 4 * predicted], prompt_tokens, output_tokens, repeats=1)
capped_summary = experiments.batch_summary(capped)
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
# 2. Your SLO is TTFT p95 < 1 s. What is the largest arrival rate that meets it here?
# 3. Double `kv_cache_gib` of the tight engine. Predict the new number of sequences before you run it.
