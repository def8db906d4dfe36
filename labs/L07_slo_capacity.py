# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab L07 · SLO capacity: goodput and the largest sustainable rate
#
# An open-loop rate sweep (Poisson arrivals) of a traffic mix — short chats, agent turns with a long shared system
# prompt, batch summarization jobs — on one in-process engine. Goodput and attainment as vLLM's `bench serve
# --goodput` defines them; a rate meets the SLO when the p95 of each objective is within it; the SLO applies to the
# interactive requests (chat and agent), batch jobs are throughput work. By default the SLO and the rates adapt to the
# engine (multiples of its unloaded chat latency; fractions of its closed-loop saturation throughput), so the defaults
# are a fair test on any machine; `slo_unit="ms"` and `rate_unit="req/s"` take absolute numbers.
#
# Headless: `papermill --engine kvlab labs/L07_slo_capacity.ipynb out.ipynb --cwd labs -p batch_share 0.2 -p chat_share 0.8`.
# Writes `results.csv/.parquet` (one row per request of the sweep), `rates.csv` (one row per rate: goodput, percentiles,
# the requests behind them), `capacity.csv` (the maximum sustainable rate, its bracket, the knee, the SLO),
# `calibration.csv` (the unloaded and saturation runs), `metadata.json` and `capacity.html`.

# %% tags=["parameters"]
model = ""  # Hugging Face id or local folder; empty: KVLAB_MODEL or the course model
slo_ttft = 4.0  # TTFT objective at p95: multiples of the unloaded chat median (slo_unit unloaded) or ms
slo_tpot = 2.0  # TPOT objective at p95, same unit as slo_ttft
slo_e2e = 0.0  # E2E latency objective at p95, same unit; 0: no E2E objective
slo_unit = "unloaded"  # unit of the objectives: 'unloaded' (× this engine's unloaded chat median) or 'ms'
rates = [0.25, 0.5, 0.75, 1.0, 1.25, 1.5]  # arrival rates to sweep, increasing (unit: rate_unit)
rate_unit = "saturation"  # 'saturation': fractions of the throughput measured with saturation_users closed-loop users (fits any machine); 'req/s': requests per second
saturation_users = 32  # closed-loop users of the run that measures saturation throughput
seconds_per_rate = 8.0  # seconds of Poisson arrivals per rate (at least min_requests requests)
min_requests = 12  # fewest requests per rate
warmup_fraction = 0.2  # share of each rate's first requests dropped before the percentiles (warm-up)
chat_share = 1.0  # share (0-1) of requests that are short chats
agent_share = 0.0  # share (0-1) of requests that are agent turns (long shared system prompt)
batch_share = 0.0  # share (0-1) of requests that are batch summarization jobs (no SLO, lower priority)
chat_output_tokens = 32  # output tokens per chat (exact)
agent_prompt_tokens = 1000  # prompt tokens per agent turn (about)
agent_output_tokens = 16  # output tokens per agent turn (exact)
batch_prompt_tokens = 1200  # document tokens per batch job
batch_output_tokens = 64  # output tokens per batch job (exact)
scheduling_policy = "fcfs"  # vLLM scheduling policy; 'priority' runs chat and agents before batch jobs
prefix_caching = True  # vLLM automatic prefix caching
max_num_batched_tokens = 2048  # tokens scheduled per engine step (2,048: vLLM's server default here)
long_prefill_token_threshold = 0  # most prompt tokens one request prefills per step; 0: no limit
kv_cache_gib = 1.0  # KV cache budget, GiB
enforce_eager = True  # True: no torch.compile; False: compiled (slow first start)
output_dir = ""  # where results go; empty: build/labs/L07_slo_capacity

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()
p = kvlab.labs.validate_namespace("L07_slo_capacity", globals())  # checks every parameter; applies quick mode's sizes

# %% [markdown]
# ## Calibrate: the unloaded chat and the saturation throughput

# %%
import pandas as pd

from kvlab import loadtest, slo

mix = loadtest.Mix(p.chat_share, p.agent_share, p.batch_share, p.chat_output_tokens, p.agent_prompt_tokens,
                   p.agent_output_tokens, p.batch_prompt_tokens, p.batch_output_tokens)
llm = kvlab.make_engine(p.model or None, enforce_eager=p.enforce_eager, kv_cache_gib=p.kv_cache_gib,
                        enable_prefix_caching=p.prefix_caching, scheduling_policy=p.scheduling_policy,
                        max_num_batched_tokens=p.max_num_batched_tokens, max_num_seqs=loadtest.SERVER_LIKE["max_num_seqs"],
                        long_prefill_token_threshold=p.long_prefill_token_threshold)
