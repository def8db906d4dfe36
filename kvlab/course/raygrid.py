"""Lab grids across machines with Ray (the distributed backend vLLM itself uses): each lab run is one Ray task that
owns **one GPU** (on a cluster with GPUs) or **one whole node** (CPU machines: every node offers one ``kvlab_node``
resource), so two timed runs never share a machine. Each run's files come back to the driver and land in
``<out>/runs/<run id>/`` exactly as a local run's do (``kvlab.course.grid``): ``collect`` and resuming are unchanged.

Set-up, on every machine: this repository at the same commit, ``make setup``, then ``.venv/bin/pip install -e .[ray]
-c requirements/cpu.lock`` (or ``gpu.lock``). Start Ray from that environment, on the machines' private addresses::

    head:    .venv/bin/ray start --head --node-ip-address=10.0.0.1 --resources='{"kvlab_node": 1}'
    others:  .venv/bin/ray start --address=10.0.0.1:6379 --node-ip-address=10.0.0.2 --resources='{"kvlab_node": 1}'
    then:    .venv/bin/kvlab labs run labs/grids/example.yaml --ray auto

``--ray local`` starts a private Ray instance on 127.0.0.1 for this machine only (what the tests use).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvlab.course import runs
from kvlab.runtime import config
from kvlab.runtime.errors import KVLabError

#: The custom resource each CPU node offers once: a run that holds it owns the node.
NODE_RESOURCE = "kvlab_node"
#: Settings a run must see on every node (the rest of the environment is the node's own).
FORWARDED_ENV = ("KVLAB_QUICK", "KVLAB_MODEL", "KVLAB_KV_CACHE_GIB")


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise KVLabError("Ray is not installed: install the extra with `.venv/bin/pip install -e .[ray] -c requirements/cpu.lock`, "
                         "or run the grid without --ray.") from None
    return ray


def connect(address: str) -> bool:
    """Connect to Ray: ``local`` starts a private instance on 127.0.0.1 (one ``kvlab_node``); anything else joins an
    existing cluster. Returns True when this call started Ray (so the caller shuts it down)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address == "local":
        # Ray's single-machine mode: its node address stays 127.0.0.1, so every server it starts listens on loopback
        # only. Without it, Ray replaces the 127.0.0.1 it is given by this machine's own address (ray/_private/
        # services.py: resolve_ip_for_localhost) and its gRPC servers listen on every interface. Ray's processes read
        # the variable when they start; this process may have imported ray already, so its constant is set too.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray = _ray()
    if ray.is_initialized():
        return False
    if address == "local":
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
        ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, resources={NODE_RESOURCE: 1},
                 num_cpus=os.cpu_count(), log_to_driver=False, logging_level="WARNING")
        return True
    try:
        _check_reachable(address)
        ray.init(address=address, log_to_driver=False, logging_level="WARNING")
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise KVLabError(f"Could not reach a Ray cluster at {address!r} ({first}); start one with `ray start --head` "
                         "(see kvlab/course/raygrid.py) or use --ray local.") from None
    return True


def _check_reachable(address: str, timeout_s: float = 3.0) -> None:
    """For ``ray://HOST:PORT``: one TCP connect first, so a wrong address fails in seconds, not after the Ray client's
    retries with back-off (about 30 s measured). Raises ConnectionError when nothing listens there."""
    import socket
    from urllib.parse import urlsplit

    if not address.startswith("ray://"):
        return
    parts = urlsplit(address)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 10001), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ConnectionError(exc.strerror or type(exc).__name__) from None


def placement() -> dict[str, Any]:
    """What each task asks for: one GPU when the cluster has GPUs, else one whole node (its ``kvlab_node``)."""
    resources = _ray().cluster_resources()
    if resources.get("GPU", 0) >= 1:
        return {"num_gpus": 1, "num_cpus": 0}
    if resources.get(NODE_RESOURCE, 0) >= 1:
        return {"num_cpus": 0, "resources": {NODE_RESOURCE: 1}}
    raise KVLabError(f"The Ray cluster has no GPU and no {NODE_RESOURCE!r} resource, so a run could not own a machine; "
                     f"start every node with --resources='{{\"{NODE_RESOURCE}\": 1}}'.")


def run_on_node(lab: str, parameters: dict[str, Any], timeout_s: int | None, driver_version: str) -> dict[str, Any]:
    """The Ray task: execute one run into a temporary folder on this node and return its status and files."""

    node = socket.gethostname()
    gpus = _ray().get_gpu_ids()
    node += f" (GPU {','.join(map(str, gpus))})" if gpus else ""
    run = runs.Run(lab, parameters)
    if config.VERSION != driver_version:
        error = f"node {node} has kvlab {config.VERSION}, the driver {driver_version}: set every node up from the same commit"
        return {"status": run.record(status="failed", seconds=0.0, error=error, node=node), "files": {}}
    with tempfile.TemporaryDirectory(prefix="kvlab-run-") as tmp:
        status = runs.execute(run, Path(tmp), timeout_s) | {"node": node}
        folder = Path(tmp) / "runs" / run.run_id
        files = {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}
    return {"status": status, "files": files}


def _land(out: Path, status: dict[str, Any], files: dict[str, bytes]) -> dict[str, Any]:
    """Write a run's files into ``out/runs/<id>/`` the way a local run leaves them, ``status.json`` last."""

    folder = out / "runs" / status["run_id"]
    if folder.exists():
        shutil.rmtree(folder)  # a previous failed attempt: replaced as a whole
    folder.mkdir(parents=True)
    for rel, data in files.items():
        if rel == "status.json":
            continue
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    runs.write_status(folder / "status.json", status)
    return status


def execute_all(runs: list[Any], out: Path, address: str, timeout_s: int | None = None) -> Iterator[dict[str, Any]]:
    """Submit every run as a Ray task and yield each status as soon as its files are on disk here."""

    started = connect(address)  # first: it sets what Ray must read when it is first imported
    ray = _ray()
    pending: dict[Any, Any] = {}
    try:
        options = placement() | {"max_retries": 0,
                                 "runtime_env": {"env_vars": {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}}}
        task = ray.remote(run_on_node)
        for run in runs:
            pending[task.options(**options).remote(run.lab, run.parameters, timeout_s, config.VERSION)] = (run, time.perf_counter())
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            run, t0 = pending.pop(done[0])
            try:
                result = ray.get(done[0])
            except Exception as exc:  # noqa: BLE001 - a lost node or worker: recorded, the grid goes on
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                result = {"status": run.record(status="failed", seconds=round(time.perf_counter() - t0, 1),
                                               error=f"Ray task failed: {first}"), "files": {}}
            yield _land(out, result["status"], result["files"])
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()
