"""The engine's own record of its KV cache blocks: vLLM's KV cache events, collected into a tidy table.

With ``kv_events_config`` set, vLLM 0.32's scheduler publishes one ``KVEventBatch`` per step that changed the cache
(``vllm/v1/core/sched/scheduler.py``: ``KVEventBatch(ts=time.time(), events=...)``), through a ZMQ PUB socket
(``vllm/distributed/kv_events.py``: ``ZmqEventPublisher`` sends ``(topic, sequence number, msgpack payload)``). The
events (``vllm/v1/core/block_pool.py``):

- ``BlockStored``: full blocks just cached — their hashes (each one a hash of the parent's hash and the block's
  tokens, so a hash names the whole prefix up to it), the parent of the first, the token ids, the block size;
- ``BlockRemoved``: cached blocks evicted (their memory reused for another block);
- ``AllBlocksCleared``: the prefix cache was reset.

A ``Subscriber`` binds nothing on the network: the publisher binds an ``ipc://`` socket in a private temporary folder
(vLLM's publisher binds ``ipc://``, ``inproc://`` and wildcard ``tcp://*:…`` endpoints and connects to any other
``tcp://`` one: ``vllm/distributed/kv_events.py``, ``ZmqEventPublisher._is_bind_endpoint``), the subscriber connects to it, and a background thread decodes the
messages. ``close()`` (or the ``with`` block) stops the thread, closes the socket and removes the folder.

PUB/SUB drops what is published before the subscriber's connection is up (ZMQ's "slow joiner"): a small engine can
serve its first request within the 100 ms a SUB socket waits between connection attempts, and the blocks that request
stored would be missing. So the publisher also binds a replay socket (``replay_endpoint``: it keeps the last batches
and resends them from a sequence number on request, ``ZmqEventPublisher._service_replay``), and the subscriber asks
it for any batch whose sequence number it skipped — every engine's first batch is number 0.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd

from kvlab.runtime.engine import import_vllm

COLUMNS = ["seq", "ts", "event", "group", "kind", "block_hash", "parent_hash", "position", "tokens", "token_ids"]


class Subscriber:
    """Collects an engine's KV cache events while it runs. Pass ``engine_args()`` to ``make_engine``."""

    def __init__(self, topic: str = "kvlab") -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="kvlab-kv-events-"))
        self.endpoint = f"ipc://{self.folder / 'kv-events.sock'}"
        self.replay_endpoint = f"ipc://{self.folder / 'kv-replay.sock'}"
        self.topic = topic
        self.rows: list[dict[str, Any]] = []
        self.batches = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._positions: dict[Any, int] = {}
        self._next_seq = 0  # the sequence number the next batch should carry (each engine's publisher starts at 0)
        self.replayed = 0  # batches recovered through the replay socket

    def engine_args(self) -> dict[str, Any]:
        """The ``kv_events_config`` that makes the next engine publish to this subscriber (call it once per engine:
        a new publisher numbers its batches from 0 again)."""

        import_vllm()  # the course's environment first (in-process engine on CPU), then vLLM's config classes
        from vllm.config import KVEventsConfig

        with self._lock:
            self._next_seq = 0
        return {"kv_events_config": KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=self.endpoint,
                                                   replay_endpoint=self.replay_endpoint, topic=self.topic)}

    def start(self) -> Subscriber:
        """Connect and start collecting (before the engine starts, so no event is missed); a second call (``with
        Subscriber().start() as sub``) keeps the one connection, so no event is counted twice."""

        if self._thread is not None and self._thread.is_alive():
            return self

        import_vllm()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="kvlab-kv-events", daemon=True)
        self._thread.start()
        ready.wait(5)
        return self

    def _run(self, ready: threading.Event) -> None:
        import msgspec
        import zmq
        from vllm.distributed.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        ctx = zmq.Context()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, 10)  # ms between attempts while no engine is bound: join soon after it binds
        sock.setsockopt_string(zmq.SUBSCRIBE, self.topic)
        sock.connect(self.endpoint)
        ready.set()
        try:
            while not self._stop.is_set():
                if not sock.poll(50):
                    continue
                _, seq_bytes, payload = sock.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big")
                with self._lock:
                    missed_from = self._next_seq if seq > self._next_seq else None
                    self._next_seq = seq + 1
                if missed_from is not None:  # joined late or dropped some: fetch them before this one, in order
                    for old_seq, old in self._replay(ctx, missed_from, seq):
                        self._add(old_seq, decoder.decode(old))
                self._add(seq, decoder.decode(payload))
        finally:
            sock.close(0)
            ctx.term()

    def _replay(self, ctx: Any, start: int, stop: int) -> list[tuple[int, bytes]]:
        """The batches numbered ``start`` to ``stop`` − 1, resent by the publisher's replay socket (empty if it does
        not answer within 2 s)."""
        import zmq

        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        got: list[tuple[int, bytes]] = []
        try:
            dealer.send_multipart((b"", start.to_bytes(8, "big")))
            while dealer.poll(2000):
                frames = dealer.recv_multipart()  # (b"", topic, seq, payload); the end marker has an empty topic
                if len(frames) != 4 or not frames[1]:
                    break
                seq = int.from_bytes(frames[2], "big")
                if start <= seq < stop:
                    got.append((seq, frames[3]))
        finally:
            dealer.close(0)
        with self._lock:
            self.replayed += len(got)
        return got

    def _add(self, seq: int, batch: Any) -> None:
        rows = []
        for event in batch.events:
            kind = type(event).__name__
            if kind == "BlockStored":
                size = event.block_size
                parent = event.parent_block_hash
                group = {"group": getattr(event, "group_idx", None), "kind": getattr(event, "kv_cache_spec_kind", None)}
                for i, h in enumerate(event.block_hashes):
                    position = self._positions.get(parent, -1) + 1
                    self._positions[h] = position
                    ids = list(event.token_ids[i * size : (i + 1) * size])
                    rows.append({"seq": seq, "ts": batch.ts, "event": "stored", **group, "block_hash": _key(h),
                                 "parent_hash": _key(parent), "position": position, "tokens": len(ids), "token_ids": ids})
                    parent = h
            elif kind == "BlockRemoved":
                for h in event.block_hashes:
                    rows.append({"seq": seq, "ts": batch.ts, "event": "removed", "group": getattr(event, "group_idx", None),
                                 "kind": None, "block_hash": _key(h), "parent_hash": None,
                                 "position": self._positions.get(h, -1), "tokens": 0, "token_ids": []})
            else:  # AllBlocksCleared
                rows.append({"seq": seq, "ts": batch.ts, "event": "cleared", "block_hash": None, "parent_hash": None,
                             "position": -1, "tokens": 0, "token_ids": []})
        with self._lock:
            self.rows += rows
            self.batches += 1

    def wait_quiet(self, quiet_s: float = 0.3, timeout_s: float = 10.0) -> None:
        """Wait until no event has arrived for ``quiet_s`` (the publisher's thread sends shortly after each step)."""
        deadline = time.monotonic() + timeout_s
        last = -1
        while time.monotonic() < deadline:
            with self._lock:
                now = len(self.rows)
            if now == last:
                return
            last = now
            time.sleep(quiet_s)

    def table(self, group: int | None = None) -> pd.DataFrame:
        """Every event so far, one row per block: sequence number, wall-clock time, event, KV cache group (vLLM stores
        a block once per group: a model with sliding-window and full layers has several) and its kind, block hash
        (hex), parent hash, position in its prefix chain (0 = first block of a prompt), tokens and token ids. With
        ``group``, that KV cache group's events only (and the "cleared" ones, which concern every group)."""
        with self._lock:
            table = pd.DataFrame(list(self.rows), columns=COLUMNS)
        if group is None:
            return table
        return table[table.group.isna() | (table.group == group)].reset_index(drop=True)

    def clear(self) -> None:
        """Forget the events collected so far (the engine's cache is untouched)."""
        with self._lock:
            self.rows.clear()

    def close(self) -> None:
        """Stop the thread, close the socket, remove the folder; safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Subscriber:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _key(block_hash: Any) -> str | None:
    """A block hash as a short printable key (vLLM sends bytes or int)."""
    if block_hash is None:
        return None
    with contextlib.suppress(AttributeError):
        return block_hash.hex()[:16]
    return format(int(block_hash) & (2**64 - 1), "016x")


def owners(events: pd.DataFrame, prompts: dict[str, list[int]], block_size: int) -> pd.Series:
    """Which prompt each stored block belongs to, where that can be inferred from the tokens: a block whose whole
    prefix (its tokens and every parent's, back to the first block) equals a prompt's first (k+1)·B tokens belongs to
    that prompt (labels joined by ", " when prompts share it; "" when none does, e.g. a block of generated tokens). A
    removed block gets the label it was stored with."""
    by_prefix: dict[tuple[Any, tuple[int, ...]], list[str]] = {}
    for label, ids in prompts.items():
        key: Any = None
        for k in range(len(ids) // block_size):
            key = (key, tuple(ids[k * block_size : (k + 1) * block_size]))
            by_prefix.setdefault(key, []).append(label)
    prefix_of: dict[Any, Any] = {}
    label_of: dict[Any, str] = {}
    labels = []
    for row in events.itertuples():
        if row.event == "stored":
            key = (prefix_of.get(row.parent_hash), tuple(row.token_ids))
            prefix_of[row.block_hash] = key
            label_of[row.block_hash] = ", ".join(by_prefix.get(key, []))
        labels.append(label_of.get(row.block_hash, "") if row.event != "cleared" else "")
    return pd.Series(labels, index=events.index, dtype=object)


def lifetimes(events: pd.DataFrame, labels: pd.Series | None = None) -> pd.DataFrame:
    """One row per time a block was cached: its hash, chain position, owner (``labels``, e.g. from ``owners``), when it
    was stored and when it was removed (evicted, or the cache cleared; NaN if still cached at the end), wall-clock s."""
    labels = labels if labels is not None else pd.Series("", index=events.index)
    open_: dict[Any, dict[str, Any]] = {}
    done: list[dict[str, Any]] = []
    for row, label in zip(events.itertuples(), labels, strict=True):
        if row.event == "stored":
            if row.block_hash in open_:  # stored again while cached: keep the first interval
                continue
            open_[row.block_hash] = {"block_hash": row.block_hash, "position": row.position, "owner": label,
                                     "stored_ts": row.ts, "removed_ts": float("nan")}
        elif row.event == "removed" and row.block_hash in open_:
            done.append(open_.pop(row.block_hash) | {"removed_ts": row.ts})
        elif row.event == "cleared":
            done += [life | {"removed_ts": row.ts} for life in open_.values()]
            open_.clear()
    out = pd.DataFrame(done + list(open_.values()), columns=["block_hash", "position", "owner", "stored_ts", "removed_ts"])
    return out.sort_values(["stored_ts", "position"], kind="stable", ignore_index=True)
