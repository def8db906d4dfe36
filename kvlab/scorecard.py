"""Predict, then measure: a held-out grid forecast on vLLM's scheduler, written down, measured, and scored.

Lesson 10 and lab L10. The grid's points are workloads none of which the step model was fitted on (longer prompts,
bigger batches, a long prompt arriving during decodes at a chunked-prefill budget, shared-prefix traffic with prefix
caching, Poisson arrivals below and above the predicted capacity, and a second model never calibrated on). Every
prediction goes to ``predictions.csv`` (with its time and a hash of the grid) *before* any point runs; ``measure``
refuses to run without it. The scorecard then lists, per metric and point, the prediction, its 80 % interval and the
measurement; ``error_budget`` says for each large miss whether the step model missed its own steps or the schedule
differed (steps, prefix hits, preemptions).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvlab import forecast, slo, speculative
from kvlab.prompts import distinct_prompts, shared_prefix_prompts
from kvlab.runtime import config
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.randomweights import SECOND_MODEL
from kvlab.runtime.templates import chat_template_ids
from kvlab.stepmodel import StepModel, StepRecorder, speed_now
from kvlab.workload import Arrival, poisson_arrivals, run_workload

#: Metrics scored per kind of point (peak KV blocks only where every request arrives at once: its timing is exact).
METRICS = {
    "unloaded": ["ttft_p50_ms", "tpot_p50_ms", "peak_blocks"],
    "batch": ["ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms", "throughput_tok_s", "peak_blocks"],
    "chunked": ["ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms", "e2e_p50_ms"],
    "prefix": ["hit_rate", "ttft_p50_ms", "tpot_p50_ms"],
    "poisson": ["ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms", "throughput_tok_s"],
    "second model": ["ttft_p50_ms", "tpot_p50_ms", "peak_blocks"],
    "speculation": ["tokens_per_step", "tpot_p50_ms", "e2e_p50_ms"],
}
#: Kinds forecast only after their run: speculation's drafts depend on the text, so it is forecast given the
#: acceptance vLLM counted in the same run (``predict_given_acceptance``).
CONDITIONAL = {"speculation"}
#: Draft tokens per step of the speculation points (n-gram, prompt lookup 2–4).
SPEC_K = 4
#: The Poisson traffic's shape: prompt and output tokens per request (not a calibration composition).
POISSON_PROMPT, POISSON_OUTPUT = 320, 32


@dataclass
class GridPoint:
    """One held-out workload: its name, kind, the engine it runs on (a key of the lesson's engines) and arrivals."""

    name: str
    kind: str
    engine: str
    arrivals: list[Arrival]
    rate_rps: float = math.nan
    one_at_a_time: bool = False  # each request runs alone (its own run, the engine idle before it)

    def runs(self) -> list[list[Arrival]]:
        """The runs this point is made of: one per request when ``one_at_a_time``, else one."""
        return [[a] for a in self.arrivals] if self.one_at_a_time else [self.arrivals]

    def describe(self) -> dict[str, Any]:
        lengths = [len(a.prompt_ids) for a in self.arrivals]
        return {"point": self.name, "kind": self.kind, "engine": self.engine, "requests": len(self.arrivals),
                "prompt_tokens": int(np.median(lengths)), "output_tokens": int(np.median([a.max_tokens for a in self.arrivals])),
                "rate_rps": self.rate_rps}


def other_model(course_model: str) -> str:
    """The model the forecast is never calibrated on: the second course model, or the course default when the course
    itself runs on the second model."""
    return config.DEFAULT_MODEL if SECOND_MODEL.lower() in course_model.lower() else SECOND_MODEL


def _batch(tok: Any, name: str, kind: str, engine: str, n: int, prompt: int, out: int, seed: int) -> GridPoint:
    ids = distinct_prompts(tok, prompt, n, seed=seed)
    return GridPoint(name, kind, engine, [Arrival(f"{name} #{i + 1}", p, out, 0.0) for i, p in enumerate(ids)])


def unloaded(tok: Any, prompt: int, out: int, seed: int, engine: str = "main", kind: str = "unloaded",
             name: str | None = None, requests: int = 3) -> GridPoint:
    """``requests`` requests of one shape (three; two on a machine too slow for three), each run alone on an idle engine."""
    name = name or f"alone {prompt}"
    ids = distinct_prompts(tok, prompt, requests, seed=seed)
    return GridPoint(name, kind, engine, [Arrival(f"{name} #{i + 1}", p, out, 0.0) for i, p in enumerate(ids)],
                     one_at_a_time=True)


def long_during_decodes(tok: Any, engine: str, budget: int, long_prompt: int, seed: int) -> GridPoint:
    """Three decoders (96-token prompts, 64 tokens out) and, 0.25 s later, one long prompt (16 tokens out)."""
    name = f"{long_prompt} during decodes, budget {budget}"
    dec = [Arrival(f"{name} decoder {i + 1}", p, 64, 0.0) for i, p in enumerate(distinct_prompts(tok, 96, 3, seed=seed))]
    return GridPoint(name, "chunked", engine, [*dec, Arrival(f"{name} long", distinct_prompts(tok, long_prompt, 1, seed=seed + 1)[0], 16, 0.25)])


def shared_prefix(tok: Any, prefix: int, requests: int, gap_s: float, seed: int) -> GridPoint:
    """``requests`` prompts sharing a ``prefix``-token prefix (64 distinct tokens after it), ``gap_s`` apart."""
    name = f"shared prefix {prefix}"
    ids = shared_prefix_prompts(tok, prefix, 64, requests, seed=seed)
    return GridPoint(name, "prefix", "main", [Arrival(f"{name} #{i + 1}", p, 16, i * gap_s) for i, p in enumerate(ids)])


def speculation_point(tok: Any, k: int, requests: int, out: int, seed: int) -> GridPoint:
    """``requests`` "edit" chats (fix a paragraph's typos and return it: the answer copies the prompt, so the n-gram
    proposer finds drafts) submitted together to the speculative engine (``k`` draft tokens per step)."""
    name = f"speculation k={k}, {requests} edits"
    ids = [chat_template_ids(tok, m) for m in speculative.task_messages("edit", requests, seed=seed)]
    return GridPoint(name, "speculation", "spec", [Arrival(f"{name} #{i + 1}", p, out, 0.0) for i, p in enumerate(ids)])


def poisson(tok: Any, rate: float, requests: int, fraction: float, seed: int) -> GridPoint:
    """``requests`` chats (``POISSON_PROMPT`` tokens in, ``POISSON_OUTPUT`` out) arriving as a Poisson process
    (``workload.poisson_arrivals``: the same seed gives the same gaps, scaled by the rate)."""
    name = f"Poisson {fraction:.0%} of capacity"
    arrivals = poisson_arrivals(tok, requests, rate, POISSON_PROMPT, POISSON_OUTPUT, seed=seed)
    for i, a in enumerate(arrivals):
        a.label = f"{name} #{i + 1}"
    return GridPoint(name, "poisson", "main", arrivals, rate)


def poisson_maker(tok: Any, requests: int, seed: int) -> Any:
    """Arrivals at any rate with the same prompts and the same random gaps (scaled): the forecast's capacity search."""
    return lambda rate: poisson(tok, rate, requests, 0.0, seed).arrivals


def alone(setup: forecast.Setup, tok: Any, model: StepModel) -> pd.Series:
    """The forecast of one Poisson-traffic request with the engine to itself (TTFT, TPOT, E2E …)."""
    return forecast.simulate(setup, poisson(tok, 1.0, 1, 0.0, 7).arrivals, model).requests.iloc[0]


def relative_slo(setup: forecast.Setup, tok: Any, model: StepModel, ttft_x: float = 3.0, tpot_x: float = 2.0) -> slo.SLO:
    """The SLO of the Poisson traffic, from its forecast unloaded: TTFT p90 ≤ ``ttft_x`` × and TPOT p90 ≤ ``tpot_x`` ×
    one request alone."""
    one = alone(setup, tok, model)
    return slo.SLO(ttft_ms=ttft_x * one.ttft_s * 1e3, tpot_ms=tpot_x * one.tpot_s * 1e3, percentile=90)


MIN_POISSON_REQUESTS = 8  # the fewest requests a Poisson rate sends: its p90 is then between the 7th and 8th slowest


def grid_sizes(quick: bool) -> dict[str, Any]:
    """The held-out grid's sizes: quick mode (≥ 8 points) or full (≥ 30); lab L10 takes each as a parameter."""
    if quick:
        return {"prompt_lengths": [768, 1536], "batches": [(8, 384)], "budgets": {"main": 512}, "long_prompts": [1536],
                "prefixes": [512], "rate_fractions": [0.5, 1.25], "poisson_requests": 16, "poisson_window_s": 15.0,
                "second_batches": [4], "output_tokens": 16}
    return {"prompt_lengths": [96, 192, 384, 768, 1536, 2560],
            "batches": [(6, 384), (8, 128), (12, 256), (16, 64), (16, 512), (24, 128)],
            "budgets": {"main": 512, "budget 256": 256}, "long_prompts": [1024, 2048], "prefixes": [256, 640, 1024],
            "rate_fractions": [0.6, 0.8, 0.95, 1.25], "poisson_requests": 30, "poisson_window_s": 20.0,
            "second_batches": [1, 4, 8, 16, 32], "output_tokens": 24, "second_alone": 1280}


def held_out_grid(toks: dict[str, Any], capacity_rps: float, prompt_lengths: list[int], batches: list[tuple[int, int]],
                  budgets: dict[str, int], long_prompts: list[int], prefixes: list[int], rate_fractions: list[float],
                  poisson_requests: int, poisson_window_s: float, second_batches: list[int], output_tokens: int,
                  second_alone: int | None = None, speculation_k: int = SPEC_K,
                  overload_window_s: float | None = None, alone_requests: int = 3) -> list[GridPoint]:
    """The held-out points (``grid_sizes``), none a calibration composition. ``toks`` maps each engine key ("main",
    each budget's key, "second") to its tokenizer; Poisson rates are fractions of ``capacity_rps``, each with as many
    requests as arrive in ``poisson_window_s`` at that rate (at least ``MIN_POISSON_REQUESTS``, at most
    ``poisson_requests``): the same traffic shape and wall time on a fast machine and a slow one. A rate above
    capacity sends what arrives in ``overload_window_s`` (default: the same window): its queue needs time to build.
    With a "spec" engine, one speculation point (four edits submitted together, ``speculation_k`` draft tokens per
    step, twice the output tokens). Each prompt length alone is run ``alone_requests`` times."""
    def window(f: float) -> float:
        return overload_window_s if f > 1 and overload_window_s else poisson_window_s

    tok, out = toks["main"], output_tokens
    grid = [unloaded(tok, p, out, seed=10 + i, requests=alone_requests) for i, p in enumerate(prompt_lengths)]
    grid += [_batch(tok, f"batch {n} × {p}", "batch", "main", n, p, out, seed=30 + i) for i, (n, p) in enumerate(batches)]
    grid += [long_during_decodes(toks[e], e, b, n, seed=50 + i) for e, b in budgets.items() for i, n in enumerate(long_prompts)]
    grid += [shared_prefix(tok, p, 6 if len(prefixes) == 1 else 8, 0.2, seed=70 + i) for i, p in enumerate(prefixes)]
    for i, f in enumerate(rate_fractions):
        n = int(min(poisson_requests, max(MIN_POISSON_REQUESTS, f * capacity_rps * window(f))))
        grid.append(poisson(tok, f * capacity_rps, n, f, seed=90 + i))
    if "second" in toks:
        grid += [_batch(toks["second"], f"second model, batch {n}", "second model", "second", n, 320, out, seed=110 + n)
                 for n in second_batches]
        if second_alone:
            grid.append(unloaded(toks["second"], second_alone, out, seed=120, engine="second", kind="second model",
                                 name=f"second model, alone {second_alone}", requests=alone_requests))
    if "spec" in toks:
        grid.append(speculation_point(toks["spec"], speculation_k, 4, 2 * out, seed=130))
    return grid


def predicted_seconds(point: GridPoint, setup: forecast.Setup, model: StepModel) -> float:
    """How long measuring ``point`` takes, by its central forecast: each run from its start to its last token."""
    return sum(float(forecast.simulate(setup, run, model).requests.last_token_s.max()) for run in point.runs())


def grid_for_time(toks: dict[str, Any], capacity_rps: float, sizes: dict[str, Any], setups: dict[str, forecast.Setup],
                  models: dict[str, StepModel], target_s: float, fewer_output_tokens: tuple[int, int] = (16, 12)
                  ) -> tuple[list[GridPoint], pd.Series]:
    """The held-out grid whose forecast measuring time fits ``target_s``: the Poisson window of the rates below
    capacity (the part of the grid whose time is set in seconds) shortened as far as needed, never below
    ``MIN_POISSON_REQUESTS`` per rate; a rate above capacity keeps the whole window (a short burst meets any SLO: its
    queue must have time to grow). Where that is not enough (a slow machine), every request outside the Poisson rates
    (theirs keep ``POISSON_OUTPUT``) writes the first of ``fewer_output_tokens`` instead; where even that is not, each
    prompt length alone runs twice instead of three times; and slower still, those requests write the second. The
    points stay the same. The grid, and each point's forecast seconds (the lesson prints both)."""
    grid, seconds = _grid_for_time(toks, capacity_rps, sizes, setups, models, target_s)
    more, least = (min(n, sizes["output_tokens"]) for n in fewer_output_tokens)
    for fewer in ({"output_tokens": more}, {"alone_requests": 2}, {"output_tokens": least}):
        if seconds.sum() <= target_s:
            break
        sizes = sizes | fewer
        grid, seconds = _grid_for_time(toks, capacity_rps, sizes, setups, models, target_s)
    return grid, seconds


def _grid_for_time(toks: dict[str, Any], capacity_rps: float, sizes: dict[str, Any], setups: dict[str, forecast.Setup],
                   models: dict[str, StepModel], target_s: float) -> tuple[list[GridPoint], pd.Series]:
    """``grid_for_time`` at ``sizes``' output tokens: only the Poisson windows below capacity shortened."""
    full = float(sizes["poisson_window_s"])

    def shortened(p: GridPoint) -> bool:
        return p.kind == "poisson" and p.rate_rps <= capacity_rps

    def build(window: float) -> list[GridPoint]:
        return held_out_grid(toks, capacity_rps, **(sizes | {"poisson_window_s": window, "overload_window_s": full}))

    grid = build(full)
    seconds = pd.Series({p.name: predicted_seconds(p, setups[p.engine], models[p.engine]) for p in grid})
    poisson_s = sum(seconds[p.name] for p in grid if shortened(p))
    if seconds.sum() > target_s and poisson_s > 0:
        grid = build(max(1.0, full * max(0.0, target_s - (seconds.sum() - poisson_s)) / poisson_s))
        for p in filter(shortened, grid):  # only these changed: the other points' forecasts stand
            seconds[p.name] = predicted_seconds(p, setups[p.engine], models[p.engine])
    return grid, seconds


def check_grid(grid: list[GridPoint], setups: dict[str, forecast.Setup]) -> None:
    """One sentence, before any calibration or measurement, for a point whose engine is missing or whose requests
    cannot fit its engine's context or KV pool (``forecast.check_workload``)."""
    for p in grid:
        if p.engine not in setups:
            raise KVLabError(f"Grid point '{p.name}' runs on engine '{p.engine}', which was not started; start it or "
                             "drop the point.")
        forecast.check_workload(setups[p.engine], p.arrivals)


def grid_hash(grid: list[GridPoint]) -> str:
    """A hash of every request of the grid (engine, prompt, output tokens, arrival time): the measuring step checks
    that it measures the grid that was predicted."""
    h = hashlib.sha256()
    for p in grid:
        for a in p.arrivals:
            h.update(json.dumps([p.name, p.engine, a.prompt_ids, a.max_tokens, round(a.at_s, 6)]).encode())
    return h.hexdigest()[:16]


def predict_grid(grid: list[GridPoint], setups: dict[str, forecast.Setup], models: dict[str, StepModel],
                 samples: int = 12) -> tuple[pd.DataFrame, dict[str, forecast.Forecast]]:
    """Every point's predictions with their 80 % intervals, one row per (point, metric), and each point's central
    forecast (its simulated requests and steps). ``CONDITIONAL`` kinds are left to ``predict_given_acceptance``."""
    rows, central = [], {}
    for p in grid:
        if p.kind in CONDITIONAL:
            continue
        pred = forecast.predict(setups[p.engine], p.runs(), models[p.engine], samples=samples)
        central[p.name] = pred.central
        for metric in METRICS[p.kind]:
            rows.append(p.describe() | {"metric": metric, "predicted": pred.metrics[metric], "lo80": pred.lo80[metric],
                                        "hi80": pred.hi80[metric]})
    return pd.DataFrame(rows), central


def predict_given_acceptance(grid: list[GridPoint], setups: dict[str, forecast.Setup], models: dict[str, StepModel],
                             measured: dict[str, Any], samples: int = 12) -> tuple[pd.DataFrame, dict[str, forecast.Forecast]]:
    """The speculation points' predictions, made after their run from the acceptance vLLM counted in it (coverage,
    draft length, acceptance by position): vLLM's scheduler verifies the drafts, the step model times the k + 1-token
    steps. Rows as ``predict_grid``'s, with ``given`` saying what was taken from the run."""
    rows, central = [], {}
    for p in grid:
        if p.kind not in CONDITIONAL:
            continue
        requests, steps = measured[p.name]
        spec = forecast.Speculation.from_counters(steps.attrs["acceptance"], int(requests.decode_steps.sum()))
        pred = forecast.predict(setups[p.engine], p.runs(), models[p.engine], samples=samples, speculation=spec)
        central[p.name] = pred.central
        given = (f"measured acceptance: coverage {spec.coverage:.2f}, {spec.draft_length:.2f} tokens per draft, "
                 f"by position {', '.join(f'{a:.2f}' for a in spec.accepted_by_position)}")
        for metric in METRICS[p.kind]:
            rows.append(p.describe() | {"metric": metric, "predicted": pred.metrics[metric], "lo80": pred.lo80[metric],
                                        "hi80": pred.hi80[metric], "given": given})
    return pd.DataFrame(rows), central


def write_predictions(table: pd.DataFrame, grid: list[GridPoint], out: str | Path) -> dict[str, str]:
    """Write ``predictions.csv`` and ``predictions.json`` (when, the file's SHA-256, the grid's hash)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "predictions.csv"
    table.to_csv(path, index=False)
    stamp = {"written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "written_unix": time.time(),
             "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "grid": grid_hash(grid), "points": len(grid)}
    (out / "predictions.json").write_text(json.dumps(stamp, indent=2))
    return stamp


def check_predictions(grid: list[GridPoint], out: str | Path) -> dict[str, Any]:
    """The predictions' stamp, or one sentence refusing to measure: none written, edited since, or for another grid."""
    out = Path(out)
    path, stamp_path = out / "predictions.csv", out / "predictions.json"
    if not path.exists() or not stamp_path.exists():
        raise KVLabError(f"No predictions in {out}: write them first (scorecard.write_predictions) — this lesson measures "
                         "only what it predicted beforehand.")
    stamp = json.loads(stamp_path.read_text())
    if hashlib.sha256(path.read_bytes()).hexdigest() != stamp["sha256"]:
        raise KVLabError(f"{path} changed after it was written; predict again before measuring.")
    if stamp["grid"] != grid_hash(grid):
        raise KVLabError(f"{path} predicts another grid (hash {stamp['grid']}); predict this grid before measuring it.")
    return stamp


def measure_point(llm: Any, point: GridPoint) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run one point on the engine (prefix cache emptied first) with the course's workload driver; return its
    requests and its recorded steps (composition, measured ms, KV blocks in use)."""
    recorder, parts = StepRecorder(llm), []
    before = speculative.counters(llm)
    for run in point.runs():
        llm.reset_prefix_cache()
        with recorder.recording():
            parts.append(run_workload(llm, run)[1])
    acceptance = speculative.acceptance(before, speculative.counters(llm))
    requests = pd.concat(parts, ignore_index=True)
    steps = pd.DataFrame({"seconds": [s.seconds for s in recorder.steps], "sequences": [len(s.sequences) for s in recorder.steps],
                          "tokens": [s.tokens for s in recorder.steps], "blocks_used": recorder.blocks_used})
    steps.attrs["steps"] = recorder.steps
    steps.attrs["acceptance"] = acceptance  # vLLM's speculative-decoding counters over this point (zeros when off)
    return requests, steps


#: A canary that ran this much slower than the grid's fastest canary marks the machine as busy (another process on the
#: cores): the point beside it is measured once more.
CANARY_SLOWER = 0.10


def measure_grid(engines: dict[str, Any], grid: list[GridPoint], out: str | Path, model: StepModel | None = None,
                 retries: float = 0.25, retry_s: float = float("inf")) -> dict[str, Any]:
    """Measure every point (refused unless this grid's predictions are on disk); return {point: (requests, steps)}.
    One untimed warm-up request per engine first. With ``model`` (the main engine's step model), a canary
    (``stepmodel.speed_now``: the same 4 short sequences every time, measured ÷ predicted) runs on the main engine
    before each point and after the last: a point whose canary before or after ran more than
    ``CANARY_SLOWER`` slower than the fastest canary so far was measured while the machine was busy, and is measured
    once more (at most ``retries`` × the points, and while the first runs of the points measured again add up to no
    more than ``retry_s`` seconds); the run beside the faster canaries is kept — chosen by the canaries, never by the
    point's own error. Each point's canaries are in ``steps.attrs["canary"]`` (``machine_speed``)."""
    check_predictions(grid, out)
    from tqdm.auto import tqdm

    for key, llm in engines.items():
        warm = next((p for p in grid if p.engine == key), None)
        if warm is not None:
            run_workload(llm, [Arrival("warm-up", warm.arrivals[0].prompt_ids[:64], 4, 0.0)])
    if model is None:
        return {p.name: measure_point(engines[p.engine], p) for p in tqdm(grid, desc="measuring", leave=False)}
    main, left = engines["main"], max(1, int(retries * len(grid)))
    fastest = before = speed_now(main, model, warm_up=False)
    measured = {}
    for p in tqdm(grid, desc="measuring", leave=False):
        started = time.perf_counter()
        result = measure_point(engines[p.engine], p)
        took = time.perf_counter() - started
        after = speed_now(main, model, warm_up=False)
        fastest = min(fastest, before, after)
        slow = max(before, after) / fastest - 1
        record = {"before": before, "after": after, "slower": slow, "remeasured": False}
        if slow > CANARY_SLOWER and left > 0 and took <= retry_s:  # the machine was busy: once more, keep the calmer run
            left, retry_s = left - 1, retry_s - took
            before_again = speed_now(main, model, warm_up=False)
            again = measure_point(engines[p.engine], p)
            after_again = speed_now(main, model, warm_up=False)
            fastest = min(fastest, before_again, after_again)
            slow_again = max(before_again, after_again) / fastest - 1
            record |= {"remeasured": True, "first_slower": slow}
            if slow_again < slow:
                result, after = again, after_again
                record |= {"before": before_again, "after": after_again, "slower": slow_again}
        result[1].attrs["canary"] = record
        measured[p.name] = result
        before = after
    return measured


def machine_speed(measured: dict[str, Any]) -> pd.DataFrame:
    """Per point: its canaries (measured ÷ predicted step time before and after it), how much slower the slower one
    ran than the grid's fastest, and whether the point was measured again."""
    rows = [{"point": name} | steps.attrs["canary"] for name, (_, steps) in measured.items() if "canary" in steps.attrs]
    return pd.DataFrame(rows, columns=["point", "before", "after", "slower", "remeasured", "first_slower"])


def score(predictions: pd.DataFrame, measured: dict[str, Any]) -> pd.DataFrame:
    """The scorecard: one row per (point, metric) with predicted, measured, the 80 % interval, the relative error
    (predicted ÷ measured − 1; for the hit rate, the difference in points) and whether the measurement is inside."""
    values = {point: forecast.run_metrics(*run) for point, run in measured.items()}
    rows = []
    for _, r in predictions.iterrows():
        value = values[r.point][r.metric]
        if r.metric == "hit_rate":
            error = r.predicted - value
        else:
            error = r.predicted / value - 1 if value else math.nan
        rows.append({**r.to_dict(), "held_out": True, "measured": value, "error": error,
                     "inside": bool(r.lo80 <= value <= r.hi80)})
    return pd.DataFrame(rows)


def coverage(card: pd.DataFrame) -> tuple[float, int, int]:
    """The 80 % intervals' coverage: the share of measurements inside their interval, over the metrics with a drawn
    interval (not ``forecast.EXACT_METRICS``, forecast exact); with how many were inside and how many there were."""
    drawn = card[~card.metric.isin(forecast.EXACT_METRICS)]
    return float(drawn.inside.mean()), int(drawn.inside.sum()), len(drawn)


def summary(card: pd.DataFrame) -> pd.DataFrame:
    """Per metric: points, median |error| and the share of measurements inside their 80 % interval."""
    g = card.groupby("metric")
    return pd.DataFrame({"points": g.size(), "median_abs_error": g.error.apply(lambda e: float(e.abs().median())),
                         "inside_80": g.inside.mean()}).reset_index()


def capacity(setup: forecast.Setup, tok: Any, model: StepModel, objective: slo.SLO, requests: int,
             seeds: int = 8) -> dict[str, float]:
    """The forecast maximum sustainable rate of the Poisson traffic, over ``seeds`` arrival draws: the median and the
    10th–90th percentile (the arrival process alone moves a p90 over a few dozen requests). The search starts where
    the engine would be busy a tenth of the time (0.1 ÷ one request's E2E alone) and doubles past one request per E2E
    while the SLO holds: the same shape of search on a fast machine and on a slow one."""
    per_e2e = 1.0 / float(alone(setup, tok, model).e2e_s)  # req/s that keep the engine busy with one request at a time
    rates = [forecast.max_rate(setup, poisson_maker(tok, requests, 90 + 1000 * s), model, objective, 0.1 * per_e2e,
                               per_e2e) for s in range(seeds)]
    return {"rate": float(np.median(rates)), "lo80": float(np.percentile(rates, 10)), "hi80": float(np.percentile(rates, 90))}


def capacity_check(grid: list[GridPoint], measured: dict[str, Any], central: dict[str, forecast.Forecast],
                   objective: slo.SLO) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Per Poisson point, whether the SLO is met (``slo.rate_point`` after the first 20 % of requests) in the point's
    forecast and in its measured run; and the maximum sustainable rate each side implies over these points
    (``slo.max_sustainable_rate``), with the forecast's relative error."""
    rows = []
    for p in (g for g in grid if g.kind == "poisson"):
        pred = slo.rate_point(slo.steady_state(central[p.name].requests), objective)
        meas = slo.rate_point(slo.steady_state(measured[p.name][0]), objective)
        rows.append({"point": p.name, "rate_rps": p.rate_rps, "predicted_slo_ratio": pred["slo_ratio"],
                     "measured_slo_ratio": meas["slo_ratio"], "predicted_meets": pred["meets_slo"],
                     "measured_meets": meas["meets_slo"]})
    table = pd.DataFrame(rows).sort_values("rate_rps", ignore_index=True)
    table["right"] = table.predicted_meets == table.measured_meets
    rate = {side: slo.max_sustainable_rate(table.rename(columns={f"{side}_slo_ratio": "slo_ratio",
                                                                 f"{side}_meets": "meets_slo"}))
            for side in ("predicted", "measured")}
    both = rate["predicted"]["rate"], rate["measured"]["rate"]
    error = both[0] / both[1] - 1 if None not in both else math.nan
    return table, {"predicted": rate["predicted"], "measured": rate["measured"], "error": error}


def error_budget(card: pd.DataFrame, measured: dict[str, Any], predicted_runs: dict[str, forecast.Forecast],
                 models: dict[str, StepModel], engines_of: dict[str, str], threshold: float = 0.15) -> pd.DataFrame:
    """Where each large miss (|error| > ``threshold``) came from: the step model's error on the point's own measured
    steps (predicted ÷ measured total step time − 1) and the term that dominates those steps, beside the schedule's
    differences (steps, preemptions, cached tokens: forecast vs engine)."""
    rows = []
    for _, r in card[(card.error.abs() > threshold) & (card.metric != "hit_rate")].iterrows():
        requests, steps = measured[r.point]
        model, real = models[engines_of[r.point]], steps.attrs["steps"]
        terms = model.attribution(real)
        step_error = float(terms.predicted_ms.sum() / terms.measured_ms.sum() - 1)
        share = terms[["fixed", "per-sequence", "weight reads", "KV reads", "compute"]].sum()
        sim = predicted_runs[r.point]
        busy = steps.attrs.get("canary", {}).get("slower", math.nan)
        rows.append({"point": r.point, "metric": r.metric, "error": r.error, "step_model_error": step_error, "canary_slower": busy,
                     "largest_term": str(share.idxmax()), "steps_predicted": len(sim.steps), "steps_measured": len(real),
                     "preemptions_predicted": int(sim.requests.preemptions.sum()),
                     "preemptions_measured": int(requests.preemptions.sum()),
                     "cached_predicted": int(sim.requests.cached_tokens.sum()),
                     "cached_measured": int(requests.cached_tokens.sum())})
    columns = ["point", "metric", "error", "step_model_error", "canary_slower", "largest_term", "steps_predicted", "steps_measured",
               "preemptions_predicted", "preemptions_measured", "cached_predicted", "cached_measured"]
    table = pd.DataFrame(rows, columns=columns).assign(came_from="")  # columns kept when nothing missed (a CSV reads back)
    if not table.empty:
        sched = (table.steps_predicted != table.steps_measured) | (table.cached_predicted != table.cached_measured) \
            | (table.preemptions_predicted != table.preemptions_measured)
        table["came_from"] = np.where(table.step_model_error.abs() >= 0.5 * table.error.abs(), "step time", "schedule")
        table.loc[sched & (table.came_from == "schedule"), "came_from"] = "schedule (steps, hits or preemptions differ)"
        busy = (table.came_from == "step time") & (table.canary_slower > CANARY_SLOWER)
        table.loc[busy, "came_from"] = "step time: the machine was busy (its canary ran slower)"
    return table


def ttft_split(measured: pd.DataFrame, predicted: pd.DataFrame, alone_prefill_s: float) -> pd.DataFrame:
    """Each request's TTFT split into queue wait, its own prefill and time in steps shared with other requests' work:
    measured from the engine's timestamps (queue = TTFT − the engine's prefill time, own = the same prompt's prefill
    alone, ``alone_prefill_s``, shared = the rest) and forecast (from the simulated steps), one row per request and side."""
    m = measured.sort_values("arrival_s").reset_index(drop=True)
    own = np.minimum(m.engine_prefill_s, alone_prefill_s)
    meas = pd.DataFrame({"request": m.index + 1, "side": "measured", "queue": m.ttft_s - m.engine_prefill_s,
                         "own prefill": own, "shared steps": m.engine_prefill_s - own})
    p = predicted.sort_values("arrival_s").reset_index(drop=True)
    pred = pd.DataFrame({"request": p.index + 1, "side": "forecast", "queue": p.queue_s, "own prefill": p.own_prefill_s,
                         "shared steps": p.shared_s})
    return pd.concat([meas, pred], ignore_index=True)


def ttft_split_figure(split: pd.DataFrame, title: str) -> go.Figure:
    """Stacked bars of each request's TTFT parts (s), measured and forecast side by side."""
    fig = go.Figure()
    colors = {"queue": "#9e9e9e", "own prefill": "#e4572e", "shared steps": "#4c8bf5"}
    for side, pattern in (("measured", ""), ("forecast", "/")):
        part = split[split.side == side]
        for term, color in colors.items():
            fig.add_bar(x=[part.request, [side] * len(part)], y=part[term] * 1e3, name=f"{term} ({side})",
                        marker={"color": color, "pattern_shape": pattern}, legendgroup=term)
    fig.update_layout(barmode="stack", title=title, xaxis_title="request (by arrival) · measured | forecast",
                      yaxis_title="TTFT (ms)", height=440)
    return fig


def scatter(card: pd.DataFrame, title: str = "Predicted against measured, every held-out point") -> go.Figure:
    """Predicted vs measured for the timing and throughput metrics (log-log), with the y = x line and 80 % intervals."""
    timed = card[~card.metric.isin(["hit_rate", "peak_blocks", "preemptions"])]
    fig = go.Figure()
    for metric, part in timed.groupby("metric"):
        fig.add_scatter(x=part.measured, y=part.predicted, mode="markers", name=metric, text=part.point,
                        error_y={"type": "data", "symmetric": False, "array": part.hi80 - part.predicted,
                                 "arrayminus": part.predicted - part.lo80, "thickness": 1})
    lo, hi = float(timed[["measured", "predicted"]].min().min()), float(timed[["measured", "predicted"]].max().max())
    fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line={"dash": "dash", "color": "black"})
    fig.update_layout(title=title, xaxis_title="measured (ms, or tokens/s)", yaxis_title="predicted (same unit)",
                      xaxis_type="log", yaxis_type="log", height=480)
    return fig
