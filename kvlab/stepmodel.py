"""Where every millisecond of an engine step goes: a model of one step's duration from its exact composition, fitted
on this machine and checked on steps it was not fitted on.

A step is what vLLM's engine core runs between two scheduling decisions (``vllm/v1/engine/core.py``,
``EngineCore.step``: schedule, execute the model, sample, update). Its composition is, for every scheduled sequence,
the tokens it processes in the step (a prefill chunk, one decode token, or k + 1 for a speculative verify) and the
context it already has. The model:

    step time = fixed + per_sequence × sequences + hardware term

with the hardware term from lesson 02's roofline: the step's FLOPs ÷ the measured matmul peak (compute) and the bytes
it must move — the weights once, every sequence's KV of its context and of its new tokens — ÷ the measured bandwidth
(memory), combined either as ``compute_scale × compute + (weights + kv_scale × KV)`` ("sum") or as
``max(compute_scale × compute, weights + kv_scale × KV)`` ("max"), whichever this machine's steps support. The weight
read is counted at the measured bandwidth: a dense model reads the same weights every step, so a fitted scale on them
could not be told apart from the fixed cost (measured here: fitting one made the fixed cost negative). Every constant comes with its
meaning, unit and one standard error; each is fitted ≥ 0 (no cost is negative). Durations come from the engine's own step loop (``StepRecorder``: ``LLMEngine.step``), never
from per-request averages.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvlab import roofline
from kvlab.prompts import distinct_prompts
from kvlab.roofline import MachineLimits, ModelCost
from kvlab.runtime import config, engine
from kvlab.runtime.engine import kv_capacity
from kvlab.runtime.envinfo import env_report
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.model import load_config
from kvlab.timing import generate_batch

#: The fitted constants of each form, in order, with their meaning and unit.
TERMS = {
    "fixed_ms": "cost of a step whatever it holds (scheduling, kernel launches, sampling, Python), ms; on another "
                "model, scaled by its layer count",
    "per_sequence_ms": "cost per scheduled sequence (its metadata, its attention call, its sampled token), ms",
    "compute_scale": "measured time per unit of FLOPs ÷ peak (1: the step computes at the matmul peak)",
    "kv_scale": "measured time per unit of KV bytes ÷ bandwidth (1: the KV cache streams at the measured peak)",
}
FORMS = {"sum": ("fixed_ms", "per_sequence_ms", "compute_scale", "kv_scale"),
         "max": ("fixed_ms", "per_sequence_ms", "compute_scale", "kv_scale")}
#: Why no per-token constant: a token's cost beyond its matmuls (norms, activations, rotary) grows with the tokens
#: exactly as its FLOPs do, so the two cannot be told apart from step times; ``compute_scale`` carries both.
#: A calibration whose median |residual| is above this is reported as not describing this machine's steps.
MAX_MEDIAN_RESIDUAL = 0.15


@dataclass(frozen=True)
class Step:
    """One engine step: its duration (s) and, per scheduled sequence, (tokens processed, context before the step)."""

    seconds: float
    sequences: tuple[tuple[int, int], ...]
    spec_tokens: int = 0  # draft tokens verified in this step (speculative decoding)

    @property
    def tokens(self) -> int:
        return sum(n for n, _ in self.sequences)


def step_flops(cost: ModelCost, step: Step) -> float:
    """FLOPs of one step: every new token through the matmul weights, each sequence's attention over its context and
    its new tokens (causal), and the LM head at each sequence's last position (vLLM computes logits there for every
    scheduled sequence, also for a prefill chunk it will not sample) plus every draft position."""
    attention = sum(2 * 2 * cost.attn_width * cost.layers * n * (c + (n + 1) / 2) for n, c in step.sequences)
    logits = len(step.sequences) + step.spec_tokens
    return 2 * cost.linear_params * step.tokens + attention + 2 * cost.lm_head_params * logits


def step_bytes(cost: ModelCost, step: Step) -> float:
    """Bytes one step must move at least: the weights its tokens use, once, and every sequence's KV cache of its
    context (read) and of its new tokens (written)."""
    return cost.weights_read(step.tokens) + sum(cost.kv_bytes_per_token * (c + n) for n, c in step.sequences)


def features(cost: ModelCost, limits: MachineLimits, steps: list[Step]) -> pd.DataFrame:
    """One row per step: sequences, tokens, compute time (FLOPs ÷ peak) and memory time (bytes ÷ bandwidth), in ms."""
    return pd.DataFrame({
        "sequences": [len(s.sequences) for s in steps],
        "tokens": [s.tokens for s in steps],
        "context_mean": [sum(c for _, c in s.sequences) / len(s.sequences) for s in steps],
        "compute_ms": [step_flops(cost, s) / limits.matmul_flops * 1e3 for s in steps],
        "memory_ms": [step_bytes(cost, s) / limits.bandwidth * 1e3 for s in steps],
        "weight_ms": [cost.weights_read(s.tokens) / limits.bandwidth * 1e3 for s in steps],
        "measured_ms": [s.seconds * 1e3 for s in steps],
    })


def compute_bound(table: pd.DataFrame, constants: dict[str, float] | None = None) -> np.ndarray:
    """Which steps the "max" form puts on its compute branch: scaled compute above scaled memory (unscaled without
    ``constants``)."""
    cs, ks = (constants["compute_scale"], constants["kv_scale"]) if constants else (1.0, 1.0)
    kv = table.memory_ms - table.weight_ms
    return (cs * table.compute_ms > table.weight_ms + ks * kv).to_numpy()


def _design(table: pd.DataFrame, form: str, on_compute: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Columns for (fixed, per sequence, compute, KV) and the unfitted part (the weight read at the measured
    bandwidth); under "max", each step keeps only the branch ``on_compute`` says bounds it."""
    ones, kv = np.ones(len(table)), (table.memory_ms - table.weight_ms).to_numpy()
    compute, weights = table.compute_ms.to_numpy(), table.weight_ms.to_numpy()
    if form == "max":
        c = on_compute.astype(float)
        return np.column_stack([ones, table.sequences, c * compute, (1 - c) * kv]), (1 - c) * weights
    return np.column_stack([ones, table.sequences, compute, kv]), weights


