# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Sizing the KV cache by hand — and proving it against the engine
#
# During generation, every layer keeps a **key** and a **value** vector for every token it has seen, so the next
# token can attend to them without recomputing the past. That store is the **KV cache**. It is why a long
# conversation costs memory even when nothing is being computed, and why context length and concurrency trade
# against each other on a fixed card.
#
# In this lesson you will
#
# 1. size the KV cache with a formula you can do on paper — and see the classic mistake that makes it 4× too big;
# 2. compare real models (MHA, GQA, MQA, sliding windows, MLA) and see how many users fit on an 80 GiB and a 141 GiB card;
# 3. play with a calculator;
# 4. **prove the formula against a live vLLM engine** — for three attention layouts of the same model;
# 5. see what a sliding window really saves: what the layer needs, and what vLLM reserves for it (proved on the engine);
# 6. halve the cache with an fp8 KV cache, and check what that does to answers.

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()

# %% [markdown]
# ## 1. The formula
#
# For each token, each layer stores one K and one V vector per **KV head**:
#
# $$\text{KV bytes} = 2\,(K,V) \times \text{layers} \times \text{kv\_heads} \times \text{head\_dim} \times \text{bytes per element} \times \text{tokens} \times \text{sequences}$$
#
# The seed example: a Llama-3.1-8B-like model — 32 layers, **8 KV heads**, head_dim 128 — in FP16, holding 16
# sequences of 8,192 tokens each.

# %% [markdown]
# First on paper — plain Python arithmetic on the numbers above:

# %%
per_token = 2 * 32 * 8 * 128 * 2  # K and V × layers × KV heads × head_dim × 2 bytes (FP16)
per_seq = per_token * 8192  # × tokens
total = per_seq * 16  # × sequences
print(f"{per_token:,} B per token = {per_token / 1024:.0f} KiB; {per_seq / 2**30:.2f} GiB per sequence; {total / 2**30:.1f} GiB for 16")

# %% [markdown]
# Then the same with `kvlab.sizing`, which does it for any config (MLA, sliding windows, hybrid layers below) — and
# must agree with the hand figure here:

# %%
import pandas as pd

from kvlab import sizing

seed = sizing.KVArch(name="seed example", layers=32, query_heads=32, kv_heads=8, head_dim=128, attention="GQA")
assert sizing.bytes_per_token(seed, "fp16") == per_token
assert sizing.kv_bytes(seed, 8192, "fp16") == per_seq
assert sizing.kv_bytes(seed, 8192, "fp16", sequences=16) == total
pd.DataFrame({"step": ["2 × 32 layers × 8 KV heads × 128 × 2 B", "× 8,192 tokens", "× 16 sequences"],
              "bytes": [per_token, per_seq, total],
              "readable": [f"{per_token / 1024:.0f} KiB per token", f"{per_seq / 2**30:.2f} GiB per sequence", f"{total / 2**30:.1f} GiB in total"]})

# %% [markdown]
# ### The classic mistake: query heads instead of KV heads
#
# The model has **32 query heads** but only **8 KV heads**: grouped-query attention (GQA) lets 4 query heads share
# one K/V head. Sizing with the query heads — an easy slip when reading `num_attention_heads` from a config — gives:

# %%
wrong = sizing.kv_bytes(seed, 8192, "fp16", sequences=16, use_query_heads=True)
print(f"with KV heads:    {total / 2**30:5.1f} GiB")
print(f"with query heads: {wrong / 2**30:5.1f} GiB  ({wrong / total:.0f}× too much: you would plan for a quarter of the users you can serve)")

