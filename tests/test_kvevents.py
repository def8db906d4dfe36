"""KV cache events: decoding into a tidy table and inferring owners (pure logic on small stand-ins), then the real
engine's events against its own counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pytest

from kvlab import kvevents


@dataclass
class BlockStored:  # stand-ins named like vLLM's event classes: the table is built from the class name and fields
    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int


@dataclass
class BlockRemoved:
    block_hashes: list[Any]


@dataclass
class AllBlocksCleared:
    pass


@dataclass
class Batch:
    ts: float
    events: list[Any] = field(default_factory=list)


def subscriber_with(*batches: Batch) -> kvevents.Subscriber:
    sub = kvevents.Subscriber()
    for seq, b in enumerate(batches):
        sub._add(seq, b)
    sub.close()
    return sub


def test_stored_blocks_become_one_row_each_with_their_chain_position_and_tokens():
    sub = subscriber_with(Batch(1.0, [BlockStored([b"\x01" * 8, b"\x02" * 8], None, list(range(8)), 4)]),
                          Batch(2.0, [BlockStored([b"\x03" * 8], b"\x02" * 8, [8, 9, 10, 11], 4)]),
                          Batch(3.0, [BlockRemoved([b"\x01" * 8]), AllBlocksCleared()]))
    t = sub.table()
    assert t.event.tolist() == ["stored", "stored", "stored", "removed", "cleared"]
    assert t.position.tolist()[:4] == [0, 1, 2, 0] and t.tokens.tolist()[:3] == [4, 4, 4]
    assert t.token_ids[1] == [4, 5, 6, 7] and t.parent_hash[2] == t.block_hash[1] == (b"\x02" * 8).hex()
    assert not sub.folder.exists()  # close() removed the socket's folder


def test_starting_twice_keeps_one_connection_so_no_event_is_counted_twice():
    import threading

    with kvevents.Subscriber().start() as sub:  # start() then __enter__: one listening thread, not two
        assert sum(t.name == "kvlab-kv-events" for t in threading.enumerate()) == 1
    assert not sub.folder.exists() and not any(t.name == "kvlab-kv-events" for t in threading.enumerate())


def test_batches_published_before_the_subscriber_joined_are_replayed_in_order():
    """vLLM's own publisher (no engine): batch 0 goes out before any subscriber is connected (PUB/SUB drops it), batch
    1 after; the subscriber sees 1, notices 0 is missing and fetches it from the replay socket first."""
    import time

    from vllm.distributed.kv_events import AllBlocksCleared as Cleared
    from vllm.distributed.kv_events import BlockRemoved as Removed
    from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher

    sub = kvevents.Subscriber()
    cfg = sub.engine_args()["kv_events_config"]
    pub = ZmqEventPublisher(0, endpoint=cfg.endpoint, replay_endpoint=cfg.replay_endpoint, topic=cfg.topic)
    try:
        pub.publish(KVEventBatch(ts=1.0, events=[Removed(block_hashes=[7], medium=None)]))  # nobody listening yet
        time.sleep(0.3)
        sub.start()
        time.sleep(0.3)
        pub.publish(KVEventBatch(ts=2.0, events=[Cleared()]))
        deadline = time.monotonic() + 10
        while len(sub.table()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        t = sub.table()
        assert t.seq.tolist() == [0, 1] and t.event.tolist() == ["removed", "cleared"] and sub.replayed == 1, t
    finally:
        pub.shutdown()
        sub.close()


def test_owners_follow_the_whole_prefix_not_just_one_block():
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # two full blocks of 4 (the 9th token is a partial block: never cached)
    b = [1, 2, 3, 4, 50, 60, 70, 80]  # shares a's first block only
    c = [0, 0, 0, 0, 5, 6, 7, 8]  # same tokens as a's second block, another prefix
    sub = subscriber_with(Batch(1.0, [BlockStored([11, 12], None, a[:8], 4)]),
                          Batch(2.0, [BlockStored([13], 11, b[4:8], 4)]),
                          Batch(3.0, [BlockStored([14, 15], None, c, 4)]),
                          Batch(4.0, [BlockRemoved([12]), AllBlocksCleared()]))
    labels = kvevents.owners(sub.table(), {"a": a, "b": b, "c": c}, block_size=4).tolist()
    assert labels == ["a, b", "a", "b", "c", "c", "a", ""]


#: Both real-engine scenarios in one process (one vLLM import, and the first engine also gives the block size and
#: bytes per token that size the second one's 12-block pool). A process of its own: closing an in-process engine
#: would tear down the session engine's parallel state.
_ENGINE_RUN = """
import json
import kvlab
from kvlab import kvevents
from kvlab.caching import prefix_counters
from kvlab.timing import generate_timed
from kvlab.prompts import distinct_prompts, prompt_of_length

with kvevents.Subscriber() as sub:
    llm = kvlab.make_engine(enforce_eager=True, kv_cache_gib=1.0, max_model_len=1024, **sub.engine_args())
    cap = kvlab.kv_capacity(llm)
    block = cap.block_size
    ids = prompt_of_length(llm.get_tokenizer(), 3 * block + 17)
    before = prefix_counters(llm)
    first = generate_timed(llm, ids, 2)
    second = generate_timed(llm, ids, 2)
    after = prefix_counters(llm)
    llm.reset_prefix_cache()
    third = generate_timed(llm, ids, 2)  # the reset is published with the next step's events
    sub.wait_quiet()
    events = sub.table()
    folder = sub.folder
    kvlab.close_engine(llm)
