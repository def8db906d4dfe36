"""Source of labs/L03_prefix_cache_delta.ipynb (run: python tools/lab03.py)."""

from pathlib import Path

from nbgen import exercise_cells, write_notebook

CELLS = [
("md", """
# Lab L03 · Prefix cache delta

Traffic where a share of requests starts with the same prefix (real text, exact token counts) followed by a unique
suffix, and the rest are unique prompts of the same length. Run once with prefix caching and once with the cache
emptied before every request (the same as caching off): token hit rate from the engine's counters, TTFT p50/p95,
and the TTFT delta.

Headless: `papermill labs/L03_prefix_cache_delta.ipynb out.ipynb --cwd labs -p prefix_tokens 2048 -p shared_fraction 0.9`.
Writes `results.csv/.parquet` (one row per request), `summary.csv`, `metadata.json` and `ttft.html`.
"""),
("params", """
model = ""  # Hugging Face id or local folder; empty: KVLAB_MODEL or the course model
prefix_tokens = 1024  # tokens of the shared prefix
suffix_tokens = 64  # tokens of each request's unique suffix
shared_fraction = 0.8  # share of requests that carry the shared prefix, 0-1
requests = 12  # requests per run (one run with caching, one without)
output_tokens = 4  # output tokens per request
seed = 0  # order of shared and unique requests
output_dir = ""  # where results go; empty: build/labs/L03_prefix_cache_delta
"""),
("code", """
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()
params = kvlab.labs.validate("L03_prefix_cache_delta", dict(
    model=model, prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens, shared_fraction=shared_fraction,
    requests=requests, output_tokens=output_tokens, seed=seed, output_dir=output_dir))
if kvlab.quick():
    requests = min(requests, 6)
    print(f"quick mode: requests={requests}")
"""),
("md", """
## Run
"""),
("code", """
import pandas as pd
from kvlab import caching, timing

llm = kvlab.make_engine(model or None, enable_prefix_caching=True)
runs, counters = [], {}
for on in (True, False):
    df, counters["on" if on else "off"] = caching.token_traffic(llm, prefix_tokens, suffix_tokens, requests, shared_fraction,
                                                              seed=seed, caching=on, max_tokens=output_tokens)
    runs.append(df)
runs = pd.concat(runs, ignore_index=True).assign(prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens, shared_fraction=shared_fraction)
summary = timing.summarize(runs, ["ttft_s"], by=["caching"])
summary["token_hit_rate"] = summary.caching.map({k: v["token_hit_rate"] for k, v in counters.items()})
s = summary.set_index("caching")
summary["ttft_p50_delta_ms"] = (s.ttft_s_p50["off"] - s.ttft_s_p50["on"]) * 1e3
summary["ttft_p50_ratio_on_over_off"] = s.ttft_s_p50["on"] / s.ttft_s_p50["off"]
summary.round(3)
"""),
("code", """
import plotly.express as px

fig = px.box(runs, x="caching", y=runs.ttft_s * 1e3, color="label", points="all", labels={"y": "TTFT (ms)", "label": "request"},
             title=f"{prefix_tokens}-token shared prefix, {shared_fraction:.0%} of traffic: TTFT with and without prefix caching")
fig.show()
"""),
("md", """
## Save
"""),
("code", """
out = kvlab.labs.output_dir("L03_prefix_cache_delta", output_dir)
kvlab.results.save_results(runs, out, params, engine_settings=llm.kvlab_settings | {"counters": counters},
                           tables={"summary.csv": summary}, figures={"ttft.html": fig})
kvlab.close_engine(llm)
print(f"wrote {len(runs)} requests to {out}")
"""),
*exercise_cells("L03"),
("md", """
## More to try

1. What token hit rate would you predict from `prefix_tokens`, `suffix_tokens` and `shared_fraction` alone? Compare.
2. Which moves more with caching on, p50 or p95 TTFT? Explain from the share of unique traffic.
3. Set `prefix_tokens` to one token less than a multiple of the block size. What happens to the hit rate, and why?
"""),
]

if __name__ == "__main__":
    write_notebook(Path(__file__).resolve().parents[1] / "labs" / "L03_prefix_cache_delta.ipynb", CELLS)