tok = llm.get_tokenizer()
alone = loadtest.unloaded(llm, loadtest.Requests(tok, loadtest.Mix(chat_output_tokens=p.chat_output_tokens), seed=9), count=5)
if p.slo_unit == "unloaded":
    objective = loadtest.relative_slo(alone, p.slo_ttft, p.slo_tpot, p.slo_e2e or None)
else:
    objective = slo.SLO(p.slo_ttft, p.slo_tpot, p.slo_e2e or None)
maker = loadtest.Requests(tok, mix)
calibration = [alone.assign(run="unloaded")]
if p.rate_unit == "saturation":
    closed = loadtest.run_closed_loop(llm, maker, users=p.saturation_users, count=2 * p.saturation_users)
    saturation = loadtest.saturation_rps(closed, p.warmup_fraction)
    calibration.append(closed.assign(run="saturation"))
    swept = [round(f * saturation, 3) for f in p.rates]
else:
    saturation, swept = float("nan"), list(p.rates)
print(f"SLO: {objective.describe()}; saturation throughput: {saturation:.2f} req/s; rates: {swept} req/s")

# %% [markdown]
# ## The sweep

# %%
sweep = loadtest.run_open_loop(llm, maker, swept, seconds=p.seconds_per_rate, min_requests=p.min_requests)
settings = llm.kvlab_settings
kvlab.close_engine(llm)
interactive = sweep[sweep.label != "batch"]
table = slo.rate_table(interactive, objective, warmup_fraction=p.warmup_fraction)
sustainable, knee = slo.max_sustainable_rate(table), slo.knee(table)
q = f"p{objective.percentile:g}"
table[["rate_rps", "requests", "throughput_rps", "goodput_rps", "attainment", f"ttft_{q}_ms", f"tpot_{q}_ms", "meets_slo"]].round(2)

# %%
fig = kvlab.loadtest.rate_sweep_figure(table, objective, knee, sustainable)
fig.show()

# %% [markdown]
# ## Save

# %%
low, high = sustainable["bracket"]
capacity_row = pd.DataFrame([{"max_sustainable_rps": sustainable["rate"], "bracket_low_rps": low, "bracket_high_rps": high,
                              "at_least": sustainable["at_least"], "knee_rps": knee, "saturation_rps": saturation,
                              "slo": objective.describe(), "slo_ttft_ms": objective.ttft_ms, "slo_tpot_ms": objective.tpot_ms,
                              "slo_e2e_ms": objective.e2e_ms, "unloaded_ttft_ms": alone.ttft_s.median() * 1e3,
                              "unloaded_tpot_ms": alone.tpot_s.median() * 1e3}])
results = sweep.drop(columns=["itl_s"]).assign(good=slo.good(sweep, objective) & (sweep.label != "batch"))
out = kvlab.labs.output_dir("L07_slo_capacity", p.output_dir)
kvlab.results.save_results(results, out, p, engine_settings=settings,
                           tables={"rates.csv": table, "capacity.csv": capacity_row,
                                   "calibration.csv": pd.concat(calibration, ignore_index=True).drop(columns=["itl_s"])},
                           figures={"capacity.html": fig})
print(f"wrote {len(results)} requests at {len(swept)} rates to {out}; maximum sustainable rate "
      f"{sustainable['rate'] or 0:.2f} req/s")

# %% [markdown]
# ## Exercises
#
# Answer from **your** numbers above — the tables, the plot, the files in `out` — not from the lessons' prose. Put each
# answer in `answers` and run the check: it says whether your reading agrees with this run's data (and, if not, where
# to look), without giving the answer away.

# %%
kvlab.exercises.show("L07")

# %%
answers = {"L07.1": None, "L07.2": None, "L07.3": None, "L07.4": None}  # replace None with your answers
kvlab.exercises.check(answers, out)

# %% [markdown]
# ## More to try
#
# 1. Add batch jobs to the mix (`chat_share=0.8, batch_share=0.2`) and run with `scheduling_policy="fcfs"`, then
#    `"priority"`. How does the maximum sustainable rate move?
# 2. Set `slo_unit="ms"` with your product's real objectives. Which objective breaks first on this machine?
# 3. Run with `long_prefill_token_threshold=128` and a mix with agents (`agent_share=0.3, chat_share=0.7`): what happens
#    to TPOT p95 at the highest rate?
