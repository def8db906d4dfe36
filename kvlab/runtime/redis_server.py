"""A real Redis for the gateway's response cache: Debian's ``redis-server`` (installed by ``scripts/setup-redis.sh``),
started on 127.0.0.1 and a free port with no persistence (nothing written to disk), and always stopped."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from kvlab.runtime.errors import KVLabError
from kvlab.runtime.services import Service


class RedisServer(Service):
    """One ``redis-server`` process bound to ``host`` (127.0.0.1 by default), protected mode on, no RDB or AOF files."""

    name = "Redis server"

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", timeout_s: float = 20.0) -> None:
        super().__init__(port, host, timeout_s)
        self.workdir = ""

    @property
    def redis_url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def command(self) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise KVLabError("Redis is not installed: run `make setup` (scripts/setup-redis.sh installs Debian's "
                             "redis-server) or install redis-server yourself.")
        self.workdir = tempfile.mkdtemp(prefix="kvlab-redis-")
        return [binary, "--bind", self.host, "--port", str(self.port), "--protected-mode", "yes", "--save", "",
                "--appendonly", "no", "--dir", self.workdir, "--daemonize", "no", "--loglevel", "warning"]

    def healthy(self) -> bool:
        """True when Redis answers PING."""
        import redis

        try:
            return bool(redis.Redis(host=self.host, port=self.port, socket_timeout=1.0).ping())
        except redis.RedisError:
            return False

    def client(self) -> Any:
        """A ``redis.Redis`` client for this server."""
        import redis

        return redis.Redis(host=self.host, port=self.port, socket_timeout=2.0, decode_responses=True)

    def stop(self, grace_s: float = 5.0) -> None:
        super().stop(grace_s)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __repr__(self) -> str:
        return f"RedisServer({self.redis_url}, {'running' if self.proc else 'stopped'})"
