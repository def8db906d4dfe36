"""Source of labs/L04_chunked_prefill.ipynb (run: python tools/lab04.py)."""

from pathlib import Path

from nbgen import exercise_cells, write_notebook

CELLS = [
("md", """
# Lab L04 · Chunked prefill

Decoders stream from t = 0; a long prompt arrives mid-stream. One engine per configuration: chunked prefill off, and
on with each token budget in `budgets`. Reports, per configuration, the long prompt's TTFT and the decoders'
inter-token gaps (p50/p95/max) while it was prefilled.

Headless: `papermill labs/L04_chunked_prefill.ipynb out.ipynb --cwd labs -y "budgets: [128, 512]" -p long_prompt_tokens 4096`.
Writes `results.csv/.parquet` (one row per configuration), `tokens.parquet` (every token of every run), `metadata.json`
and `tradeoff.html`. Quick mode keeps the first two budgets.
"""),
("params", """
model = ""  # Hugging Face id or local folder; empty: KVLAB_MODEL or the course model
decoders = 3  # chat requests streaming from t = 0
decoder_prompt_tokens = 64  # prompt tokens of each decoder
decoder_output_tokens = 48  # output tokens of each decoder
long_prompt_tokens = 2048  # tokens of the long prompt
long_arrival_s = 0.5  # when the long prompt arrives, seconds after the start
budgets = [256, 1024]  # max_num_batched_tokens values to try with chunked prefill on (tokens per step)
output_dir = ""  # where results go; empty: build/labs/L04_chunked_prefill
"""),
("code", """
import kvlab

kvlab.setup_notebook()
env = kvlab.print_env()
params = kvlab.labs.validate("L04_chunked_prefill", dict(
    model=model, decoders=decoders, decoder_prompt_tokens=decoder_prompt_tokens, decoder_output_tokens=decoder_output_tokens,
    long_prompt_tokens=long_prompt_tokens, long_arrival_s=long_arrival_s, budgets=budgets, output_dir=output_dir))
if kvlab.quick():
    budgets = budgets[:2]
    print(f"quick mode: budgets={budgets}")
"""),
("md", """
## Run
"""),
("code", """
import pandas as pd
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from kvlab import workload

tok = AutoTokenizer.from_pretrained(kvlab.resolve_model(model or None))
configs = {"chunked off": {"enable_chunked_prefill": False}}
configs |= {f"chunks of {b}": {"enable_chunked_prefill": True, "max_num_batched_tokens": b} for b in budgets}
rows, all_tokens = [], []
for name, args in tqdm(configs.items(), desc="configurations"):
    llm = kvlab.make_engine(model or None, enforce_eager=True, **args)
    arrivals = workload.interference_arrivals(tok, decoders, decoder_prompt_tokens, decoder_output_tokens, long_prompt_tokens, long_arrival_s)
    tokens, reqs = workload.run_workload(llm, arrivals)
    rows.append({"config": name, "max_num_batched_tokens": args.get("max_num_batched_tokens", 0)} | workload.interference_summary(tokens, reqs))
    all_tokens.append(tokens.assign(config=name))
    kvlab.close_engine(llm)
results = pd.DataFrame(rows)
results.round(1)
"""),
("code", """
fig = kvlab.plots.tradeoff(results)
fig.show()
"""),
("md", """
## Save
"""),
("code", """
out = kvlab.labs.output_dir("L04_chunked_prefill", output_dir)
kvlab.results.save_results(results, out, params, engine_settings={"configs": {k: str(v) for k, v in configs.items()}},
                           tables={"tokens.parquet": pd.concat(all_tokens)}, figures={"tradeoff.html": fig})
print(f"wrote {len(results)} configurations to {out}")
"""),
*exercise_cells("L04"),
("md", """
## More to try

1. Which budget keeps the decoders' p95 gap under twice their normal pace? What does it cost the long prompt?
2. Plot `decoder_itl_max_ms` against `max_num_batched_tokens`. Is it linear? Why (or why not)?
"""),
]

if __name__ == "__main__":
    write_notebook(Path(__file__).resolve().parents[1] / "labs" / "L04_chunked_prefill.ipynb", CELLS)
