"""The server's Prometheus ``/metrics``: scrape, difference two scrapes, and read histograms like a dashboard does.

Counters and histograms only grow, so what happened during a run is ``after − before``. Histogram quantiles are
estimated the way Prometheus' ``histogram_quantile`` does: linear interpolation inside the bucket that holds the rank
(so a p95 is only as sharp as the bucket edges around it).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

#: vLLM histograms an operations dashboard plots (seconds).
HISTOGRAMS = {
    "TTFT": "vllm:time_to_first_token_seconds",
    "ITL": "vllm:inter_token_latency_seconds",
    "queue time": "vllm:request_queue_time_seconds",
    "prefill time": "vllm:request_prefill_time_seconds",
    "E2E latency": "vllm:e2e_request_latency_seconds",
}


def scrape(url: str) -> dict[str, float]:
    """All ``vllm:`` samples at ``url/metrics`` as {series: value}; label sets other than ``le`` are summed."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url.rstrip("/") + "/metrics", timeout=10.0).text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.startswith("vllm:") or s.name.endswith("_created"):
                continue
            key = f"{s.name}{{le={s.labels['le']}}}" if "le" in s.labels else s.name
            values[key] = values.get(key, 0.0) + float(s.value)
    return values


def engine_values(llm: Any) -> dict[str, float]:
    """The in-process engine's metrics (``LLM.get_metrics()``) in a scrape's shape, so the readers below work on both;
    histogram buckets are cumulative there too (``vllm/v1/metrics/reader.py``)."""
    values: dict[str, float] = {}
    for m in llm.get_metrics():
        if hasattr(m, "buckets"):
            for le, count in m.buckets.items():
                key = f"{m.name}_bucket{{le={float(le)}}}"
                values[key] = values.get(key, 0.0) + float(count)
            values[m.name + "_count"] = values.get(m.name + "_count", 0.0) + float(m.count)
            values[m.name + "_sum"] = values.get(m.name + "_sum", 0.0) + float(m.sum)
        elif hasattr(m, "value"):
            values[m.name] = values.get(m.name, 0.0) + float(m.value)
    return values


def scrape_prefix(url: str, prefix: str) -> dict[str, float]:
    """Every sample at ``url/metrics`` whose name starts with ``prefix`` (e.g. the gateway's ``kvlab_gateway_``), keyed
    by name and labels as Prometheus writes them: ``name{label="value"}``."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url.rstrip("/") + "/metrics", timeout=10.0).text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(prefix) and not s.name.endswith("_created"):
                if set(s.labels) == {"le"}:  # histogram buckets keyed as ``scrape`` keys them: quantile() reads both
                    values[f"{s.name}{{le={s.labels['le']}}}"] = float(s.value)
                    continue
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                values[s.name + (f"{{{labels}}}" if labels else "")] = float(s.value)
    return values


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What changed between two scrapes (gauges keep their ``after`` value)."""
    return {k: v - before.get(k, 0.0) if not _is_gauge(k) else v for k, v in after.items()}


def _is_gauge(key: str) -> bool:
    return key.startswith(("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
                           "vllm:cache_config_info", "vllm:engine_sleep_state"))


def buckets(values: dict[str, float], histogram: str) -> pd.DataFrame:
    """A histogram's cumulative buckets: columns ``le`` (upper edge) and ``count``, sorted."""
    prefix = histogram + "_bucket{le="
    rows = [{"le": float(k[len(prefix):-1]), "count": v} for k, v in values.items() if k.startswith(prefix)]
    return pd.DataFrame(rows, columns=["le", "count"]).sort_values("le", ignore_index=True)