# %% [markdown]
# ## 2. Real models
#
# The presets in `data/models/` are copied from each model's `config.json` (source named in each file). They cover
# every way current models shrink their KV cache:
#
# - **MHA** (Llama-2-7B): one K/V head per query head — the expensive baseline;
# - **GQA** (Llama-3.1, Mistral, Qwen2.5, Gemma-2, SmolLM2): a few K/V heads shared by groups of query heads;
# - **MQA** (Falcon-7B): a single K/V head for all 71 query heads;
# - **sliding windows** (Mistral-7B-v0.1 on every layer, Gemma-2 on every other layer, Gemma-3 on five layers of
#   six): a layer *needs* only the last window of tokens (4,096; 1,024 for Gemma-3) — section 5 shows what vLLM
#   actually reserves for it;
# - **MLA** (DeepSeek-V3): one compressed latent (512 + 64 values) per token and layer instead of K and V.
#
# Gemma-3-4B's `config.json` does not even state its head counts, head size or 5:1 layer pattern: they are the
# defaults of transformers' `Gemma3TextConfig`. `kvlab.sizing` reads configs the way transformers does, so those
# defaults are filled, and each layer's kind comes from the layer list transformers computes.
#
# Other ways to shrink the cache: **hybrid models** are sized by `kvlab.sizing` (next section); the rest are named for
# orientation only, neither sized here nor checked on an engine: **cross-layer KV sharing** (upper layers reuse a
# lower layer's K and V: YOCO, Gemma 3n), **sparse attention** that reads only selected tokens' KV at each step
# (DeepSeek-V3.2's DSA — less bandwidth, though the cache still holds every token), and **KV quantization below 8
# bits** (KIVI's 2-bit keys and values, LMDeploy's int4 KV). fp8 KV (section 6) halves the cache and is checked here.

# %%
table = sizing.preset_table("bf16")
table.round(3)

# %%
kvlab.sizing.bytes_per_token_bar(table, "bf16").show()

# %% [markdown]
# ### Hybrid models: attention on a few layers, a fixed-size state on the others
#
# Qwen3-Next-80B-A3B has 48 layers, but only one in four is attention (2 KV heads of 256); the other 36 are **linear
# attention** (Gated DeltaNet) layers that keep a **state of fixed size per sequence**, however long it grows —
# Jamba, Granite-4, Falcon-H1 and Nemotron-H do the same with Mamba layers. The per-token KV counts the attention
# layers only; the state is added once per sequence. By hand, for bf16 (its config's numbers are transformers'
# `Qwen3NextConfig` defaults):

# %%
attn_per_token = 12 * 2 * 2 * 256 * 2  # 12 attention layers × K,V × 2 KV heads × 256 × 2 B
conv = (4 - 1) * (2 * 16 * 128 + 32 * 128)  # conv kernel − 1 positions × (q, k: 16 heads × 128; v: 32 heads × 128)
recurrent = 32 * 128 * 128  # per value head, a 128 × 128 matrix
state_per_seq = 36 * (conv + recurrent) * 2  # 36 linear-attention layers, 2 B each
next_arch = sizing.KVArch.from_config({"model_type": "qwen3_next"})
assert sizing.bytes_per_token(next_arch, "bf16") == attn_per_token and sizing.state_bytes(next_arch, "bf16") == state_per_seq
naive = 48 * 2 * 2 * 256 * 2  # every layer counted as attention
print(f"KV per token: {attn_per_token:,} B (counting all 48 layers would say {naive:,}: {naive // attn_per_token}× too much); "
      f"state per sequence: {state_per_seq / 2**20:.1f} MiB = the KV of {state_per_seq / attn_per_token:,.0f} tokens")

# %% [markdown]
# What vLLM 0.32 reserves differs again: it gives **every layer one page size**. It raises the attention block size
# until one layer's page holds one layer's state (`vllm/platforms/interface.py`, `_align_hybrid_block_size`), pads the
# state to that page, and a request holds two state pages per group of state layers while prefix caching is on
# (`mamba_cache_mode="align"`: `vllm/v1/kv_cache_interface.py`, `MambaSpec.max_memory_usage_bytes`). With 16-token
# kernel blocks:

