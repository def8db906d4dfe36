"""Forecast a workload on vLLM's own scheduler: every step the engine would take, timed by the step model.

The requests (``workload.Arrival``: arrival time, prompt token ids, output tokens, priority) are handed to the
scheduler class the engine itself runs (``vllm/v1/core/sched/scheduler.py``, ``Scheduler``), built from the engine's
own ``VllmConfig`` and ``KVCacheConfig`` — the way ``EngineCore.__init__`` builds it (``vllm/v1/engine/core.py``) and
vLLM's scheduler tests do (``tests/v1/core/utils.py``, ``create_scheduler``) — with no weights and no model runner.
Each ``SchedulerOutput`` is not executed: the step model gives its duration, a stand-in token is "sampled" for every
request whose prompt is done (``ModelRunnerOutput``), and ``Scheduler.update_from_output`` books it as the engine
would. Chunked prefill, the token budget, ``max_num_seqs``, block-granular prefix-cache hits, KV allocation and
preemption are therefore vLLM's rules, not re-implemented ones. New requests join between steps, as in the engine
loop that ``workload.run_workload`` drives, so the forecast and the measurement share one definition of every time.

Speculative decoding is forecast **given** its acceptance (``Speculation``: how often a step had a draft, how long
the drafts were, how often each position was accepted — measured by vLLM's counters): which drafts the n-gram
proposer finds depends on the text the model writes, which a forecast cannot know. Each step's drafts are handed to
the scheduler as the engine does (``Scheduler.update_draft_token_ids``); the scheduler schedules k + 1 tokens to verify
and rolls back the rejected ones in ``update_from_output``. Not forecast: structured outputs, multimodal inputs.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from kvlab import slo
from kvlab.roofline import MachineLimits, ModelCost
from kvlab.runtime.errors import KVLabError
from kvlab.stepmodel import Step, StepModel, composition
from kvlab.workload import Arrival

#: The token every simulated step "samples" (requests ask for ``ignore_eos``, so its value never stops one).
STAND_IN_TOKEN = 13


@dataclass
class Setup:
    """What a forecast needs of an engine: its config, its KV cache layout (blocks, groups) and block hasher."""

    vllm_config: Any
    kv_cache_config: Any
    block_size: int
    hash_block_size: int | None
    block_hasher: Any
    max_model_len: int
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def num_blocks(self) -> int:
        return int(self.kv_cache_config.num_blocks)


def setup_from_engine(llm: Any) -> Setup:
    """The scheduler setup of an in-process engine (``kvlab.make_engine``): config copied, so a forecast never
    touches the engine, and KV events turned off (a second publisher would bind the engine's endpoint)."""
    try:
        core = llm.llm_engine.engine_core.engine_core
    except AttributeError:
        raise KVLabError("A forecast reads the scheduler of an in-process engine (kvlab.make_engine on a CPU, or "
                         "VLLM_ENABLE_V1_MULTIPROCESSING=0 before vLLM is imported).") from None
    sched = core.scheduler
    config = copy.deepcopy(core.vllm_config)
    config.kv_events_config = None
    return Setup(config, copy.deepcopy(sched.kv_cache_config), sched.block_size,
                 getattr(sched, "hash_block_size", None), core.request_block_hasher,
                 config.model_config.max_model_len, dict(getattr(llm, "kvlab_settings", {})))


def new_scheduler(setup: Setup) -> Any:
    """A fresh scheduler of the engine's class with an empty KV cache (and an empty prefix cache)."""
    from vllm.v1.structured_output import StructuredOutputManager

    cls = setup.vllm_config.scheduler_config.get_scheduler_cls()
    return cls(vllm_config=setup.vllm_config, kv_cache_config=copy.deepcopy(setup.kv_cache_config),
               structured_output_manager=StructuredOutputManager(setup.vllm_config), block_size=setup.block_size,
               hash_block_size=setup.hash_block_size, log_stats=True)


def check_workload(setup: Setup, arrivals: list[Arrival]) -> None:
    """One sentence, before anything runs, for a request that cannot fit the context or the whole KV pool."""
    pool_tokens = (setup.num_blocks - 1) * setup.block_size  # block 0 is vLLM's null block
    for a in arrivals:
        need = len(a.prompt_ids) + a.max_tokens
        if need > setup.max_model_len:
            raise KVLabError(f"Request '{a.label}' needs {need:,} tokens ({len(a.prompt_ids):,} prompt + {a.max_tokens:,}"
                             f" output) but the engine's context is {setup.max_model_len:,}; shorten it or raise max_model_len.")
        if need > pool_tokens:
            raise KVLabError(f"Request '{a.label}' needs {need:,} tokens of KV but the engine's pool holds "
                             f"{pool_tokens:,}; give the engine more KV memory (kv_cache_gib=) or shorten the request.")


def new_request(a: Arrival, setup: Setup) -> Any:
    """vLLM's ``Request`` for an arrival: greedy, exactly ``max_tokens`` out (EOS ignored), hashed for prefix caching."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
    return Request(a.request_id, list(a.prompt_ids), params, None, arrival_time=a.at_s, priority=a.priority,
                   block_hasher=setup.block_hasher)


@dataclass(frozen=True)
class Speculation:
    """What a speculative run's drafts did (vLLM's counters): the share of decode steps with a draft (``coverage``),
    the mean draft length, and per position j the share of drafts whose first j tokens were all accepted."""

    coverage: float
    draft_length: float
    accepted_by_position: tuple[float, ...]

    @classmethod
    def from_counters(cls, acceptance: dict[str, Any], decode_steps: int) -> Speculation:
        """From ``speculative.acceptance`` over a run and the run's decode steps (steps that gave a request tokens
        after its first). A run that drafted nothing (no n-gram ever matched) is coverage 0: plain decoding."""
        if not acceptance.get("drafts") or not decode_steps:
            return cls(0.0, 0.0, ())
        return cls(min(1.0, acceptance["drafts"] / decode_steps), acceptance["draft_tokens"] / acceptance["drafts"],
                   tuple(float(a) for a in acceptance["acceptance_by_position"]))

    def draft(self, rng: np.random.Generator) -> int:
        """Tokens drafted for one decode step: none with probability 1 − coverage, else the mean length, rounded at
        random so that the mean holds."""
        if rng.random() >= self.coverage:
            return 0
        whole = int(self.draft_length)
        return whole + int(rng.random() < self.draft_length - whole)

    def accepted(self, drafted: int, rng: np.random.Generator) -> int:
        """Draft tokens accepted: position j is reached with the measured probability (positions are accepted in order,
        so one uniform draw decides them all)."""
        u = rng.random()
        return min(drafted, sum(u < p for p in self.accepted_by_position))


def replay_hits(setup: Setup, prompts: list[list[int]], max_tokens: int = 1) -> list[int]:
    """Each prompt run to completion on vLLM's scheduler, one after another (prefix cache kept between them, emptied
    before the first): the tokens each found in the prefix cache — the engine's own hit rule for any layout, sliding-
    window and hybrid groups included (``HybridKVCacheCoordinator.find_longest_cache_hit``)."""
    apart = [Arrival(f"replay {i}", list(ids), max_tokens, at_s=1e6 * i) for i, ids in enumerate(prompts)]
    return [int(n) for n in simulate(setup, apart, _UnitSteps()).requests.cached_tokens]


class _UnitSteps:
    """Every step lasts 1 ms: for a replay where only what the scheduler decides matters, not when."""

    def step_ms(self, step: Step) -> float:
        return 1.0


@dataclass
class Forecast:
    """One simulated run: a row per request (the columns ``run_workload`` measures) and a row per step."""

    requests: pd.DataFrame
    steps: pd.DataFrame


@dataclass
class _Ledger:
    """What a simulated run books per request (first step, prefix hit, token times, its prefill split) and per step."""

    model: StepModel
    scale: float
    first_step: dict[str, float] = field(default_factory=dict)
    cached: dict[str, int] = field(default_factory=dict)
    token_times: dict[str, list[float]] = field(default_factory=dict)
    own_prefill: dict[str, float] = field(default_factory=dict)
    shared: dict[str, float] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)

    def seconds(self, step: Step) -> float:
        return self.model.step_ms(step) * self.scale / 1e3

    def book(self, step: Step, ids: list[str], reqs: dict[str, Any], start: float, end: float,
             accepted: dict[str, int] | None = None) -> list[list[int]]:
        """Book one step ending at ``end``; return the stand-in tokens sampled (one for each request whose prompt is
        done after it, plus its ``accepted`` draft tokens; none for a prefill chunk that ends before its prompt does)."""
        sampled, accepted = [], accepted or {}
        for rid, (n, before) in zip(ids, step.sequences, strict=True):
            if rid not in self.first_step:  # its first step: what it had computed before is its prefix-cache hit
                self.first_step[rid], self.cached[rid] = start, before
            if rid not in self.token_times:  # still prefilling: its own work alone, and the rest of the step
                alone = min(self.seconds(Step(0.0, ((n, before),))), end - start)
                self.own_prefill[rid] = self.own_prefill.get(rid, 0.0) + alone
                self.shared[rid] = self.shared.get(rid, 0.0) + (end - start) - alone
            done = reqs[rid].num_computed_tokens >= reqs[rid].num_tokens
            times = self.token_times.setdefault(rid, []) if done else []
            count = min(1 + accepted.get(rid, 0), reqs[rid].max_tokens - len(times)) if done else 0
            sampled.append([STAND_IN_TOKEN] * count)
            times.extend([end] * count)
        return sampled

    def requests(self, arrivals: list[Arrival], reqs: dict[str, Any]) -> pd.DataFrame:
        """One row per request, with the columns ``workload.run_workload`` measures (and the forecast's split)."""
        rows = []
        for a in arrivals:
            rid, times = a.request_id, self.token_times[a.request_id]
            first, last, n = times[0], times[-1], len(times)
            rows.append({"request_id": rid, "label": a.label, "priority": a.priority, "prompt_tokens": len(a.prompt_ids),
                         "output_tokens": n, "arrival_s": a.at_s, "first_token_s": first, "last_token_s": last,
                         "ttft_s": first - a.at_s, "tpot_s": (last - first) / (n - 1) if n > 1 else math.nan,
                         "e2e_s": last - a.at_s, "queue_s": self.first_step[rid] - a.at_s,
                         "own_prefill_s": self.own_prefill.get(rid, 0.0), "shared_s": self.shared.get(rid, 0.0),
                         "cached_tokens": self.cached[rid], "preemptions": int(reqs[rid].num_preemptions),
                         "decode_steps": len(set(times)) - 1})
        return pd.DataFrame(rows)


def simulate(setup: Setup, arrivals: list[Arrival], model: StepModel, scale: float = 1.0,
             max_steps: int = 200_000, speculation: Speculation | None = None, seed: int = 0,
             step_noise: tuple[float, ...] = ()) -> Forecast:
    """Run ``arrivals`` through vLLM's scheduler, each step lasting the step model's prediction × ``scale`` (× 1 + a
    relative error drawn from ``step_noise`` per step, for an interval); return per-request TTFT, TPOT, E2E, queue
    wait, its own prefill alone, cached tokens and preemptions, and per-step composition, duration and KV blocks in
    use. With ``speculation`` (and an engine configured for it), each decode step gets drafts and acceptances drawn
    from it (``seed``)."""
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

    if speculation is not None and not setup.vllm_config.speculative_config:
        raise KVLabError("A speculative forecast needs the setup of an engine with speculation on "
                         "(speculative.ngram_config(k) when making the engine).")
    rng = np.random.default_rng(seed)

    check_workload(setup, arrivals)
    sched, ledger = new_scheduler(setup), _Ledger(model, scale)
    pool = sched.kv_cache_manager.block_pool
    pending, reqs = sorted(arrivals, key=lambda a: a.at_s), {}
    t, i, idle = 0.0, 0, 0
    while i < len(pending) or sched.has_requests():
        while i < len(pending) and pending[i].at_s <= t:  # arrivals join between steps, as in the engine loop
            reqs[pending[i].request_id] = new_request(pending[i], setup)
            sched.add_request(reqs[pending[i].request_id])
            i += 1
        if not sched.has_requests():
            t = pending[i].at_s
            continue
        out = sched.schedule()
        if out.total_num_scheduled_tokens == 0:  # an empty step (as the engine takes) clears finished requests
            sched.update_from_output(out, ModelRunnerOutput(req_ids=[], req_id_to_index={}))
            idle += 1
            if i < len(pending):
                t = max(t, pending[i].at_s)
            elif idle > 2:
                raise KVLabError("vLLM's scheduler could schedule nothing with requests waiting: a request cannot fit "
                                 "the KV pool.")
            continue
        step, ids, start = composition(out, 0.0), list(out.num_scheduled_tokens), t
        t += ledger.seconds(step) * (1.0 + float(rng.choice(step_noise)) if step_noise else 1.0)
        drafts = out.scheduled_spec_decode_tokens or {}
        accepted = {rid: speculation.accepted(len(d), rng) for rid, d in drafts.items()} if speculation else {}
        sampled = ledger.book(step, ids, reqs, start, t, accepted)
        sched.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                                                        sampled_token_ids=sampled))
        if speculation is not None:  # the proposer's turn, after the step is booked (as EngineCore.step does)
            ready = [rid for rid, s in zip(ids, sampled, strict=True) if s and not reqs[rid].is_finished()]
            sched.update_draft_token_ids(DraftTokenIds(ready, [[STAND_IN_TOKEN] * speculation.draft(rng) for _ in ready]))
        ledger.steps.append({"start_s": start, "seconds": t - start, "sequences": len(ids), "tokens": step.tokens,
                             "composition": tuple(sorted(step.sequences)),
                             "prefill_tokens": sum(n for n, _ in step.sequences if n > 1),
                             "blocks_used": pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()})
        idle = 0
        if len(ledger.steps) > max_steps:
            raise KVLabError(f"The forecast passed {max_steps:,} steps without finishing; forecast fewer requests.")
    return Forecast(ledger.requests(arrivals, reqs), pd.DataFrame(ledger.steps))


