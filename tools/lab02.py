"""Source of labs/L02_ttft_tpot_sweep.ipynb (run: python tools/lab02.py)."""

from pathlib import Path

from nbgen import exercise_cells, write_notebook

CELLS = [
("md", """
# Lab L02 · TTFT and TPOT sweep

Prompt lengths × output lengths × repeats on one engine, each request cold (prefix caching off), warm-up first.
Every request is set against this machine's limits (matmul FLOP/s for prefill, memory bandwidth for decode).

Headless: `papermill labs/L02_ttft_tpot_sweep.ipynb out.ipynb --cwd labs -y "prompt_lengths: [256, 2048]" -p enforce_eager False`.
Writes `results.csv/.parquet` (one row per request), `summary.csv` (medians and p95 per point), `metadata.json`
(parameters, machine, engine settings, measured limits) and `ttft_tpot.html`. In quick mode (`KVLAB_QUICK=1`) it
keeps the first two prompt lengths, the first output length and at most two repeats.
"""),
("params", """
model = ""  # Hugging Face id or local folder; empty: KVLAB_MODEL or the course model
prompt_lengths = [128, 512, 1024, 2048]  # prompt tokens per request
output_lengths = [32]  # output tokens per request (exact: end-of-sequence is ignored)
repeats = 3  # timed requests per (prompt, output) point, after one warm-up
dtype = "auto"  # model dtype: auto (platform default: float32 on CPU), float32, bfloat16, float16
enforce_eager = True  # True: no torch.compile (fast start); False: compiled (faster decode, slow first start)
kv_cache_gib = 1.0  # KV cache budget, GiB
output_dir = ""  # where results go; empty: build/labs/L02_ttft_tpot_sweep
"""),
("code", """
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()
params = kvlab.labs.validate("L02_ttft_tpot_sweep", dict(
    model=model, prompt_lengths=prompt_lengths, output_lengths=output_lengths, repeats=repeats, dtype=dtype,
    enforce_eager=enforce_eager, kv_cache_gib=kv_cache_gib, output_dir=output_dir))
if kvlab.quick():
    prompt_lengths, output_lengths, repeats = prompt_lengths[:2], output_lengths[:1], min(repeats, 2)
    print(f"quick mode: prompt_lengths={prompt_lengths}, output_lengths={output_lengths}, repeats={repeats}")
"""),
("md", """
## Run
"""),
("code", """
from kvlab import experiments, roofline, timing

engine_args = dict(enable_prefix_caching=False, enforce_eager=enforce_eager, kv_cache_gib=kv_cache_gib)
if dtype != "auto":
    engine_args["dtype"] = dtype
limits = roofline.measure_limits(None if dtype == "auto" else dtype, quick=kvlab.quick())  # fresh process; again after
llm = kvlab.make_engine(model or None, **engine_args)
cost = roofline.engine_cost(llm)
settings = {"model": llm.kvlab_settings["model"], "dtype": roofline.engine_dtype(llm), "enforce_eager": enforce_eager}
runs = experiments.sweep(llm, prompt_lengths, output_lengths, repeats, **settings)
limits = roofline.best_of(limits, roofline.measure_limits(limits.dtype, quick=kvlab.quick()))
runs = roofline.add_bounds(runs, cost, limits)
summary = timing.summarize(runs, ["ttft_s", "tpot_s", "e2e_s", "ttft_over_bound", "tpot_over_bound"], by=["prompt_tokens", "output_tokens"])
summary.round(4)
"""),
("code", """
fig = kvlab.plots.metric_vs_prompt(summary[summary.output_tokens == output_lengths[0]].merge(
    runs.groupby("prompt_tokens", as_index=False).ttft_bound_s.median()), "ttft_s", "ttft_bound_s",
    f"TTFT vs prompt length ({settings['dtype']}, {'eager' if enforce_eager else 'compiled'})", "TTFT (ms)")
fig.show()
"""),
("md", """
## Save
"""),
("code", """
out = kvlab.labs.output_dir("L02_ttft_tpot_sweep", output_dir)
kvlab.results.save_results(runs, out, params, engine_settings=llm.kvlab_settings | {"limits": limits.as_dict()},
                           tables={"summary.csv": summary}, figures={"ttft_tpot.html": fig})
kvlab.close_engine(llm)
print(f"wrote {len(runs)} requests to {out}")
"""),
*exercise_cells("L02"),
("md", """
## More to try

1. Which column of `summary.csv` grows with the prompt and which does not? Put a number on each.
2. Run the lab twice, with `enforce_eager` True and False. Which metric does compilation improve, and by how much?
3. `ttft_over_bound` falls as prompts grow. What does that say about how well short prompts use the machine?
"""),
]

if __name__ == "__main__":
    write_notebook(Path(__file__).resolve().parents[1] / "labs" / "L02_ttft_tpot_sweep.ipynb", CELLS)