stored = {"block": block, "events": events.event.tolist(), "tokens": events.tokens.tolist(),
          "positions": events.position.tolist(), "cached": [first.num_cached_tokens, second.num_cached_tokens, third.num_cached_tokens],
          "hits": after["hits"] - before["hits"], "folder_left": folder.exists()}

with kvevents.Subscriber() as sub:
    blocks, size = 12, cap.block_size
    llm = kvlab.make_engine(enforce_eager=True, kv_cache_memory_bytes=blocks * size * cap.bytes_per_token,
                            max_model_len=blocks * size // 2, **sub.engine_args())
    tok = llm.get_tokenizer()
    prefix = prompt_of_length(tok, 4 * size)
    shared = [prefix + s for s in distinct_prompts(tok, 40, 2, seed=3)]
    unique = distinct_prompts(tok, 3 * size + 10, 8, seed=9)
    hits = {}
    generate_timed(llm, shared[0], 2)
    for u in unique[:4]:  # the prefix is used again after each unique request: it stays recently used
        generate_timed(llm, u, 2)
        hits.setdefault("touched", []).append(generate_timed(llm, shared[1], 2).num_cached_tokens)
    for u in unique[4:]:  # now only unique traffic: 4 x 3 blocks fill the 12-block pool
        generate_timed(llm, u, 2)
    hits["after unique only"] = generate_timed(llm, shared[1], 2).num_cached_tokens
    sub.wait_quiet()
    t = sub.table()
    t["owner"] = kvevents.owners(t, {"shared": shared[0], **{f"u{i}": u for i, u in enumerate(unique)}}, size)
    num_blocks = kvlab.kv_capacity(llm).num_blocks
    kvlab.close_engine(llm)
removed = t[t.event == "removed"].owner.tolist()
lru = {"size": size, "blocks": num_blocks, "hits": hits, "removed": removed}
print(json.dumps({"stored": stored, "lru": lru}))
"""


@pytest.fixture(scope="module")
def engine_run() -> dict:
    """The two scenarios' results from one engine process."""
    import json
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _ENGINE_RUN], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.engine
def test_a_prompt_stores_its_full_blocks_and_the_events_agree_with_the_counters(engine_run):
    """On the real engine: a prompt of 3 blocks + 17 tokens stores 3 blocks — the partial one never — the second
    identical request hits exactly those, the engine's hit counter agrees, and a reset of the cache is an event too."""
    out = engine_run["stored"]
    block = out["block"]
    assert out["events"] == ["stored"] * 3 + ["cleared"] + ["stored"] * 3, out["events"]
    assert out["tokens"][:3] == [block] * 3 and out["positions"][:3] == [0, 1, 2]
    assert out["cached"] == [0, 3 * block, 0]  # the second request found the 3 blocks (none stored); after the reset, none
    assert out["hits"] == 3 * block  # the engine's own counter agrees with the events
    assert not out["folder_left"]


@pytest.mark.engine
def test_an_unused_shared_prefix_is_evicted_least_recently_used_first(engine_run):
    """A 12-block pool: a 4-block shared prefix survives unique traffic while it keeps being used (the unique
    requests' own blocks are evicted instead, oldest first); once only unique traffic runs, the prefix is the least
    recently used and goes first — the BlockRemoved events name its blocks, and the next shared request misses."""
    out = engine_run["lru"]
    size = out["size"]
    assert out["blocks"] == 12
    assert out["hits"]["touched"] == [4 * size] * 4  # the prefix survived every unique request
    first_prefix_eviction = out["removed"].index("shared")
    assert all(o.startswith("u") for o in out["removed"][:first_prefix_eviction])  # unique blocks went first...
    assert out["removed"].count("shared") == 4 and out["hits"]["after unique only"] < 4 * size  # ...then the prefix


def test_lifetimes_pair_each_stored_block_with_its_removal():
    sub = subscriber_with(Batch(1.0, [BlockStored([11, 12], None, list(range(8)), 4)]),
                          Batch(2.0, [BlockRemoved([12]), BlockStored([13], None, [9] * 4, 4)]),
                          Batch(3.0, [BlockStored([12], 11, [4, 5, 6, 7], 4)]),
                          Batch(5.0, [AllBlocksCleared()]),
                          Batch(6.0, [BlockStored([14], None, [1] * 4, 4)]))
    t = sub.table()
    life = kvevents.lifetimes(t, pd.Series(["a", "a", "a", "b", "a", "", "c"], index=t.index))
    assert life[["stored_ts", "removed_ts"]].fillna(-1).values.tolist() == [[1, 5], [1, 2], [2, 5], [3, 5], [6, -1]]
    assert life.owner.tolist() == ["a", "a", "b", "a", "c"]


def test_block_pool_figure_draws_one_bar_per_lifetime_by_owner():
    from kvlab import paged

    life = pd.DataFrame({"block_hash": ["a", "b", "c"], "position": [0, 1, 0], "owner": ["shared", "shared", ""],
                         "stored_ts": [10.0, 10.0, 11.0], "removed_ts": [12.0, float("nan"), 13.0]})
    fig = paged.block_pool(life, t0=10.0, end_ts=14.0)
    shared = next(d for d in fig.data if d.name == "shared")
    assert list(shared.base) == [0.0, 0.0] and list(shared.x) == [2.0, 4.0]
    assert {d.name for d in fig.data} == {"shared", "other"}
