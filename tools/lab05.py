"""Source of labs/L05_batch_sweep.ipynb (run: python tools/lab05.py)."""

from pathlib import Path

from nbgen import exercise_cells, write_notebook

CELLS = [
("md", """
# Lab L05 · Batch sweep

Offline batches of B distinct prompts, each with exactly the same prompt and output length: TTFT and TPOT (median,
p95), decode throughput (B ÷ TPOT), output throughput (prefill included) and preemptions, per batch size.

Headless: `papermill labs/L05_batch_sweep.ipynb out.ipynb --cwd labs -y "batch_sizes: [1, 8, 64]" -p kv_cache_gib 0.25`.
Writes `results.csv/.parquet` (one row per request), `summary.csv` (one row per batch size), `metadata.json` and
`throughput.html`. Quick mode keeps the first and last batch sizes and one repeat.
"""),
("params", """
model = ""  # Hugging Face id or local folder; empty: KVLAB_MODEL or the course model
batch_sizes = [1, 4, 16, 32]  # sequences submitted together
prompt_tokens = 128  # prompt tokens per sequence
output_tokens = 32  # output tokens per sequence (exact)
repeats = 2  # batches per size, after one warm-up batch
kv_cache_gib = 1.0  # KV cache budget, GiB (small values cap the batch: see preemptions)
enforce_eager = True  # True: no torch.compile; False: compiled (slow first start)
output_dir = ""  # where results go; empty: build/labs/L05_batch_sweep
"""),
("code", """
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()
params = kvlab.labs.validate("L05_batch_sweep", dict(
    model=model, batch_sizes=batch_sizes, prompt_tokens=prompt_tokens, output_tokens=output_tokens, repeats=repeats,
    kv_cache_gib=kv_cache_gib, enforce_eager=enforce_eager, output_dir=output_dir))
if kvlab.quick():
    batch_sizes, repeats = sorted({batch_sizes[0], batch_sizes[-1]}), 1
    print(f"quick mode: batch_sizes={batch_sizes}, repeats={repeats}")
"""),
("md", """
## Run
"""),
("code", """
from kvlab import experiments

llm = kvlab.make_engine(model or None, enable_prefix_caching=False, enforce_eager=enforce_eager, kv_cache_gib=kv_cache_gib,
                        max_model_len=max(1024, prompt_tokens + output_tokens))
capacity = kvlab.kv_capacity(llm)
runs = experiments.batch_sweep(llm, batch_sizes, prompt_tokens, output_tokens, repeats)
summary = experiments.batch_summary(runs)
summary.round(3)
"""),
("code", """
import plotly.express as px

fig = px.line(summary, x="batch_size", y=["decode_tok_s", "output_tok_s"], markers=True, log_x=True,
              title=f"Throughput vs batch size ({capacity.tokens:,} tokens of KV)", labels={"value": "tokens per second", "variable": ""})
fig.show()
"""),
("md", """
## Save
"""),
("code", """
out = kvlab.labs.output_dir("L05_batch_sweep", output_dir)
kvlab.results.save_results(runs, out, params, engine_settings=llm.kvlab_settings | {"kv_capacity": capacity.as_dict()},
                           tables={"summary.csv": summary}, figures={"throughput.html": fig})
kvlab.close_engine(llm)
print(f"wrote {len(runs)} requests to {out}")
"""),
*exercise_cells("L05"),
("md", """
## More to try

1. At which batch size does decode throughput stop doubling when the batch doubles?
2. Lower `kv_cache_gib` until `preemptions` appear. Compare that batch size with `capacity.tokens ÷ (prompt + output)`.
"""),
]

if __name__ == "__main__":
    write_notebook(Path(__file__).resolve().parents[1] / "labs" / "L05_batch_sweep.ipynb", CELLS)
