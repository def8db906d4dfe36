"""Print pip's effective index, find-links and constraint settings as uv arguments, one per line.

uv does not read pip's configuration; the setup must install from the same places pip would (on these machines a
local find-links folder holds the +cpu torch). Environment (PIP_*) settings win over config files, as in pip.
"""

import subprocess
import sys
from pathlib import Path

SCOPES = (":env:", "install", "global")  # pip's precedence, highest first
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
           "constraint": "--constraint"}


def pip_settings() -> dict[str, list[str]]:
    """Each option's values from the highest-precedence scope that sets it (`pip config list`)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    found: dict[str, dict[str, list[str]]] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        scope, _, option = key.rpartition(".")
        if option in OPTIONS and scope in SCOPES:
            found.setdefault(option, {})[scope] = value.strip().strip("'\"").split()
    return {opt: next(by_scope[s] for s in SCOPES if s in by_scope) for opt, by_scope in found.items()}


def local_path_missing(value: str) -> bool:
    """A find-links folder or constraint file that is not there (uv stops on it; pip warns and goes on)."""
    path = value.removeprefix("file://")
    return "://" not in path and not Path(path).exists()


if __name__ == "__main__":
    for option, values in pip_settings().items():
        for value in values:
            if option in ("find-links", "constraint") and local_path_missing(value):
                continue
            print(OPTIONS[option])
            print(value)