#: Assumed, not measured: what a GPU decode step costs beyond its FLOPs and bytes — vLLM's scheduling, sampling and
#: output processing on the host, kernels launched from CUDA graphs — in ms. A stated guess the learner can change.
GPU_FIXED_MS = 1.0


def paper_model(model: StepModel, limits: MachineLimits | None, cost: ModelCost,
                fixed_ms: float = GPU_FIXED_MS) -> StepModel:
    """The step model on a GPU on paper: the datasheet's peaks (``limits``), ``cost``'s FLOPs and bytes, no fitted
    overheads (the roofline's max of compute and memory) plus the stated ``fixed_ms`` per step."""
    if not isinstance(limits, MachineLimits) or not limits.matmul_flops > 0 or not limits.bandwidth > 0:
        raise KVLabError("A GPU forecast needs the GPU's peak matmul FLOP/s and memory bandwidth: pass a "
                         "roofline.MachineLimits (e.g. roofline.H100_SXM_BF16) as limits.")
    bound = model.with_limits(limits).for_model(cost)
    bound.constants = bound.constants | {"fixed_ms": fixed_ms}
    return bound


def kv_tokens_on(memory_gib: float, cost: ModelCost, utilization: float = 0.9, activations_gib: float = 2.0) -> int:
    """Tokens of KV a GPU of ``memory_gib`` holds for ``cost``'s model: vLLM's share of memory (``utilization``,
    its ``gpu_memory_utilization`` default) less the weights and an allowance for activations, ÷ bytes per token."""
    free = memory_gib * 2**30 * utilization - cost.weights_read(1) - activations_gib * 2**30
    if free <= 0:
        raise KVLabError(f"{memory_gib:g} GiB does not hold this model's weights ({cost.weights_read(1) / 2**30:.1f} GiB) "
                         "with room for a KV cache; choose a larger GPU or a smaller model.")
    return int(free // cost.kv_bytes_per_token)


def paper_setup(base: Setup, kv_tokens: int, block_size: int = 16, max_num_batched_tokens: int = 8192,
                max_num_seqs: int = 256, max_model_len: int = 8192) -> Setup:
    """``base``'s scheduler with a GPU's settings — KV pool of ``kv_tokens`` in ``block_size``-token blocks, token
    budget, ``max_num_seqs`` — for a forecast on paper: vLLM's scheduling rules, another machine's sizes."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    config = copy.deepcopy(base.vllm_config)
    config.scheduler_config.max_num_batched_tokens = max_num_batched_tokens
    config.scheduler_config.max_num_seqs = max_num_seqs
    config.scheduler_config.max_model_len = config.model_config.max_model_len = max_model_len
    config.cache_config.block_size = block_size
    kv = copy.deepcopy(base.kv_cache_config)
    kv.num_blocks = kv_tokens // block_size + 1  # + vLLM's null block
    for group in kv.kv_cache_groups:
        group.kv_cache_spec = replace(group.kv_cache_spec, block_size=block_size)
    hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return Setup(config, kv, block_size, block_size, get_request_block_hasher(block_size, hash_fn), max_model_len,
                 {"on paper": True, "block_size": block_size, "max_num_batched_tokens": max_num_batched_tokens,
                  "max_num_seqs": max_num_seqs})


def draws(model: StepModel, count: int, seed: int = 0) -> list[tuple[StepModel, float]]:
    """``count`` plausible step models for an interval: constants drawn from their fitted uncertainty (normal, 1 SE),
    each with a whole-run scale: a whole run's error on a shape the model was not fitted on (each calibration point's
    run predicted by a fit on the other points, ``stepmodel.point_out_errors``; else the leave-one-out residuals,
    else the fit's residuals) times the machine's run-to-run noise (the calibration's repeats of one point,
    ``stepmodel.run_to_run``): a run is off by a common factor, its steps' own noise averaging out."""
    rng = np.random.default_rng(seed)
    errors = model.meta.get("point_out_errors") or model.meta.get("leave_one_out_residuals") or model.residuals or [0.0]
    noise = model.meta.get("run_to_run") or [0.0]
    out = []
    for _ in range(count):
        constants = {k: float(rng.normal(v, model.errors.get(k, 0.0))) for k, v in model.constants.items()}
        drawn = StepModel(model.form, constants, model.errors, model.limits, model.cost, model.residuals,
                          model.points, model.other_form, model.meta, model.speed)
        shape = 1.0 / (1.0 + float(rng.choice(errors)))  # a model that over-predicted by r runs 1/(1+r)
        out.append((drawn, shape * (1.0 + float(rng.choice(noise)))))
    return out


def step_errors(model: StepModel) -> tuple[float, ...]:
    """Each step's own error, for an interval: the model's relative errors on step compositions it was not fitted on
    (leave-one-out; its residuals when those are not known). Over an isolated batch they average out; where requests
    arrive over time they move which steps a request joins — as a machine's jitter does."""
    return tuple(model.meta.get("leave_one_out_residuals") or model.residuals or ())


def point_metrics(requests: pd.DataFrame) -> dict[str, float]:
    """A workload's headline numbers: TTFT/TPOT/E2E p50 and p90 (ms), throughput (output tokens/s), the prefix-cache
    hit rate (cached ÷ prompt tokens) and preemptions."""
    out: dict[str, float] = {}
    for col in ("ttft_s", "tpot_s", "e2e_s"):
        values = requests[col].dropna()
        for q in (50, 90):
            out[f"{col[:-2]}_p{q}_ms"] = float(np.percentile(values, q)) * 1e3 if len(values) else math.nan
    span = float(requests.last_token_s.max() - requests.arrival_s.min())
    out["throughput_tok_s"] = float(requests.output_tokens.sum()) / span if span > 0 else math.nan
    out["hit_rate"] = float(requests.cached_tokens.sum() / requests.prompt_tokens.sum())
    out["preemptions"] = float(requests.preemptions.sum())
    if "decode_steps" in requests:  # output tokens after the first, per step that gave a request tokens
        steps = requests.decode_steps.sum()
        out["tokens_per_step"] = float((requests.output_tokens - 1).sum() / steps) if steps else math.nan
    return out


def run_metrics(requests: pd.DataFrame, steps: pd.DataFrame) -> dict[str, float]:
    """``point_metrics`` and the peak KV blocks in use over the run's steps: what is predicted and measured per point."""
    return point_metrics(requests) | {"peak_blocks": float(steps.blocks_used.max())}


#: Metrics vLLM's own rules decide whatever the step times (block allocation, for requests that arrive together):
#: forecast as exact, with no interval drawn.
EXACT_METRICS = ("peak_blocks",)


@dataclass
class Prediction:
    """A forecast with its 80 % interval: the central run (fitted constants), and per metric the 10th and 90th
    percentile over the draws."""

    central: Forecast
    metrics: dict[str, float]
    lo80: dict[str, float]
    hi80: dict[str, float]


def simulate_runs(setup: Setup, runs: list[list[Arrival]], model: StepModel, scale: float = 1.0,
                  speculation: Speculation | None = None, seed: int = 0, step_noise: tuple[float, ...] = ()) -> Forecast:
    """Several runs one after another, each on an idle engine with an empty prefix cache (its times its own)."""
    parts = [simulate(setup, arrivals, model, scale, speculation=speculation, seed=seed + i, step_noise=step_noise)
             for i, arrivals in enumerate(runs)]
    return Forecast(pd.concat([p.requests for p in parts], ignore_index=True),
                    pd.concat([p.steps for p in parts], ignore_index=True))


def predict(setup: Setup, runs: list[list[Arrival]], model: StepModel, samples: int = 12, seed: int = 0,
            speculation: Speculation | None = None) -> Prediction:
    """The central forecast of ``runs`` (each a list of arrivals run on an idle engine) and an 80 % interval of every
    ``point_metrics`` value from ``samples`` drawn models (and, with ``speculation``, drawn drafts and acceptances)."""
    central = simulate_runs(setup, runs, model, speculation=speculation, seed=seed)
    metrics = run_metrics(central.requests, central.steps)
    if speculation is not None:  # drafts are drawn: the central value is the median over several draws of them
        again = [point_metrics(simulate_runs(setup, runs, model, speculation=speculation, seed=seed + s).requests)
                 for s in range(1, 8)]
        metrics |= pd.DataFrame([point_metrics(central.requests), *again]).median().to_dict()
    noise = step_errors(model)
    drawn = [point_metrics(simulate_runs(setup, runs, m, scale, speculation, seed + 1000 * (i + 1), noise).requests)
             for i, (m, scale) in enumerate(draws(model, samples, seed))]
    table = pd.DataFrame(drawn)
    lo = {k: float(min(table[k].quantile(0.1), metrics[k])) for k in table}
    hi = {k: float(max(table[k].quantile(0.9), metrics[k])) for k in table}
    for exact in EXACT_METRICS:  # vLLM's block allocation decides them: exact, not a draw
        lo[exact] = hi[exact] = metrics[exact]
    return Prediction(central, metrics, lo, hi)


def max_rate(setup: Setup, make: Any, model: StepModel, objective: slo.SLO, lo: float, hi: float, iters: int = 7) -> float:
    """The largest Poisson arrival rate (req/s) whose forecast meets ``objective`` (p-th percentile of each objective
    within its threshold, after the first 20 % of requests, as ``slo.rate_point`` judges a measured run), by
    bisection between ``lo`` and ``hi``; ``make(rate)`` builds the arrivals at a rate."""
    def meets(rate: float) -> bool:
        run = simulate(setup, make(rate), model).requests
        return bool(slo.rate_point(slo.steady_state(run), objective)["meets_slo"])

    if not meets(lo):
        raise KVLabError(f"Even {lo:.3g} req/s misses the SLO in the forecast; loosen the SLO or shorten the requests.")
    while meets(hi):
        lo, hi = hi, hi * 2
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return lo