def quantile(values: dict[str, float], histogram: str, q: float) -> float:
    """Prometheus-style quantile ``q`` (0–1) of a histogram from its buckets; NaN when it holds no observations."""
    b = buckets(values, histogram)
    if b.empty or b["count"].iloc[-1] <= 0:
        return math.nan
    rank = q * b["count"].iloc[-1]
    lower_edge, lower_count = 0.0, 0.0
    for le, count in zip(b["le"], b["count"], strict=True):
        if count >= rank:
            if math.isinf(le):
                return lower_edge  # the top bucket has no upper edge: Prometheus returns the last finite one
            return lower_edge + (le - lower_edge) * (rank - lower_count) / max(count - lower_count, 1e-12)
        lower_edge, lower_count = le, count
    return lower_edge


def mean(values: dict[str, float], histogram: str) -> float:
    """Mean of a histogram's observations (``_sum ÷ _count``)."""
    count = values.get(histogram + "_count", 0.0)
    return values.get(histogram + "_sum", 0.0) / count if count else math.nan


def dashboard(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """The numbers an operations dashboard shows for a window of ``seconds``, read from two scrapes."""
    d = delta(before, after)
    row = {"requests": d.get("vllm:request_success_total", 0.0),
           "prompt tokens": d.get("vllm:prompt_tokens_total", 0.0),
           "output tokens": d.get("vllm:generation_tokens_total", 0.0)}
    row["output tokens/s"] = row["output tokens"] / seconds if seconds > 0 else math.nan
    for name, hist in HISTOGRAMS.items():
        row[f"{name} mean (ms)"] = mean(d, hist) * 1e3  # exact: _sum ÷ _count
        row[f"{name} p50 (ms)"] = quantile(d, hist, 0.5) * 1e3
        row[f"{name} p95 (ms)"] = quantile(d, hist, 0.95) * 1e3
    queries = d.get("vllm:prefix_cache_queries_total", 0.0)
    row["prefix cache hit rate"] = d.get("vllm:prefix_cache_hits_total", 0.0) / queries if queries else math.nan
    row["KV cache usage (now)"] = after.get("vllm:kv_cache_usage_perc", math.nan)
    return row


def as_table(values: dict[str, float], contains: str = "") -> pd.DataFrame:
    """Series whose name contains ``contains``, as a two-column table (for reading raw ``/metrics``)."""
    rows: list[dict[str, Any]] = [{"series": k, "value": v} for k, v in sorted(values.items()) if contains in k]
    return pd.DataFrame(rows, columns=["series", "value"])


def hit_rates(engine_before: dict[str, float], engine_after: dict[str, float], gateway_values: dict[str, float]) -> dict[str, float]:
    """The two hit rates of one run, side by side: the gateway's response cache (requests answered from Redis ÷
    lookups) and the engine's prefix cache (prompt tokens hit ÷ queried, from two scrapes of the server)."""
    hits = gateway_values.get('kvlab_gateway_response_cache_total{result="hit"}', 0.0)
    misses = gateway_values.get('kvlab_gateway_response_cache_total{result="miss"}', 0.0)
    queried = engine_after.get("vllm:prefix_cache_queries_total", 0.0) - engine_before.get("vllm:prefix_cache_queries_total", 0.0)
    hit_tokens = engine_after.get("vllm:prefix_cache_hits_total", 0.0) - engine_before.get("vllm:prefix_cache_hits_total", 0.0)
    return {"response-cache hit rate (requests, gateway)": hits / (hits + misses) if hits + misses else float("nan"),
            "prefix-cache hit rate (tokens, engine)": hit_tokens / queried if queried else float("nan")}


def board(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The gateway's dashboard numbers for a window, from two scrapes of its ``/metrics`` (``metrics.scrape_prefix``)."""
    def d(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    hits, misses = d('kvlab_gateway_response_cache_total{result="hit"}'), d('kvlab_gateway_response_cache_total{result="miss"}')
    return {"response-cache hit rate": hits / (hits + misses) if hits + misses else float("nan"),
            "answered from Redis": d('kvlab_gateway_requests_total{route="response_cache"}'),
            "sent down the batch lane": d('kvlab_gateway_requests_total{route="batch_lane"}'),
            "rejected over the input cap": d('kvlab_gateway_requests_total{route="rejected"}'),
            "cache errors": d("kvlab_gateway_cache_errors_total")}
