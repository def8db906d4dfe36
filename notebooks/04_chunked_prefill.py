# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Chunked prefill — who waits for whom
#
# An engine runs one step at a time, and every running request shares it. A long prefill — a document ingest, a RAG prompt
# — is a lot of work for one step: while it runs, every user who is streaming an answer waits for their next token.
# **Chunked prefill** splits a long prompt into pieces, so the decoders' tokens keep flowing between pieces. Each step
# has one token budget, `max_num_batched_tokens`, shared by every request in it: vLLM's scheduler serves the
# *running* requests first — each decoding user takes its one token — and a prefill chunk gets what is left of the
# budget (`vllm/v1/core/sched/scheduler.py`, "First, schedule the RUNNING requests"). The price: the long prompt
# itself takes more steps to its first token.
#
# You will measure that trade-off on a real engine: a few chat users streaming, one long prompt arriving mid-stream,
# with chunked prefill off and with several token budgets; then a short prompt stuck behind a long one.

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()

# %% [markdown]
# ## 1. The workload
#
# `kvlab.workload` drives the engine step by step, the way a server's engine loop does: before each step it admits the
# requests whose arrival time has come; after each step it timestamps every new token. Several **decoders** (short chat
# prompts, long answers) start at t = 0; the **long prompt** arrives a moment later. Every configuration below runs the same
# workload on its own engine — eager mode, since we compare scheduling, not kernels.

# %%
from transformers import AutoTokenizer

from kvlab import chunked_prefill, workload

tok = AutoTokenizer.from_pretrained(kvlab.resolve_model())
decoders, decoder_tokens = kvlab.pick(4, 3), kvlab.pick(96, 48)
context = kvlab.model.fit_context(8192)  # 8,192 tokens, or the model's own context where it is shorter
long_options = [n for n in kvlab.pick([3072, 2048, 1536], [2048, 1536, 1024]) if n <= context - 64] or [context - 64]
long_target_s = kvlab.pick(8.0, 6.0)  # the long prompt's prefill with chunking off, at most, where the machine allows
budgets = kvlab.pick([256, 1024, 2048], [256, 1024])
configs = {"chunked off": {"enable_chunked_prefill": False}}
configs |= {f"chunks of {b}": {"enable_chunked_prefill": True, "max_num_batched_tokens": b} for b in budgets}
configs[f"chunks of {max(budgets)} + long threshold 256"] = {"enable_chunked_prefill": True, "max_num_batched_tokens": max(budgets),
                                                             "long_prefill_token_threshold": 256}
print(f"{decoders} decoders × {decoder_tokens} tokens from t=0; a long prompt of {' or '.join(f'{n:,}' for n in long_options)} "
      f"tokens once they stream (its length and time set from this machine's speed below); {len(configs)} engine configurations")

# %% [markdown]
# ## 2. Run every configuration
#
# For each configuration: start its engine, run the interference workload and the short-behind-long workload (section 5),
# close the engine. A progress bar counts configurations. The long prompt's arrival time is set from this machine's
# speed (on the first engine): once every decoder has streamed a few tokens, so "their gaps before it" exist on any CPU.
# So is its length: the longest of the options above whose one-step prefill is forecast within the target, from one
# timed prefill of the shortest (a slower CPU gets a shorter document, the same comparison).

# %%
import pandas as pd
from tqdm.auto import tqdm

results, timelines, behind = [], {}, []
for name, args in tqdm(configs.items(), desc="configurations"):
    llm = kvlab.make_engine(enforce_eager=True, max_model_len=context, **args)
    if name == "chunked off":  # the first engine: when do the decoders stream on this machine?
        long_at = chunked_prefill.arrival_once_streaming(llm, tok, decoders, 64, decoder_tokens)
        long_tokens, probe_s = chunked_prefill.long_prompt_for_time(llm, tok, long_options, long_target_s)
        print(f"a {min(long_options):,}-token prefill took {probe_s:.2f} s here → a {long_tokens:,}-token long prompt (its "
              f"prefill forecast within {long_target_s:.0f} s), arriving at t = {long_at:.2f} s, once every decoder is streaming")
    tokens, reqs = workload.run_workload(llm, chunked_prefill.interference_arrivals(tok, decoders, 64, decoder_tokens, long_tokens, long_at))
    results.append({"config": name} | chunked_prefill.interference_summary(tokens, reqs))
    timelines[name] = (tokens, reqs)
    _, short = workload.run_workload(llm, chunked_prefill.short_behind_long_arrivals(tok, long_tokens, 32, 0.05))
    behind.append({"config": name} | short.set_index("label").ttft_s.mul(1e3).add_suffix(" TTFT (ms)").to_dict())
    kvlab.close_engine(llm)
summary = pd.DataFrame(results)
summary.round(1)

# %% [markdown]
# ## 3. The stall, token by token
#
# With chunked prefill off, the long prompt's whole prefill is one step: every decoder's next token waits for it.

# %%
chunked_prefill.token_timeline(*timelines["chunked off"], "Chunked prefill off: decoders stop while the long prompt is prefilled").show()
smallest = f"chunks of {min(budgets)}"
chunked_prefill.token_timeline(*timelines[smallest], f"Chunked prefill, {min(budgets)}-token budget: decoders keep going").show()

# %% [markdown]
# The decoders' worst gap, by hand from the token timestamps: each decoder token's gap to the one before it, kept
# while the long prompt was waiting for its first token (from its arrival to its first token), and the largest —
# the number `interference_summary` reports for every configuration.

