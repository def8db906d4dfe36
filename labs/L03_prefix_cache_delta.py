# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab L03 · Prefix cache delta
#
# Traffic where a share of requests starts with the same prefix (real text, exact token counts) followed by a unique
# suffix, and the rest are unique prompts of the same length. Run once with prefix caching and once with the cache
# emptied before every request (the same as caching off): token hit rate from the engine's counters, TTFT p50/p95,
# and the TTFT delta.
#
# Headless: `papermill --engine kvlab labs/L03_prefix_cache_delta.ipynb out.ipynb --cwd labs -p prefix_tokens 2048 -p shared_fraction 0.9`.
# Writes `results.csv/.parquet` (one row per request), `summary.csv`, `metadata.json` and `ttft.html`.

# %% tags=["parameters"]
model = ""  # Hugging Face id or local folder; empty: KVLAB_MODEL or the course model
prefix_tokens = 1024  # tokens of the shared prefix
suffix_tokens = 64  # tokens of each request's unique suffix
shared_fraction = 0.8  # share of requests that carry the shared prefix, 0-1
requests = 12  # requests per run (one run with caching, one without)
output_tokens = 4  # output tokens per request
seed = 0  # order of shared and unique requests
output_dir = ""  # where results go; empty: build/labs/L03_prefix_cache_delta

# %%
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()
p = kvlab.labs.validate_namespace("L03_prefix_cache_delta", globals())  # checks every parameter; applies quick mode's sizes

# %% [markdown]
# ## Run

# %%
import pandas as pd

from kvlab import caching, timing

llm = kvlab.make_engine(p.model or None, enable_prefix_caching=True)
runs, counters = [], {}
for on in (True, False):
    df, counters["on" if on else "off"] = caching.token_traffic(llm, p.prefix_tokens, p.suffix_tokens, p.requests, p.shared_fraction,
                                                              seed=p.seed, caching=on, max_tokens=p.output_tokens)
    runs.append(df)
runs = pd.concat(runs, ignore_index=True).assign(prefix_tokens=p.prefix_tokens, suffix_tokens=p.suffix_tokens, shared_fraction=p.shared_fraction)
summary = timing.summarize(runs, ["ttft_s"], by=["caching"])
summary["token_hit_rate"] = summary.caching.map({k: v["token_hit_rate"] for k, v in counters.items()})
s = summary.set_index("caching")
summary["ttft_p50_delta_ms"] = (s.ttft_s_p50["off"] - s.ttft_s_p50["on"]) * 1e3
summary["ttft_p50_ratio_on_over_off"] = s.ttft_s_p50["on"] / s.ttft_s_p50["off"]
summary.round(3)

# %%
import plotly.express as px

fig = px.box(runs, x="caching", y=runs.ttft_s * 1e3, color="label", points="all", labels={"y": "TTFT (ms)", "label": "request"},
             title=f"{p.prefix_tokens}-token shared prefix, {p.shared_fraction:.0%} of traffic: TTFT with and without prefix caching")
fig.show()

# %% [markdown]
# ## Save

# %%
out = kvlab.labs.output_dir("L03_prefix_cache_delta", p.output_dir)
kvlab.results.save_results(runs, out, p, engine_settings=llm.kvlab_settings | {"counters": counters},
                           tables={"summary.csv": summary}, figures={"ttft.html": fig})
kvlab.close_engine(llm)
print(f"wrote {len(runs)} requests to {out}")

# %% [markdown]
# ## Exercises
#
# Answer from **your** numbers above — the tables, the plot, the files in `out` — not from the lessons' prose. Put each
# answer in `answers` and run the check: it says whether your reading agrees with this run's data (and, if not, where
# to look), without giving the answer away.

# %%
kvlab.exercises.show("L03")

# %%
answers = {"L03.1": None, "L03.2": None}  # replace None with your answers
kvlab.exercises.check(answers, out)

# %% [markdown]
# ## More to try
#
# 1. What token hit rate would you predict from `prefix_tokens`, `suffix_tokens` and `shared_fraction` alone? Compare.
# 2. Which moves more with caching on, p50 or p95 TTFT? Explain from the share of unique traffic.
# 3. Set `prefix_tokens` to one token less than a multiple of the block size. What happens to the hit rate, and why?