@dataclass
class StepModel:
    """A fitted step-time model: its form, constants with one standard error, the machine's limits and the model's
    costs it was fitted with, the fit's residuals (relative: (predicted − measured) ÷ measured), and ``speed``: how
    many times as long this machine's steps take now as when calibrated (a reused calibration's check step,
    ``speed_now``; 1.0 when calibrated in this run), which every predicted time is multiplied by."""

    form: str
    constants: dict[str, float]
    errors: dict[str, float]
    limits: MachineLimits
    cost: ModelCost
    residuals: list[float] = field(default_factory=list)
    points: int = 0
    other_form: dict[str, Any] = field(default_factory=dict)  # the rejected form's median |residual|, for the record
    meta: dict[str, Any] = field(default_factory=dict)
    speed: float = 1.0

    def terms_ms(self, table: pd.DataFrame) -> pd.DataFrame:
        """Each step's predicted time split into its terms (ms): fixed, per-sequence, weight reads, KV reads, compute.
        Under "max" a step keeps only its bounding branch: compute, or the weight and KV reads."""
        k = self.constants
        out = pd.DataFrame({"fixed": k["fixed_ms"] + 0 * table.sequences,
                            "per-sequence": k["per_sequence_ms"] * table.sequences})
        compute = 1.0 if self.form == "sum" else compute_bound(table, k).astype(float)
        memory = 1.0 if self.form == "sum" else 1.0 - compute
        out["weight reads"] = memory * table.weight_ms
        out["KV reads"] = memory * k["kv_scale"] * (table.memory_ms - table.weight_ms)
        out["compute"] = compute * k["compute_scale"] * table.compute_ms
        return out * self.speed

    def predict_ms(self, steps: list[Step]) -> np.ndarray:
        """Predicted duration (ms) of each step."""
        return self.terms_ms(features(self.cost, self.limits, steps)).sum(axis=1).to_numpy()

    def step_ms(self, step: Step) -> float:
        """Predicted duration (ms) of one step: ``predict_ms`` without a table, for simulators that ask per step."""
        k, bandwidth = self.constants, self.limits.bandwidth
        compute = k["compute_scale"] * step_flops(self.cost, step) / self.limits.matmul_flops * 1e3
        weights = self.cost.weights_read(step.tokens) / bandwidth * 1e3
        kv = k["kv_scale"] * (step_bytes(self.cost, step) / bandwidth * 1e3 - weights)
        hardware = compute + weights + kv if self.form == "sum" else max(compute, weights + kv)
        return (k["fixed_ms"] + k["per_sequence_ms"] * len(step.sequences) + hardware) * self.speed

    def run_seconds(self, sequences: int, prompt_tokens: int, output_tokens: int) -> float:
        """Forecast seconds for ``sequences`` equal requests submitted together: one prefill step of all their
        prompts, then a decode step per further output token at the mid-run context (what lessons size sweeps by)."""
        prefill = self.step_ms(Step(0.0, ((prompt_tokens, 0),) * sequences))
        decode = self.step_ms(decode_step(sequences, prompt_tokens + output_tokens // 2))
        return (prefill + max(output_tokens - 1, 0) * decode) / 1e3

    def attribution(self, steps: list[Step]) -> pd.DataFrame:
        """Per step: measured ms, predicted ms and the predicted split into terms (for a stacked bar)."""
        table = features(self.cost, self.limits, steps)
        terms = self.terms_ms(table)
        return pd.concat([table.drop(columns="weight_ms"), terms], axis=1).assign(predicted_ms=terms.sum(axis=1))

    def describe(self) -> pd.DataFrame:
        """The constants, each with its 1-SE uncertainty, meaning and unit."""
        return pd.DataFrame([{"constant": t, "value": self.constants[t], "± 1 SE": self.errors[t], "meaning": TERMS[t]}
                             for t in FORMS[self.form]])

    def median_abs_residual(self) -> float:
        return float(np.median(np.abs(self.residuals))) if self.residuals else float("nan")

    def to_json(self, path: str | Path) -> Path:
        """Write ``step_model.json``: form, constants with uncertainties, limits, costs, residuals, metadata."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"form": self.form, "constants": self.constants, "errors": self.errors,
               "meaning": {t: TERMS[t] for t in FORMS[self.form]}, "limits": self.limits.as_dict(),
               "cost": asdict(self.cost), "points": self.points, "residuals": self.residuals,
               "median_abs_residual": self.median_abs_residual(), "other_form": self.other_form, "meta": self.meta,
               "speed": self.speed}
        path.write_text(json.dumps(doc, indent=2, default=str))
        return path

    @classmethod
    def from_json(cls, path: str | Path) -> StepModel:
        doc = json.loads(Path(path).read_text())
        return cls(doc["form"], doc["constants"], doc["errors"], MachineLimits(**doc["limits"]), ModelCost(**doc["cost"]),
                   doc.get("residuals", []), doc.get("points", 0), doc.get("other_form", {}), doc.get("meta", {}),
                   doc.get("speed", 1.0))

    def for_model(self, cost: ModelCost) -> StepModel:
        """The same machine applied to another model: its FLOPs and bytes change, and the fixed cost scales with its
        layer count — an eager engine's fixed cost is mostly dispatching each layer's operators (measured: calibrated
        on the 30-layer course model, decode steps of the 24-layer second model were over-predicted by a median 24 %
        with the fixed cost per step, 10 % with it per layer; of the 12-layer OPT base model, 93 % and 20 %)."""
        ratio = cost.layers / self.cost.layers
        constants = self.constants | {"fixed_ms": self.constants["fixed_ms"] * ratio}
        errors = self.errors | {"fixed_ms": self.errors.get("fixed_ms", 0.0) * ratio}
        return StepModel(self.form, constants, errors, self.limits, cost, [], 0, {}, self.meta, self.speed)

    def with_limits(self, limits: MachineLimits, overhead: bool = False) -> StepModel:
        """The same model on another machine's limits (e.g. a GPU's datasheet); ``overhead=False`` keeps none of the
        fitted constants: the roofline's max(compute, memory) at those limits, a lower bound, not a prediction. Another
        machine: this one's ``speed`` now does not carry over."""
        if not overhead:
            bound = {"fixed_ms": 0.0, "per_sequence_ms": 0.0, "compute_scale": 1.0, "kv_scale": 1.0}
            return StepModel("max", bound, dict.fromkeys(bound, 0.0), limits, self.cost, [], 0, {}, self.meta)
        return StepModel(self.form, dict(self.constants), self.errors, limits, self.cost, [], 0, {}, self.meta)


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares of ``a @ coef ≈ b`` with every coefficient ≥ 0: the best of the unconstrained fits over each
    subset of columns (the rest held at 0) whose coefficients are all ≥ 0 — exact for a handful of columns."""
    n = a.shape[1]
    best, best_ss = np.zeros(n), float(b @ b)
    for size in range(1, n + 1):
        for cols in itertools.combinations(range(n), size):
            sub, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if (sub < 0).any():
                continue
            coef = np.zeros(n)
            coef[list(cols)] = sub
            resid = a @ coef - b
            ss = float(resid @ resid)
            if ss < best_ss:
                best, best_ss = coef, ss
    return best


def _ols(x: np.ndarray, offset: np.ndarray, y: np.ndarray, k: float = 1.345) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Robust least squares of relative errors (each row divided by its measurement) of ``y − offset`` on ``x``, every
    constant ≥ 0 (no cost is negative: unconstrained, a float32 calibration fitted −1.4 ms per sequence, offset by a
    larger fixed cost, and put a 64-sequence step at a third of its 150 ms): coefficients, their standard errors, and
    the relative residuals. Huber weights (steps more than ``k`` robust SDs off count less) keep a burst of a shared
    machine from moving the constants: plain least squares let one slow stretch of short-context steps put the KV scale
    at 0.5–0.7 where the decode steps alone show 2.0–2.5, and an 8 × 1,024 step 10–17 % under (docs/engine-notes.md)."""
    w = 1.0 / y
    xw, yw = x * w[:, None], (y - offset) * w
    weights = np.ones(len(y))
    for _ in range(30):
        root = np.sqrt(weights)
        coef = _nonnegative_lstsq(xw * root[:, None], yw * root)
        resid = xw @ coef - yw
        scale = max(1.4826 * float(np.median(np.abs(resid - np.median(resid)))), 1e-6)
        again = np.minimum(1.0, k * scale / np.maximum(np.abs(resid), 1e-12))
        if np.allclose(again, weights, atol=1e-6):
            break
        weights = again
    dof = max(len(y) - x.shape[1], 1)
    sigma2 = float(weights * resid @ resid) / dof
    cov = sigma2 * np.linalg.pinv((xw * weights[:, None]).T @ xw)
    return coef, np.sqrt(np.clip(np.diag(cov), 0.0, None)), resid


def fit(steps: list[Step], cost: ModelCost, limits: MachineLimits, form: str | None = None,
        meta: dict[str, Any] | None = None) -> StepModel:
    """Fit both forms to ``steps`` and keep the one with the smaller median |relative residual| (or ``form``)."""
    if len(steps) < 8:
        raise KVLabError(f"{len(steps)} step compositions cannot fit a step model of up to 4 constants; calibrate with more.")
    table = features(cost, limits, steps)
    y = table.measured_ms.to_numpy()
    fits = {}
    for name in FORMS:
        if name == "sum":
            coef, se, resid = _ols(*_design(table, name), y)
        else:  # piecewise: assign each step to the branch that bounds it, refit, until the assignment holds
            on_compute = compute_bound(table)
            for _ in range(20):
                coef, se, resid = _ols(*_design(table, name, on_compute), y)
                again = compute_bound(table, dict(zip(FORMS[name], coef, strict=True)))
                if (again == on_compute).all():
                    break
                on_compute = again
        fits[name] = (coef, se, resid, float(np.median(np.abs(resid))))
    chosen = form or min(fits, key=lambda f: fits[f][3])
    other = next(f for f in FORMS if f != chosen)
    coef, se, resid, _ = fits[chosen]
    on_compute = compute_bound(table, dict(zip(FORMS[chosen], coef, strict=True))) if chosen == "max" else None
    xw = _design(table, chosen, on_compute)[0] / y[:, None]
    leverage = np.einsum("ij,jk,ik->i", xw, np.linalg.pinv(xw.T @ xw), xw)
    loo = resid / np.clip(1 - leverage, 1e-3, None)  # each composition's error had it been left out of the fit
    meta = (meta or {}) | {"leave_one_out_residuals": [float(r) for r in loo]}
    return StepModel(chosen, dict(zip(FORMS[chosen], map(float, coef), strict=True)),
                     dict(zip(FORMS[chosen], map(float, se), strict=True)), limits, cost, [float(r) for r in resid],
                     len(steps), {"form": other, "median_abs_residual": fits[other][3]}, meta)


class StepRecorder:
    """Records every step of an in-process engine: its composition (from the scheduler's output) and its duration on
    the engine loop's clock — ``LLMEngine.step``: the engine core's step (schedule, execute, sample, update) and the
    output processing (detokenizing, building each request's output) that every token also waits for. Timing the
    core's step alone left that out: loaded TPOT came out ~10 % above such a model's forecast (measured, lesson 10)."""

    def __init__(self, llm: Any) -> None:
        try:
            self.core = llm.llm_engine.engine_core.engine_core
        except AttributeError:
            raise KVLabError("Steps can be recorded only on an in-process engine (kvlab.make_engine on a CPU, or "
                             "VLLM_ENABLE_V1_MULTIPROCESSING=0 before vLLM is imported).") from None
        self.engine = llm.llm_engine
        self.steps: list[Step] = []
        self.blocks_used: list[int] = []  # KV blocks held after each recorded step (the null block not counted)
        self._last: Any = None

    @contextmanager
    def recording(self) -> Iterator[StepRecorder]:
        """Wrap the scheduler and the engine's step while the block runs; restore them after."""
        scheduler, engine_step = self.core.scheduler, self.engine.step
        schedule = scheduler.schedule

        def schedule_and_keep(*args: Any, **kwargs: Any) -> Any:
            self._last = schedule(*args, **kwargs)
            return self._last

        def timed_step(*args: Any, **kwargs: Any) -> Any:
            self._last = None
            start = time.perf_counter()
            result = engine_step(*args, **kwargs)
            seconds = time.perf_counter() - start
            out = self._last
            if out is not None and out.total_num_scheduled_tokens > 0:
                self.steps.append(composition(out, seconds))
                pool = scheduler.kv_cache_manager.block_pool
                self.blocks_used.append(pool.num_gpu_blocks - 1 - pool.get_num_free_blocks())
            return result

        scheduler.schedule, self.engine.step = schedule_and_keep, timed_step
        try:
            yield self
        finally:
            scheduler.schedule = schedule
            del self.engine.step  # the instance attribute goes; the class's method is back


def composition(out: Any, seconds: float) -> Step:
    """A ``Step`` from vLLM's ``SchedulerOutput``: per scheduled request, its scheduled tokens and the tokens it had
    computed before (new requests: ``NewRequestData.num_computed_tokens``, a prefix-cache hit included; running ones:
    ``CachedRequestData.num_computed_tokens``)."""
    before = {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    before |= dict(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    spec = sum(len(v) for v in (out.scheduled_spec_decode_tokens or {}).values())
    return Step(seconds, tuple((int(n), int(before.get(rid, 0))) for rid, n in out.num_scheduled_tokens.items()), spec)


def plain_decode_ms(steps: list[Step]) -> float:
    """Median duration (ms) of the steps in which one sequence decoded one token with no draft: an engine's plain
    step, to compare two engines' speed apart from what speculation adds (nan when there is none)."""
    plain = [s.seconds for s in steps
             if len(s.sequences) == 1 and s.sequences[0][0] == 1 and s.sequences[0][1] > 0 and s.spec_tokens == 0]
    return statistics.median(plain) * 1e3 if plain else math.nan


def run_recorded(llm: Any, prompts: list[list[int]], max_tokens: int) -> list[Step]:
    """Submit ``prompts`` together (exactly ``max_tokens`` out each, prefix cache emptied first) and return every
    step the engine took for them."""
    recorder = StepRecorder(llm)
    llm.reset_prefix_cache()
    with recorder.recording():
        generate_batch(llm, prompts, max_tokens)
    return recorder.steps


@dataclass(frozen=True)
class Point:
    """One calibration or check point: ``batch`` distinct prompts of ``prompt_tokens`` submitted together."""

    batch: int
    prompt_tokens: int
    output_tokens: int


def calibration_points(quick: bool) -> list[Point]:
    """The sweep the model is fitted on: prefills of several lengths alone; batches of up to 8 sequences decoding at
    64- and 256-token prompts, and of up to 4 at 512 (quick: 4 at 1,024 and 2 at 2,048) tokens — enough KV read for its
    term to be measured, not guessed, and told apart from the sequences' count by two points of equal KV. Quick fits
    without 8 × 256 and 4 × 1,024 put the KV scale anywhere from 0.0 to 2.6 and an 8 × 1,024 decode step −19 % to +2 %
    off (bf16, four calibrations); with them 0.7–2.3 and −10 % to +3 % (a CI machine: 0.5 and −17 %); with 2 × 2,048
    and the robust fit too, 2.1–2.5 and −3 % to +6 % (float32, three: −6 % to +13 %; docs/engine-notes.md). Held-out
    checks use more sequences, and more KV in one step, than any of these."""
    prefills = [Point(1, p, 2) for p in ((64, 256, 512) if quick else (64, 128, 256, 512, 1024))]
    short = [(1, 64), (2, 64), (4, 64), (8, 64), (8, 256)] if quick else [(b, p) for b in (1, 2, 4, 8) for p in (64, 256)]
    long = [(1, 512), (4, 512), (4, 1024), (2, 2048)] if quick else [(1, 512), (2, 512), (4, 512)]
    return prefills + [Point(b, p, 16 if quick else 32) for b, p in short + long]


#: A point whose repeats' total step times spread more than this (the slowest ÷ the fastest − 1) is measured again.
UNSTEADY_SPREAD = 0.10

#: One run of a point: the point and every step the engine took for it.
Run = tuple[Point, list[Step]]


def unsteady(runs: list[Run], spread: float = UNSTEADY_SPREAD) -> list[Point]:
    """The points whose runs do not agree: fewer than a majority of them within ``spread`` of one another's total
    step time. One slow run of two (a busy spell of a shared machine) flags its point; a third run that agrees with
    the faster one settles it, since ``typical`` then takes each composition's median over three runs."""
    totals: dict[Point, list[float]] = {}
    for p, steps in runs:
        totals.setdefault(p, []).append(sum(s.seconds for s in steps))
    out = []
    for p, ts in totals.items():
        agreeing = max(sum(abs(u / t - 1) <= spread for u in ts) for t in ts)
        if len(ts) > 1 and 2 * agreeing <= len(ts):
            out.append(p)
    return out


def measure(llm: Any, points: list[Point], repeats: int, seed: int = 0, extra_rounds: int = 2) -> list[Run]:
    """Every point's run, ``repeats`` times (distinct prompts each time, the points in a new order each repeat so a
    busy spell at one time of the sweep does not land on the same points twice), after one untimed warm-up run; then
    each ``unsteady`` point once more, for up to ``extra_rounds`` rounds. A 12-06 CI calibration, its long-context
    points measured last in both repeats, put the KV scale at 6.3 (normally 2–3) and missed an 8 × 1,024 step by +25 %."""
    tok = llm.get_tokenizer()
    run_recorded(llm, distinct_prompts(tok, points[0].prompt_tokens, points[0].batch, seed=seed + 999), 4)  # warm-up
    rng = np.random.default_rng(seed)
    runs: list[Run] = []

    def run(p: Point, r: int, i: int) -> None:
        runs.append((p, run_recorded(llm, distinct_prompts(tok, p.prompt_tokens, p.batch, seed=seed + 31 * r + i), p.output_tokens)))

    for r in range(repeats):
        for i in (range(len(points)) if r == 0 else rng.permutation(len(points))):
            run(points[i], r, int(i))
    for extra in range(extra_rounds):
        again = unsteady(runs)
        for p in again:
            run(p, repeats + extra, points.index(p))
    return runs


def typical(steps: list[Step]) -> list[Step]:
    """Steps of the same composition summarized by their median duration, so no composition weighs more than another
    for having more steps; a step slower than 3× its composition's median (a stall of a shared machine) is dropped."""
    groups: dict[tuple, list[float]] = {}
    for s in steps:
        key = (tuple(sorted(s.sequences)), s.spec_tokens)
        groups.setdefault(key, []).append(s.seconds)
    out = []
    for (seqs, spec), secs in groups.items():
        med = statistics.median(secs)
        kept = [x for x in secs if x <= 3 * med]
        out.append(Step(statistics.median(kept), seqs, spec))
    return out


def calibrate(llm: Any, quick: bool = False, limits: MachineLimits | None = None, repeats: int | None = None) -> StepModel:
    """Fit the step model on this engine: measure the machine's limits (fresh process), run the calibration sweep,
    fit both forms and keep the better; one sentence if the fit describes the steps badly, naming the worst. A point
    longer than the engine's context is shortened to fit it (its prompt, by the output it writes)."""
    cost = roofline.engine_cost(llm)
    limits = limits or roofline.measure_limits(quick=quick)
    longest = llm.llm_engine.vllm_config.model_config.max_model_len
    points = list(dict.fromkeys(p if p.prompt_tokens + p.output_tokens <= longest
                                else replace(p, prompt_tokens=longest - p.output_tokens) for p in calibration_points(quick)))
    repeats = repeats or (2 if quick else 3)
    measured = measure(llm, points, repeats)
    steps = typical([s for _, run in measured for s in run])
    settings = getattr(llm, "kvlab_settings", {})
    cache = kv_capacity(llm)
    meta = {"machine": env_report(), "engine": settings, "block_size": cache.block_size,
            "points": [asdict(p) for p in points], "steps_recorded": sum(len(run) for _, run in measured),
            "compositions": len(steps), "runs": len(measured),
            "measured_again": [asdict(p) for p, _ in measured[len(points) * repeats:]]}
    model = fit(steps, cost, limits, meta=meta)
    check_fit(model, steps)
    model.meta["point_out_errors"] = point_out_errors(measured, cost, limits, model.form)
    model.meta["run_to_run"] = run_to_run(measured)
    return model


#: How long a saved calibration stands for the same machine, model and engine settings (a later lesson's, or a rerun).
REUSE_HOURS = 6.0
CALIBRATION_FORMAT = "2"  # raised when a saved calibration's fields change meaning (2: one whole-run error per point)


def reuse_key(llm: Any, quick: bool) -> dict[str, str]:
    """What a step's duration depends on: the machine and its threads, the model and its dtype, eager or compiled,
    the KV cache's dtype and blocks, vLLM's version (and the calibration's format). Scheduler settings (token budget,
    prefix caching, context) are not in it: they change which steps run, not how long a step of a given composition
    takes."""
    vllm_config = llm.llm_engine.vllm_config
    machine = env_report()
    return {"model": str(getattr(llm, "kvlab_settings", {}).get("model", vllm_config.model_config.model)),
            "dtype": str(vllm_config.model_config.dtype), "eager": str(vllm_config.model_config.enforce_eager),
            "kv_cache_dtype": str(vllm_config.cache_config.cache_dtype), "block_size": str(kv_capacity(llm).block_size),
            "sweep": "quick" if quick else "full", "format": CALIBRATION_FORMAT,
            **{k: machine[k] for k in ("cpu", "cpu flags (vector/matrix)", "cores usable", "torch", "vllm",
                                       "OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND")}}


def saved_path(key: dict[str, str]) -> Path:
    """Where the calibration for ``key`` is kept: the build folder, one file per machine × model × engine settings."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return config.build_dir() / "step_models" / f"{digest}.json"


#: How far (as a fraction) this machine's speed now may be from a saved calibration's before it is measured anew.
REUSE_SPEED_TOLERANCE = 0.15


def speed_now(llm: Any, model: StepModel, steps: int = 8, warm_up: bool = True) -> float:
    """The machine's speed now, as ``model`` sees it: 4 sequences of 64 prompt tokens decoding ``steps`` tokens, their
    steps' measured ÷ predicted time (1.0: as ``model`` predicts, its ``speed`` included). The same work every time, so
    a change between two checks is the machine (lesson 10's canaries between points, ``warm_up=False`` on an engine
    already running). Two cloud machines with the same CPU report can differ 1.6×."""
    prompts = distinct_prompts(llm.get_tokenizer(), 64, 4, seed=77)
    if warm_up:
        run_recorded(llm, prompts, 2)  # untimed: an engine's first steps after start-up run slower
    measured = run_recorded(llm, prompts, steps)
    llm.reset_prefix_cache()
    terms = model.attribution(measured)
    return float(terms.measured_ms.sum() / terms.predicted_ms.sum())


def calibrated(llm: Any, quick: bool = True, limits: MachineLimits | None = None, fresh: bool = False) -> StepModel:
    """This engine's step model: the calibration an earlier lesson saved for the same machine, model and engine
    settings in the last ``REUSE_HOURS`` (so the sweep is not measured twice), if a short check (``speed_now``) finds
    the machine within ``REUSE_SPEED_TOLERANCE`` of its speed then (the model's ``speed`` is set to the check's, so a
    machine 10 % slower now is forecast 10 % slower); else ``calibrate`` now and save it. Prints which, and how old;
    ``fresh=True`` always measures again."""
    key = reuse_key(llm, quick)
    path = saved_path(key)
    age_s = time.time() - path.stat().st_mtime if path.exists() else math.inf
    if not fresh and age_s <= REUSE_HOURS * 3600:
        model = StepModel.from_json(path)
        speed = speed_now(llm, model) if model.meta.get("reuse_key") == key else 1.0
        if abs(speed - 1) > REUSE_SPEED_TOLERANCE:
            print(f"Step model: the calibration saved {age_s / 60:.0f} min ago for this machine's report runs "
                  f"{speed:.2f}× as long here now (another machine of the same kind, or a busy spell): measured anew.")
        elif model.meta.get("reuse_key") == key:
            model.meta["reused"] = {"path": str(path), "age_s": round(age_s)}
            model.speed = speed  # the check's speed, kept once: on the model, saved with it
            print(f"Step model: the calibration saved {age_s / 60:.0f} min ago on this machine, model and engine "
                  f"settings ({model.meta.get('steps_recorded', '?')} steps of {model.meta.get('compositions', '?')} "
                  f"compositions), reused from {path}; a check step ran {speed:.2f}× its prediction now, so every "
                  f"step it predicts is × {speed:.2f}; calibrated(..., fresh=True) measures it again.")
            return model
    started = time.perf_counter()
    model = calibrate(llm, quick=quick, limits=limits)
    model.meta["reuse_key"] = key
    model.to_json(path)
    print(f"Step model: calibrated now ({time.perf_counter() - started:.0f} s: {model.meta['steps_recorded']} steps of "
          f"{model.meta['compositions']} compositions), saved for the next lesson at {path}.")
    return model


def run_to_run(measured: list[Run]) -> list[float]:
    """The machine's run-to-run noise: each run's total step time relative to the mean over its point's runs."""
    totals: dict[Point, list[float]] = {}
    for p, steps in measured:
        totals.setdefault(p, []).append(sum(s.seconds for s in steps))
    return [float(t / np.mean(runs) - 1) for runs in totals.values() if len(runs) > 1 for t in runs]


def point_out_errors(measured: list[Run], cost: ModelCost, limits: MachineLimits, form: str) -> list[float]:
    """Each calibration point's run predicted by a fit on the *other* points: its steps' total predicted time against
    their total measured (one relative error per point) — how far a whole run lands on a shape the model was not
    fitted on, the error a forecast's interval should allow for (a step's own noise averages out over a run)."""
    out: list[float] = []
    for point in dict.fromkeys(p for p, _ in measured):
        rest = typical([s for q, run in measured if q != point for s in run])
        mine = typical([s for q, run in measured if q == point for s in run])
        if len(rest) < 8 or not mine:
            continue
        model = fit(rest, cost, limits, form=form)
        out.append(float(model.predict_ms(mine).sum() / (sum(s.seconds for s in mine) * 1e3) - 1))
    return out


def check_fit(model: StepModel, steps: list[Step]) -> None:
    """Refuse a fit whose median |residual| is above ``MAX_MEDIAN_RESIDUAL``, naming its worst steps."""
    if model.median_abs_residual() <= MAX_MEDIAN_RESIDUAL:
        return
    worst = np.argsort(-np.abs(model.residuals))[:3]
    names = "; ".join(f"{len(steps[i].sequences)} sequences, {steps[i].tokens} tokens: {model.residuals[i]:+.0%}"
                      for i in worst)
    raise KVLabError(f"The step model misses this machine's steps by a median {model.median_abs_residual():.0%} "
                     f"(more than {MAX_MEDIAN_RESIDUAL:.0%}); worst: {names} — recalibrate on a quieter machine.")


def held_out(llm: Any, model: StepModel, points: list[Point], repeats: int = 2) -> pd.DataFrame:
    """Predict each point's steps, then measure them: one row per step composition with predicted and measured ms
    and the relative error. Points must not be calibration points (they are refused if they are)."""
    known = set(map(asdict_key, calibration_points(True) + calibration_points(False)))
    overlap = [p for p in points if asdict_key(p) in known]
    if overlap:
        raise KVLabError(f"{overlap[0]} is a calibration point: a held-out check must use points the model was not fitted on.")
    rows = []
    for p, s in ((p, s) for p, run in measure(llm, points, repeats, seed=500, extra_rounds=0) for s in run):
        rows.append({"batch": p.batch, "prompt_tokens": p.prompt_tokens, "sequences": len(s.sequences),
                     "tokens": s.tokens, "context_mean": sum(c for _, c in s.sequences) / len(s.sequences),
                     "measured_ms": s.seconds * 1e3, "predicted_ms": float(model.predict_ms([s])[0])})
    table = pd.DataFrame(rows)
    table["error"] = table.predicted_ms / table.measured_ms - 1
    return table


def asdict_key(p: Point) -> tuple[int, int]:
    return (p.batch, p.prompt_tokens)


def held_out_points(quick: bool) -> list[Point]:
    """Compositions the calibration never has: more sequences at longer contexts, and a longer prefill."""
    if quick:
        return [Point(8, 1024, 16)]
    return [Point(8, 1024, 24), Point(12, 768, 24), Point(16, 384, 24), Point(1, 2048, 2)]


def check_costable(model_name: str | None) -> None:
    """Refuse, before any engine starts, a model whose FLOPs and bytes the roofline module cannot count."""
    try:
        ModelCost.from_config(load_config(model_name), 2, 1)
    except KVLabError:
        raise
    except Exception as exc:  # noqa: BLE001 - one sentence instead of transformers' traceback
        raise KVLabError(f"The step model cannot count the FLOPs and bytes of {model_name or config.model_name()!r} "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]}); calibrate on a model transformers "
                         "can build on the meta device.") from None


