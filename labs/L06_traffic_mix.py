# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab L06 · Traffic mix: chat only vs chat + agents
#
# A local vLLM OpenAI-compatible server (127.0.0.1, free port, stopped at the end) receives two open-loop traffic mixes
# at the same request rate: **chat only**, and the same number of requests of which a share are **agent turns** whose
# prompts grow every turn (tool JSON + retrieved documents appended). Client-side TTFT/TPOT per request, prompt and
# output tokens apart; the server's `/metrics` dashboard numbers per mix; its KV usage and queue sampled meanwhile.
#
# Headless: `papermill --engine kvlab labs/L06_traffic_mix.ipynb out.ipynb --cwd labs -p agent_share 0.5 -p requests 40`.
# Writes `results.csv/.parquet` (one row per request), `summary.csv` (one row per mix), `dashboard.csv` (the server's
# `/metrics` view per mix), `gauges.csv`, `metadata.json` and `dashboard.html`.

# %% tags=["parameters"]
model = ""  # Hugging Face id or local folder; empty: KVLAB_MODEL or the course model
agent_share = 0.25  # fraction (0-1) of the mixed run's requests that are agent turns
agent_turns = 4  # turns per agent loop (each turn is one request)
growth_tokens = 400  # tokens of retrieved text appended to the agent's prompt after each turn
agent_tools = 1  # tool schemas (0-13) in the agent's system prompt (1 ≈ 1,000 prompt tokens at turn 1)
requests = 24  # requests per mix
rate_per_s = 1.0  # arrival rate, requests per second (open loop)
concurrency = 32  # most clients in flight at once
output_tokens = 24  # output tokens per request (exact)
prefix_caching = True  # vLLM automatic prefix caching on the server
response_cache = False  # put the gateway with a Redis response cache in front (exact repeats of greedy requests)
cache_ttl_s = 600.0  # response-cache entry lifetime, seconds
input_cap = 0  # interactive input cap in prompt tokens, enforced by the gateway (0: none); over-cap requests go to its batch lane
kv_cache_gib = 1.0  # KV cache budget, GiB
enforce_eager = True  # True: no torch.compile; False: compiled (slow first start)
executor = ""  # where the server runs the model: '' vLLM's default (on a CPU a worker process with one core kept for the scheduler, lesson 06), 'uni' inside its engine core on every core, 'mp' a worker process
output_dir = ""  # where results go; empty: build/labs/L06_traffic_mix

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()
p = kvlab.labs.validate_namespace("L06_traffic_mix", globals())  # checks every parameter; applies quick mode's sizes

# %% [markdown]
# ## Run

# %%
import contextlib

import pandas as pd
from transformers import AutoTokenizer

from kvlab import metrics, traffic
from kvlab.runtime import gateway, serving
from kvlab.runtime.redis_server import RedisServer

tok = AutoTokenizer.from_pretrained(kvlab.resolve_model(p.model or None))
mixes = {"chat only": traffic.traffic_mix(tok, p.requests, 0.0, p.agent_turns, p.growth_tokens, p.agent_tools),
         "chat + agents": traffic.traffic_mix(tok, p.requests, p.agent_share, p.agent_turns, p.growth_tokens, p.agent_tools, seed=1)}
runs, boards, gauges = {}, {}, {}
with contextlib.ExitStack() as stack:  # everything started here is stopped at the end of the block, whatever happens
    server = stack.enter_context(serving.start_server(p.model or None, enforce_eager=p.enforce_eager, kv_cache_gib=p.kv_cache_gib,
                                                      enable_prefix_caching=p.prefix_caching,
                                                      distributed_executor_backend=p.executor or None))
    front = cache = None
    if p.response_cache or p.input_cap:
        cache = stack.enter_context(RedisServer()) if p.response_cache else None
        front = stack.enter_context(gateway.Gateway(server.url, server.model, cache and cache.redis_url, p.input_cap,
                                                    p.cache_ttl_s, "batch"))
    traffic.client_vs_engine(server, traffic.chat_sessions(2, offset=10), max_tokens=8)  # warm-up, not recorded
    for name, sessions in mixes.items():
        if cache:  # each mix starts with an empty response cache: the mixes ask the same chats
            cache.client().flushdb()
        g0 = metrics.scrape_prefix(front.url, "kvlab_gateway_") if front else {}
        runs[name], boards[name], gauges[name] = traffic.run_traffic(server, sessions, p.output_tokens, p.rate_per_s, p.concurrency,
                                                                     client=front.client() if front else None)
        if front:
            boards[name] |= metrics.board(g0, metrics.scrape_prefix(front.url, "kvlab_gateway_"))
    settings = server.settings | (front.settings if front else {})
summary = pd.DataFrame([{"mix": n} | traffic.summary(df, boards[n]["wall_s"]) for n, df in runs.items()])
summary.round(1)

# %%
fig = kvlab.traffic.bad_dashboard(runs, window_s=5.0)
fig.show()

# %% [markdown]
# ## Save

# %%
results = pd.concat([df.drop(columns=["events_s", "text"]).assign(mix=n) for n, df in runs.items()], ignore_index=True)
dashboard = pd.DataFrame([{"mix": n} | b for n, b in boards.items()])
gauge_table = pd.concat([g.assign(mix=n) for n, g in gauges.items()], ignore_index=True)
out = kvlab.labs.output_dir("L06_traffic_mix", p.output_dir)
kvlab.results.save_results(results, out, p, engine_settings=settings,
                           tables={"summary.csv": summary, "dashboard.csv": dashboard, "gauges.csv": gauge_table},
                           figures={"dashboard.html": fig})
print(f"wrote {len(results)} requests to {out}")

# %% [markdown]
# ## Exercises
#
# Answer from **your** numbers above — the tables, the plot, the files in `out` — not from the lessons' prose. Put each
# answer in `answers` and run the check: it says whether your reading agrees with this run's data (and, if not, where
# to look), without giving the answer away.

# %%
kvlab.exercises.show("L06")

# %%
answers = {"L06.1": None, "L06.2": None, "L06.3": None}  # replace None with your answers
kvlab.exercises.check(answers, out)

# %% [markdown]
# ## More to try
#
# 1. Compare `output tokens/s (mean)` and `TTFT p95 (ms)` between the two mixes in `summary.csv`. Which panel would have
#    paged you?
# 2. Run again with `prefix_caching=False`. Which requests' TTFT changed most — agent turns or chats? Why the chats too?
# 3. Raise `rate_per_s` until output tokens/s of the mixed run stops following the demand. What does `gauges.csv` show
#    about `waiting` at that point?