# %%
tokens_off, reqs_off = timelines["chunked off"]
long_req = reqs_off[reqs_off.label == "long prompt"].iloc[0]
dec = tokens_off[tokens_off.label.str.startswith("decoder")].sort_values(["request_id", "token"])
dec = dec.assign(gap_s=dec.groupby("request_id").t_s.diff())
during = dec[(dec.t_s >= long_req.arrival_s) & (dec.t_s <= long_req.first_token_s + 1e-9)]
worst_ms = during.gap_s.max() * 1e3
print(f"chunked off: {len(during)} decoder gaps ended while the long prompt waited; the worst: {worst_ms:.0f} ms")
assert len(during) > 0, "the decoders had finished before the long prompt arrived: raise decoder_tokens"
assert abs(worst_ms - summary.set_index("config").decoder_itl_max_ms["chunked off"]) < 1e-6

# %% [markdown]
# ## 4. The trade-off curve
#
# Each point is one configuration: how long the long prompt waited for its first token, against how long the decoders'
# worst gaps were while it was being prefilled.

# %% tags=["key-figure"]
chunked_prefill.tradeoff(summary).show()
s = summary.set_index("config")
off_max, small_max = s.decoder_itl_max_ms["chunked off"], s.decoder_itl_max_ms[smallest]
print(f"decoders' worst gap: {off_max:.0f} ms with chunking off, {small_max:.0f} ms with {min(budgets)}-token chunks; "
      f"long prompt TTFT {s.long_ttft_ms['chunked off']:.0f} → {s.long_ttft_ms[smallest]:.0f} ms")
assert small_max < off_max, (small_max, off_max)

# %% [markdown]
# ## 5. A short prompt behind a long one
#
# Admission is a queue too. A long prompt arrives at t = 0, a short interactive one 50 ms later (its TTFT counts from its
# arrival). Without chunking the short one waits for the long prompt's whole prefill. Chunking alone does not save it
# either: once the long prompt is running, its chunks take every step's budget before a waiting request is admitted.
# vLLM's `long_prefill_token_threshold` caps how many tokens of a *long* prompt one step may take, leaving room for
# short ones in the same step. It only acts when there is someone to make room for: with a single request in the
# engine the scheduler sets it to 0 and the prompt uses the whole budget (same file: "When it is the only request
# there is nobody to starve").

# %%
behind_df = pd.DataFrame(behind).set_index("config")
behind_df.round(0)

# %% [markdown]
# ## Summary
#
# Written from this run's numbers:

# %%
from IPython.display import Markdown

thr = [c for c in configs if "threshold" in c][0]
by_budget = s.loc[[f"chunks of {b}" for b in sorted(budgets)]]
stalls_grow = by_budget.decoder_itl_max_ms.is_monotonic_increasing
# TTFT between two large budgets differs by a step or two (within a shared machine's noise): the claim is the ends
ttft_longest_at_smallest = by_budget.long_ttft_ms.iloc[0] == by_budget.long_ttft_ms.max()
chunk_words = kvlab.claim(stalls_grow and ttft_longest_at_smallest,
               "smaller budget → shorter stalls (every budget in order), and the smallest budget gave the big request its longest TTFT",
               "on this run the budgets did not order stalls and TTFT one way: " + ", ".join(
                   f"{b}: TTFT {r.long_ttft_ms:,.0f} ms, worst gap {r.decoder_itl_max_ms:,.0f} ms" for b, r in
                   zip(sorted(budgets), by_budget.itertuples(), strict=True)) + " — pick from the measured points, not the rule")
ttft_change = s.long_ttft_ms[smallest] / s.long_ttft_ms["chunked off"] - 1
ttft_sentence = kvlab.claim(ttft_change > 0.05, "the decoders' gain is paid by the long request",
                 "here the long request hardly paid for it — each chunk's step costs about what its tokens cost, so splitting adds little")
big = f"chunks of {max(budgets)}"
Markdown(f"""
- With chunked prefill **off**, a {long_tokens:,}-token prompt arriving mid-stream froze {decoders} streaming users for up to
  **{off_max:.0f} ms** (their gaps before it: ~{s.decoder_itl_before_p50_ms['chunked off']:.0f} ms, the long prompt
  arriving at t = {long_at:.2f} s).
- With **{min(budgets)}-token chunks** the worst gap fell to **{small_max:.0f} ms**, while the long prompt's TTFT went from
  {s.long_ttft_ms['chunked off']:.0f} to {s.long_ttft_ms[smallest]:.0f} ms ({ttft_change:+.0%}): {ttft_sentence}.
- A short prompt arriving 50 ms after the long one got its first token after **{behind_df.loc['chunked off', 'short prompt TTFT (ms)']:.0f} ms**
  with chunking off, {behind_df.loc[big, 'short prompt TTFT (ms)']:.0f} ms with {max(budgets)}-token chunks, and
  **{behind_df.loc[thr, 'short prompt TTFT (ms)']:.0f} ms** with `long_prefill_token_threshold=256`.

Mitigations, each tied to a number above: **cap interactive input length** (the long prompt's prefill time is the stall);
**send heavy jobs to a batch queue** or a separate pool (the decoders' worst gap exists only because they share the engine);
**chunk** ({chunk_words}) and **cap long prefills per step**
(the threshold lets short requests through); **summarize or split documents** before they reach the chat pool.
""")

# %% [markdown]
# ## Exercises
#
# 1. Pick a budget for a product whose chat users must never see a gap over 300 ms. What TTFT does that give a 4k-token ingest?
# 2. Why does the decoders' gap with chunking not fall to their normal pace? What else shares the step?
# 3. Double the number of decoders. Which curve moves: the stall, the long prompt's TTFT, or both?
