"""Local services the course starts (the vLLM server, Redis, the gateway): one process each, on 127.0.0.1 and a free
port, its log in a file, healthy before use, and always stopped — by ``stop()``, the ``with`` block, interpreter exit,
or, if the kernel dies, by the kernel's death (Linux parent-death signal)."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from typing import Any

from kvlab.runtime import config
from kvlab.runtime.errors import KVLabError

_LIVE: list[Service] = []


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    """True when something already accepts connections (or holds the address) at ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Service:
    """One local service process (and its children). Subclasses give ``name``, ``command()`` and ``healthy()``."""

    name = "service"
    hint = ""  # one sentence added to a start-up failure: how to fix the usual cause

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", timeout_s: float = 60.0) -> None:
        self.host, self.timeout_s = host, timeout_s
        self.port = port or free_port(host)
        self.proc: subprocess.Popen | None = None
        self.log_file = config.build_dir() / "logs" / f"{self.name.split()[-1].lower()}-{os.getpid()}-{self.port}.log"
        self.start_s = float("nan")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        """The environment the process starts with."""
        return dict(os.environ)

    def healthy(self) -> bool:
        raise NotImplementedError

    def explain(self, log_text: str) -> str | None:
        """One sentence for a start-up failure this service recognizes in its log, or None (the log's tail is shown)."""
        return None

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of the service's log."""
        if not self.log_file.exists():
            return "(no log written)"
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    def start(self) -> Service:
        """Launch the process and wait until it is healthy; on any failure stop it and raise one clear error."""
        if port_in_use(self.host, self.port):
            raise KVLabError(f"Port {self.port} on {self.host} is already in use; pass port=None to let KV Lab pick a free "
                             "port, or stop whatever holds it.")
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "w") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env(), start_new_session=True, preexec_fn=_die_with_parent)  # noqa: PLW1509
        _LIVE.append(self)
        t0 = time.perf_counter()
        while True:
            code = self.proc.poll()
            if code is not None:
                self.stop()
                known = self.explain(self.log_tail(200))
                if known:
                    raise KVLabError(f"The {self.name} did not start: {known.rstrip('.')} (full log: {self.log_file}).")
                raise KVLabError(f"The {self.name} exited during start-up (exit code {code}){self.hint}; its last log lines "
                                 f"(full log: {self.log_file}):\n{self.log_tail()}")
            if self.healthy():
                self.start_s = time.perf_counter() - t0
                config.note_startup(self.name, self.start_s)
                return self
            if time.perf_counter() - t0 > self.timeout_s:
                self.stop()
                raise KVLabError(f"The {self.name} was not healthy within {self.timeout_s:.0f} s, so it was stopped; raise "
                                 f"timeout_s= if this machine is slow. Last log lines (full log: {self.log_file}):\n{self.log_tail()}")
            time.sleep(0.2)

    def processes(self) -> list[Any]:
        """The process and all its descendants that are still alive (psutil processes)."""
        import psutil

        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, grace_s: float = 15.0) -> None:
        """Terminate the process and its children (SIGTERM, then SIGKILL after ``grace_s``); safe to call twice."""
        import psutil

        if self.proc is None:
            return
        procs = self.processes()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(alive, timeout=5)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self.proc = None
        if self in _LIVE:
            _LIVE.remove(self)

    def __enter__(self) -> Service:
        return self if self.proc else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class HttpService(Service):
    """A service that speaks the OpenAI API over HTTP (the vLLM server, the gateway): healthy when ``/health`` answers."""

    @property
    def base_url(self) -> str:
        """OpenAI API base URL (``/v1``)."""
        return self.url + "/v1"

    def healthy(self) -> bool:
        """True when ``GET /health`` answers 200."""
        import httpx

        try:
            return httpx.get(self.url + "/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def client(self) -> Any:
        """An ``openai.OpenAI`` client for this service (no key needed, no retries: a failure shows as it is)."""
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key="not-needed", max_retries=0, timeout=600.0)


def stop_all(kind: type[Service] = Service) -> None:
    """Stop every service of this kind (default: all) that this process started."""
    for service in list(_LIVE):
        if isinstance(service, kind):
            service.stop()


atexit.register(stop_all)
