"""The concurrent workload driver: gap and concurrency arithmetic on small frames, then a real engine run."""

import pandas as pd
import pytest

from kvlab import chunked_prefill, workload


def tokens_frame():
    rows = [("a", "decoder 1", i, t) for i, t in enumerate([0.1, 0.2, 0.3, 1.3, 1.4], start=1)]
    rows += [("b", "long prompt", 1, 1.25)]
    return pd.DataFrame(rows, columns=["request_id", "label", "token", "t_s"])


def test_gaps_between_picks_gaps_ending_in_the_window():
    gaps = chunked_prefill.gaps_between(tokens_frame(), ["decoder 1"], 0.5, 1.3)
    assert gaps == pytest.approx([1.0])
    assert chunked_prefill.gaps_between(tokens_frame(), "decoder 1", 0.0, 0.35) == pytest.approx([0.1, 0.1])


def test_concurrency_is_busy_time_over_span():
    reqs = pd.DataFrame({"arrival_s": [0.0, 1.0], "last_token_s": [2.0, 3.0]})
    assert workload.concurrency(reqs) == pytest.approx(4.0 / 3.0)


def test_poisson_arrivals_are_seeded_and_ordered(model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    a = workload.poisson_arrivals(tok, 5, 10.0, 32, 4, seed=1)
    b = workload.poisson_arrivals(tok, 5, 10.0, 32, 4, seed=1)
    assert [x.at_s for x in a] == [x.at_s for x in b] and a[0].at_s == 0
    assert all(x.at_s <= y.at_s for x, y in zip(a, a[1:], strict=False)) and all(len(x.prompt_ids) == 32 for x in a)


@pytest.mark.engine
def test_run_workload_times_every_token_and_admits_late_arrivals(engine):
    tok = engine.get_tokenizer()
    arrivals = chunked_prefill.interference_arrivals(tok, decoders=2, decoder_prompt=32, decoder_tokens=12, long_prompt=512, long_at_s=0.2)
    tokens, reqs = workload.run_workload(engine, arrivals)
    r = reqs.set_index("label")
    assert list(r.output_tokens) == [12, 12, 4]
    assert r.submitted_s["long prompt"] >= 0.2 and r.submitted_s["decoder 1"] < 0.05
    assert (reqs.ttft_s > 0).all() and (reqs.last_token_s >= reqs.first_token_s).all()
    assert (reqs.ttft_s >= reqs.first_token_s - reqs.submitted_s - 1e-9).all()  # TTFT counts from arrival
    summary = chunked_prefill.interference_summary(tokens, reqs)
    assert summary["long_ttft_ms"] > 0 and summary["decoder_itl_max_ms"] >= summary["decoder_itl_p50_ms"]


@pytest.mark.engine
def test_batch_sweep_rows_and_throughput(engine):
    from kvlab import batching

    df = batching.batch_sweep(engine, [1, 4], prompt_tokens=32, output_tokens=8, repeats=1)
    assert len(df) == 5 and (df.output_tokens == 8).all()
    s = batching.batch_summary(df).set_index("batch_size")
    assert s.decode_tok_s[4] > s.decode_tok_s[1]