def calibrate_and_check(model_name: str | None = None, quick: bool = False, out: str | Path | None = None) -> StepModel:
    """``kvlab forecast calibrate``: one engine, the calibration sweep, the fit, then the held-out points predicted
    and measured; ``step_model.json`` (with the held-out errors in its metadata) written to ``out``."""
    check_costable(model_name)
    limits = roofline.measure_limits(quick=quick, model=model_name)  # before the engine pins this process's threads
    llm = engine.make_engine(model_name, enable_prefix_caching=False, max_model_len=4096)
    try:
        model = calibrate(llm, quick=quick, limits=limits)
        check = held_out(llm, model, held_out_points(quick))
    finally:
        engine.close_engine(llm)
    model.meta["held_out"] = check.to_dict(orient="records")
    model.meta["held_out_median_abs_error"] = median_error(check)
    path = Path(out) if out else config.build_dir() / "forecast"
    model.to_json(path / "step_model.json")
    return model


TERM_COLUMNS = ["fixed", "per-sequence", "weight reads", "KV reads", "compute"]


def attribution_by(model: StepModel, steps: list[Step], key: Callable[[Step], Any], name: str) -> pd.DataFrame:
    """Steps grouped by ``key(step)`` (None: left out), one row per group: the median measured ms, the median of each
    predicted term and of the prediction, and how many steps are behind them."""
    chosen = [(k, s) for s in steps if (k := key(s)) is not None]
    if not chosen:
        raise KVLabError(f"No recorded step matches '{name}'; record a run that has such steps.")
    table = model.attribution([s for _, s in chosen]).assign(**{name: [k for k, _ in chosen]})
    grouped = table.groupby(name)
    out = grouped[["measured_ms", "predicted_ms", "context_mean", *TERM_COLUMNS]].median()
    return out.assign(steps=grouped.size()).reset_index()


