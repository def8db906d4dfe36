"""Labs: read a lab's ``parameters`` cell (names, defaults, types) and validate parameters before any work starts."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from kvlab import config
from kvlab.errors import KVLabError

LAB_DIR = config.REPO_ROOT / "labs"

#: What each lab's numbers must satisfy beyond their type: checked by ``validate`` — in the lab itself and, for a whole
#: grid, before any run starts. ``ranges``: {name: (low, high)}, inclusive.
RULES: dict[str, dict[str, Any]] = {
    "L01_capacity_planning": {"positive": ("memory_gib", "utilization", "context_lengths", "block_size", "target_sequences"),
                              "ranges": {"utilization": (0.01, 1.0)}},
    "L02_ttft_tpot_sweep": {"positive": ("prompt_lengths", "output_lengths", "repeats", "kv_cache_gib")},
    "L03_prefix_cache_delta": {"positive": ("prefix_tokens", "suffix_tokens", "requests", "output_tokens"),
                               "fractions": ("shared_fraction",)},
    "L04_chunked_prefill": {"positive": ("decoders", "decoder_prompt_tokens", "decoder_output_tokens", "long_prompt_tokens",
                                         "budgets")},
    "L05_batch_sweep": {"positive": ("batch_sizes", "prompt_tokens", "output_tokens", "repeats", "kv_cache_gib")},
    "L06_traffic_mix": {"positive": ("agent_turns", "growth_tokens", "requests", "rate_per_s", "concurrency", "output_tokens",
                                     "kv_cache_gib"),
                        "fractions": ("agent_share",), "ranges": {"agent_tools": (0, 13)}},
}


def list_labs() -> list[str]:
    """Names of the labs, in order."""
    return [p.stem for p in sorted(LAB_DIR.glob("L*.ipynb"))]


def lab_path(lab: str) -> Path:
    """Path of a lab notebook by name (``L01_capacity_planning``) or path."""
    path = Path(lab)
    if path.suffix == ".ipynb" and path.is_file():
        return path
    candidate = LAB_DIR / f"{Path(lab).stem}.ipynb"
    if candidate.is_file():
        return candidate
    known = ", ".join(list_labs())
    raise KVLabError(f"Unknown lab {lab!r}; the labs are: {known}.")


def lab_parameters(lab: str) -> dict[str, dict[str, Any]]:
    """The lab's parameters from its cell tagged ``parameters``: {name: {default, type, doc}}."""
    import nbformat

    nb = nbformat.read(lab_path(lab), as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise KVLabError(f"Lab {lab!r} has {len(cells)} cells tagged 'parameters'; papermill needs exactly one.")
    source = cells[0].source
    lines = source.splitlines()
    params: dict[str, dict[str, Any]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            default = ast.literal_eval(node.value)
            line = lines[node.lineno - 1]
            doc = line.split("#", 1)[1].strip() if "#" in line else ""
            params[node.targets[0].id] = {"default": default, "type": type(default).__name__, "doc": doc}
    return params


def _type_ok(value: Any, default: Any) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, list):
        if not isinstance(value, list) or not value:
            return False
        return not default or all(_type_ok(v, default[0]) for v in value)
    return isinstance(value, type(default))


def validate(lab: str, given: dict[str, Any], positive: tuple[str, ...] = (), fractions: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check names and types against the lab's parameters cell, then the lab's ``RULES`` (and any extra ``positive``
    / ``fractions``); return the full parameter set (defaults filled in). Each problem is one sentence naming the
    lab and the parameter."""
    spec = lab_parameters(lab)
    name = lab_path(lab).stem
    for key, value in given.items():
        if key not in spec:
            raise KVLabError(f"Lab {name} has no parameter {key!r}; its parameters are: {', '.join(spec)}.")
        default = spec[key]["default"]
        if not _type_ok(value, default):
            want = f"a non-empty list like {default!r}" if isinstance(default, list) else f"a {type(default).__name__} like {default!r}"
            if isinstance(value, str) and not isinstance(default, str):
                want += f" (on papermill's command line pass it as YAML: -y \"{key}: {default!r}\")"
            raise KVLabError(f"Lab {name}: parameter {key}={value!r} should be {want}.")
    params = {k: v["default"] for k, v in spec.items()} | given
    rules = RULES.get(name, {})
    require_positive(lab, **{k: params[k] for k in (*rules.get("positive", ()), *positive)})
    require_fraction(lab, **{k: params[k] for k in (*rules.get("fractions", ()), *fractions)})
    require_range(lab, **{k: (params[k], lo, hi) for k, (lo, hi) in rules.get("ranges", {}).items()})
    return params


def output_dir(lab: str, given: str = "") -> Path:
    """Where a lab writes: the given folder, or ``<build>/labs/<lab>``."""
    return Path(given).expanduser().resolve() if given else config.build_dir() / "labs" / Path(lab).stem


def require_positive(lab: str, **values: Any) -> None:
    """Refuse zero or negative numbers (or lists containing them), naming the lab and the parameter."""
    for key, value in values.items():
        items = value if isinstance(value, list) else [value]
        bad = [v for v in items if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0]
        if bad:
            raise KVLabError(f"Lab {Path(lab).stem}: parameter {key} must be positive, got {bad[0]!r}.")


def require_fraction(lab: str, **values: Any) -> None:
    """Refuse fractions outside [0, 1], naming the lab and the parameter."""
    for key, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
            raise KVLabError(f"Lab {Path(lab).stem}: parameter {key} must be a fraction between 0 and 1, got {value!r}.")


def require_range(lab: str, **values: tuple[Any, float, float]) -> None:
    """Refuse numbers outside [low, high]: ``require_range(lab, agent_tools=(value, 0, 13))``."""
    for key, (value, low, high) in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
            raise KVLabError(f"Lab {Path(lab).stem}: parameter {key} must be between {low} and {high}, got {value!r}.")