# %%
state_page = (conv + recurrent) * 2
block = 16 * -(-state_page // (16 * 2 * 2 * 256 * 2))  # the smallest multiple of 16 tokens whose page holds a state
plan = sizing.vllm_kv_plan(next_arch, 8 * 2**30, 8192, "bf16", block_size=16)
assert plan.block_size == block
print(f"attention blocks of {block} tokens (not 16); {plan.groups_full} attention group and {plan.groups_state} state groups "
      f"of {plan.group_size} layers; a request of 8,192 tokens takes {plan.blocks_per_request} blocks, "
      f"{plan.ideal_blocks_per_request} if each state took one page")

# %% [markdown]
# ### How many sequences fit on one card?
#
# The engine's KV budget is what is left of the usable memory — vLLM's default share, 92 % — after the weights and
# an allowance for everything else a running engine needs (activations of one step, CUDA graphs, non-torch memory:
# 1.5 GiB here, `sizing.DEFAULT_OVERHEAD_GIB`). The chart below shows how many full-context sequences fit at 8k, 32k
# and 128k tokens on an 80 GiB card (A100/H100) and a 141 GiB card (H200), bf16 weights and KV, blocks of 16
# tokens, sliding layers counted at their window. Hatched bars are contexts beyond the model's own limit. These are
# **upper bounds**: the engine measures its real overhead when it starts, and reserves more than the window for
# sliding layers (section 5).

# %%
contexts, cards = [8192, 32768, 131072], [80, 141]
grid = sizing.kv_capacity_grid(sizing.list_presets(), cards, contexts)
grid.pivot_table(index="model", columns=["memory_gib", "context"], values="max_sequences")

# %%
kvlab.sizing.sequences_that_fit_figure(grid).show()

# %%
from IPython.display import Markdown


def fit(model, mem, ctx):
    return int(grid.query("model == @model and memory_gib == @mem and context == @ctx").max_sequences.iloc[0])

l8 = (fit("Llama-3.1-8B", 80, 8192), fit("Llama-3.1-8B", 80, 131072))
Markdown(f"""**Long context destroys concurrency.** On an 80 GiB card, Llama-3.1-8B serves **{l8[0]}** users at 8k tokens
but only **{l8[1]}** at 128k: every user who really fills a 128k context takes the KV memory of {l8[0] // max(l8[1], 1)}×
8k users. Layout matters as much: at 32k, Falcon-7B (MQA) fits **{fit('Falcon-7B', 80, 32768)}** sequences where
Llama-2-7B (MHA) would fit **{fit('Llama-2-7B', 80, 32768)}** — though 32k is far beyond what either model was trained for.
Llama-3.1-70B and DeepSeek-V3 don't fit on one card in bf16 at all: their weights alone exceed it.""")

# %% [markdown]
# ## 3. A calculator
#
# Move the controls: the bar redraws with the memory split between weights, the KV cache you asked for, and
# what is left. (This needs a live kernel; in the HTML export you see only its first state.)

# %%
kvlab.widgets.kv_calculator()

# %% [markdown]
# ## 4. Proving it against the engine
#
# The formula is a sketch until a real engine agrees. We give vLLM a **fixed 1 GiB KV budget** and read back how many
# blocks it allocated, for the chosen model and for random-weight copies of it built locally that differ *only* in
# their KV heads: **MHA** (as many KV heads as query heads) and **MQA** (one). Same layers, same size; the hand
# formula predicts capacities in the inverse ratio of the KV heads. The engine allocates whole blocks, so we allow
# one block of difference.
#
# Each engine starts in eager mode: we measure memory here, not speed.

# %%
from kvlab import sizing, variants

chosen = sizing.load_arch(kvlab.resolve_model())
print(f"The chosen model: {chosen.layers} layers, {chosen.query_heads} query heads, {chosen.kv_heads} KV heads of {chosen.head_dim} ({chosen.attention}).")
layouts = {f"{chosen.attention}: the chosen model ({chosen.kv_heads} KV heads)": None}
if chosen.attention == "MLA":
    print("An MLA model has no KV heads to vary: the MHA and MQA copies are skipped.")
elif not variants.kv_heads_configurable():
    print("This architecture has one K and V head per query head in every layer, with no setting for fewer "
          "(like OPT or GPT-2): the MHA and MQA copies are skipped.")
else:
    if chosen.kv_heads != chosen.query_heads:
        layouts[f"MHA copy ({chosen.query_heads} KV heads)"] = str(variants.prepare_kv_variant(chosen.query_heads))
    if chosen.kv_heads != 1:
        layouts["MQA copy (1 KV head)"] = str(variants.prepare_kv_variant(1))
rows = []
for label, path in layouts.items():
    row, _ = sizing.kv_capacity_check(path, kv_cache_gib=1.0)
    rows.append({"layout": label} | row)
checks = pd.DataFrame(rows)
checks["formula_ratio"] = chosen.kv_heads / checks.kv_heads
checks["engine_ratio"] = checks.engine_tokens / checks.engine_tokens[0]
checks[["layout", "kv_heads", "hand_bytes_per_token", "engine_bytes_per_token", "hand_tokens", "engine_tokens", "difference_blocks",
        "formula_ratio", "engine_ratio"]]

# %% [markdown]
# The engine's block count by hand, for the chosen model: 1 GiB ÷ (tokens per block × bytes per token), in the dtype
# its KV cache runs in here.

# %%
first = checks.iloc[0]
if chosen.sliding_layers or chosen.state_layers or chosen.attention == "MLA":
    print("Skipped: this model's layers are not all full attention, so vLLM groups them (section 5) and one division does not give its blocks.")
else:
    hand_per_token = 2 * chosen.layers * chosen.kv_heads * chosen.head_dim * int(sizing.dtype_bytes(first.kv_dtype))
    hand_blocks = 2**30 // (first.block_size * hand_per_token)
    print(f"2 × {chosen.layers} × {chosen.kv_heads} × {chosen.head_dim} × {int(sizing.dtype_bytes(first.kv_dtype))} B = {hand_per_token:,} B per token; "
          f"2**30 ÷ ({first.block_size} × {hand_per_token:,}) = {hand_blocks:,} blocks; the engine: {first.engine_blocks:,}")
    assert hand_per_token == first.engine_bytes_per_token and abs(hand_blocks - first.engine_blocks) <= 1

# %%
assert (checks.hand_bytes_per_token == checks.engine_bytes_per_token).all()
assert (checks.difference_blocks.abs() <= 1).all(), "engine and hand formula disagree by more than one block"
assert ((checks["engine_ratio"] - checks["formula_ratio"]).abs() <= 0.02 * checks["formula_ratio"]).all(), checks
print("; ".join(f"{r.layout} holds {r.engine_ratio:.3f}× the tokens of the chosen model (formula {r.formula_ratio:.3f}×)"
                for r in checks.itertuples()))

# %% tags=["key-figure"]
import plotly.express as px

px.bar(checks, x="layout", y=["hand_tokens", "engine_tokens"], barmode="group",
       title="Tokens of KV in a 1 GiB budget: hand formula vs vLLM's own report",
       labels={"value": "tokens of KV cache", "variable": ""}).show()

# %% [markdown]
# ## 5. Sliding windows: what the layer needs, and what vLLM reserves
#
# A sliding-window layer only attends to the last `window` tokens, so in principle it needs only `window` tokens of
# KV per sequence. vLLM 0.32 reserves more, for a reason: it frees a block that slid out of the window only after the
# tokens of the step in flight are settled, so each request may hold `window − 1 + max_num_batched_tokens` tokens
# (× concurrent batches: 1 on a CPU, 2 with async scheduling on a GPU), at most `max_model_len`, plus one block
# because the window need not start on a block boundary (`vllm/v1/kv_cache_interface.py`:
# `SlidingWindowSpec.max_admission_blocks_per_request`). `kvlab.sizing.vllm_kv_plan` does the engine's arithmetic.
#
# To prove it we build one more copy of the chosen model in which **every layer slides over 256 tokens**, and read
# the engine's block count and the number of `max_model_len`-token sequences it says fit, with its default token
# budget per step and with a small one.

# %%
window = 256
sliding_model = str(variants.prepare_sliding_variant(window))
rows = []
for step_tokens in (None, 512):
    args = {"max_num_batched_tokens": step_tokens} if step_tokens else {}
    row, _ = sizing.kv_capacity_check(sliding_model, kv_cache_gib=1.0, **args)
    rows.append(row)
sliding = pd.DataFrame(rows)
sliding[["max_model_len", "max_num_batched_tokens", "hand_blocks", "engine_blocks", "ideal_blocks_per_request",
         "hand_blocks_per_request", "engine_blocks_per_request", "ideal_max_concurrency", "hand_max_concurrency",
         "engine_max_concurrency"]].round(2)

# %%
assert (sliding.hand_blocks - sliding.engine_blocks).abs().max() <= 1
assert (sliding.hand_blocks_per_request - sliding.engine_blocks_per_request).abs().max() <= 1, "more than one block apart"
full_conc = checks.engine_max_concurrency[0]
compare = pd.DataFrame({
    "layout": ["full attention (the chosen model)", f"window {window}: what the layers need (ideal)",
               *(f"window {window}: what vLLM reserves ({int(r.max_num_batched_tokens):,} tokens per step)" for r in sliding.itertuples())],
    "sequences that fit": [full_conc, sliding.ideal_max_concurrency[0], *sliding.engine_max_concurrency]})
px.bar(compare, x="layout", y="sequences that fit",
       title=f"Sequences of {int(sliding.max_model_len[0]):,} tokens in 1 GiB of KV (engine's report; the ideal by hand)",
       labels={"sequences that fit": "sequences of max_model_len (engine's max concurrency)"}).show()
default_step = int(sliding.max_num_batched_tokens[0])
print(f"A {window}-token window needs {int(sliding.ideal_blocks_per_request[0])} blocks per sequence; vLLM reserves "
      f"{sliding.engine_blocks_per_request[0]:.0f} with {default_step:,} tokens per step and {sliding.engine_blocks_per_request[1]:.0f} with 512 "
      f"(full attention: {checks.engine_blocks[0] / full_conc:.0f}).")
saved = checks.engine_blocks[0] / full_conc - sliding.engine_blocks_per_request[0]
# not a takeaway that can fail: which of the three happens follows from max_model_len and the step budget (below)
outcome = (f"saves {saved:.0f} blocks per sequence." if saved >= 1 else "saves nothing." if saved > -1 else
           f"costs {-saved:.0f} block(s) per sequence more than full attention.")
print(f"At max_model_len {int(sliding.max_model_len[0]):,} and the default step budget the window {outcome}")

# %% [markdown]
# With the default step budget the reservation is `min(255 + step tokens, max_model_len)`: at a short `max_model_len`
# the window saves little or nothing (the line above says which, on this run). A smaller `max_num_batched_tokens` brings the reservation towards the window — at
# the price of prefilling long prompts in more, smaller steps (lesson 04). The same arithmetic sizes Gemma-3's five
# local layers of six; `sizing.vllm_kv_plan` also groups the layers the way the engine does.

# %% [markdown]
# ## 6. KV precision: fp8 halves the cache — what does it cost?
#
# Storing K and V in 8 bits instead of 16 halves the bytes per token (a quarter of float32's), so the same budget
# holds two (four) times the tokens. First the capacity, then the seed's warning — *"enabling FP8 KV without task
# evals"* — made concrete: the same fixed task set (short factual answers and JSON tool calls, each with its own
# check), greedy, with the model's own KV dtype and with an fp8 KV cache, on the same model in this machine's dtype.
# Not every engine can keep fp8 KV (vLLM's CPU attention needs AVX-512 or AMX, and certain head sizes): where it
# can't, the section says why and skips the fp8 half.

# %%
from kvlab import tasks

base_row, base_llm = sizing.kv_capacity_check(None, kv_cache_gib=1.0, keep=True)
base_answers = tasks.run_tasks(base_llm)
kvlab.close_engine(base_llm)
base_kv = base_row["kv_dtype"]  # the model's dtype on this machine, as the engine reports it
fp8_blocked = kvlab.hardware.fp8_kv_unsupported(chosen.head_dim)
if fp8_blocked:
    print(f"The fp8 half of this section is skipped: {fp8_blocked}.")
else:
    fp8_row, fp8_llm = sizing.kv_capacity_check(None, kv_cache_gib=1.0, kv_cache_dtype="fp8", keep=True)
    fp8_answers = tasks.run_tasks(fp8_llm)
    kvlab.close_engine(fp8_llm)
    capacity_ratio, expected_ratio = fp8_row["engine_tokens"] / base_row["engine_tokens"], sizing.dtype_bytes(base_kv)
    assert abs(fp8_row["difference_blocks"]) <= 1 and abs(capacity_ratio - expected_ratio) < 0.01 * expected_ratio, capacity_ratio
    print(f"{base_kv} KV: {base_row['engine_tokens']:,} tokens; fp8 KV: {fp8_row['engine_tokens']:,} tokens "
          f"({capacity_ratio:.2f}×, {expected_ratio:g} bytes per element against 1)")

# %%
compared = None if fp8_blocked else tasks.compare_runs(base_answers, fp8_answers, f"{base_kv} KV", "fp8 KV")
pd.set_option("display.max_colwidth", 70)
compared

# %%
n = len(base_answers)
pass_base = int(base_answers.passes.sum())
if fp8_blocked:
    fp8_summary = f"The fp8 KV comparison was skipped: {fp8_blocked}. With {base_kv} KV the task checks passed {pass_base}/{n}."
else:
    changed, pass_fp8 = int(compared.changed.sum()), int(compared["passes (fp8 KV)"].sum())
    print(f"{changed} of {n} outputs changed; the task checks pass {pass_base}/{n} with {base_kv} KV and {pass_fp8}/{n} with fp8 KV.")
    fp8_summary = (f"An fp8 KV cache held **{capacity_ratio:.2f}×** the tokens of {base_kv}. On the {n}-task set, **{changed}** "
                   f"outputs changed; the checks passed {pass_base}/{n} ({base_kv} KV) and {pass_fp8}/{n} (fp8 KV). The "
                   "capacity gain is certain; what it does to answers is only known by running your own task checks.")

# %% [markdown]
# ## Summary
#
# Written from this run's numbers:

# %%
Markdown(f"""
- The seed example (32 layers, 8 KV heads, head_dim 128, FP16) costs **{per_token / 1024:.0f} KiB per token**,
  **{per_seq / 2**30:.0f} GiB per 8k sequence**, **{total / 2**30:.0f} GiB for 16 sequences**; sizing it with query heads
  gives {wrong / 2**30:.0f} GiB, {wrong / total:.0f}× too much.
- On an 80 GiB card, Llama-3.1-8B fits **{l8[0]}** sequences at 8k tokens and **{l8[1]}** at 128k.
- The live engine agreed with the hand formula to within one block for every KV-head layout of the chosen model:
  {', '.join(f"{r.layout} {r.engine_tokens:,} tokens" for r in checks.itertuples())} in 1 GiB.
- A {window}-token sliding window *needs* {int(sliding.ideal_blocks_per_request[0])} blocks per sequence, but vLLM reserved
  {sliding.engine_blocks_per_request[0]:.0f} with {default_step:,} tokens per step ({sliding.engine_max_concurrency[0]:.1f} sequences of
  {int(sliding.max_model_len[0]):,} tokens fit, against {full_conc:.1f} with full attention) and {sliding.engine_blocks_per_request[1]:.0f} with 512
  ({sliding.engine_max_concurrency[1]:.1f} fit) — exactly as `sizing.vllm_kv_plan` computed, to one block.
- {fp8_summary}
""")

# %% [markdown]
# ## Exercises
#
# 1. A colleague plans 40 users × 32k tokens of Qwen2.5-7B on one 80 GiB card. Use the calculator: does it fit in bf16?
#    In fp8?
# 2. Mistral-7B-v0.1 slides every layer over 4,096 tokens, so the *ideal* formula fits the same number of
#    sequences at 8k, 32k and 128k. Ask the engine's arithmetic instead: `sizing.vllm_kv_plan(sizing.load_arch("Mistral-7B-v0.1"),
#    budget, max_model_len, "bf16", 16, max_num_batched_tokens=8192, concurrent_batches=2)` for a 60 GiB budget at each
#    length. How many blocks does vLLM reserve per sequence, and how many sequences fit? Which setting brings it
#    towards the ideal, and what does that cost?
# 3. Gemma-2-9B has fewer KV heads than Llama-2-7B but a larger `head_dim`. Compute its bytes per token by hand and
#    check the table.
# 4. Start an engine with `kvlab.sizing.kv_capacity_check(None, kv_cache_gib=2.0)`. Predict the
#    engine's token count before you run it.
# 5. Look at the outputs that changed under fp8. At which token do they first differ? Would your application notice?