def decode_attribution(model: StepModel, steps: list[Step]) -> pd.DataFrame:
    """The pure decode steps (every sequence one new token) grouped by how many sequences they held."""
    return attribution_by(model, steps, lambda s: len(s.sequences) if all(n == 1 for n, _ in s.sequences)
                          and not s.spec_tokens else None, "sequences")


def prefill_attribution(model: StepModel, steps: list[Step]) -> pd.DataFrame:
    """Steps that prefilled one whole prompt alone (one sequence, no context before it), grouped by prompt tokens."""
    return attribution_by(model, steps, lambda s: s.tokens if len(s.sequences) == 1 and s.sequences[0][1] == 0
                          and s.tokens > 1 else None, "prompt_tokens")


def decode_step(sequences: int, context: int) -> Step:
    """A decode step to predict: ``sequences`` sequences, one new token each, ``context`` tokens of KV each."""
    return Step(0.0, ((1, context),) * sequences)


def attribution_figure(table: pd.DataFrame, label: str, title: str) -> go.Figure:
    """Stacked bars of each point's predicted terms (ms) with the measured time beside them as a marker."""
    fig = go.Figure()
    colors = {"fixed": "#9e9e9e", "per-sequence": "#bdbdbd", "weight reads": "#4c8bf5", "KV reads": "#90caf9",
              "compute": "#e4572e"}
    for term, color in colors.items():
        fig.add_bar(x=table[label].astype(str), y=table[term], name=term, marker_color=color)
    fig.add_scatter(x=table[label].astype(str), y=table.measured_ms, mode="markers", name="measured",
                    marker={"symbol": "diamond", "size": 11, "color": "black"})
    fig.update_layout(barmode="stack", title=title, xaxis_title=label, yaxis_title="step time (ms)", height=420)
    return fig


def median_error(table: pd.DataFrame) -> float:
    """Median |relative error| of a held-out table."""
    return float(table.error.abs().median()) if len(table) else math.nan
