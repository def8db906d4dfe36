"""A tiny task set with its own checks: what a change such as an fp8 KV cache does to answers."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from kvlab.runtime.config import REPO_ROOT
from kvlab.runtime.templates import chat_template

TASKS_FILE = REPO_ROOT / "data" / "tasks" / "kv_precision.json"


def load_tasks() -> list[dict[str, Any]]:
    """The fixed task set in ``data/tasks/kv_precision.json``."""
    return json.loads(TASKS_FILE.read_text())["tasks"]


def first_json_object(text: str) -> Any:
    """The first JSON object in ``text`` (models often wrap it in prose or a code fence), or None."""
    decoder = json.JSONDecoder()
    for start in (i for i, ch in enumerate(text) if ch == "{"):
        try:
            return decoder.raw_decode(text[start:])[0]
        except ValueError:
            continue
    return None


def passes(output: str, check: dict[str, Any]) -> bool:
    """Apply a task's own check: a word among ``contains_any``, or a JSON tool call with the right name and arguments."""
    if "contains_any" in check:
        return any(word in output for word in check["contains_any"])
    if "json_tool" in check:
        want = check["json_tool"]
        obj = first_json_object(output)
        return (isinstance(obj, dict) and obj.get("name") == want["name"] and isinstance(obj.get("arguments"), dict)
                and all(k in obj["arguments"] for k in want["arguments"]))
    raise ValueError(f"unknown check {check}")


def run_tasks(llm: Any, tasks: list[dict[str, Any]] | None = None, max_tokens: int = 64) -> pd.DataFrame:
    """Answer every task greedily in one batch; one row per task with its output and whether it passes."""
    from vllm import SamplingParams

    tasks = tasks or load_tasks()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    convs = [[{"role": "user", "content": t["prompt"]}] for t in tasks]
    outs = llm.chat(convs, params, use_tqdm=False, chat_template=chat_template(llm.get_tokenizer()))
    return pd.DataFrame([{"task": t["id"], "output": o.outputs[0].text.strip(), "passes": passes(o.outputs[0].text, t["check"])}
                         for t, o in zip(tasks, outs, strict=True)])


def compare_runs(base: pd.DataFrame, other: pd.DataFrame, base_name: str, other_name: str) -> pd.DataFrame:
    """Side by side: did the output change, and does each still pass its check?"""
    df = base.merge(other, on="task", suffixes=(f" ({base_name})", f" ({other_name})"))
    df["changed"] = df[f"output ({base_name})"] != df[f"output ({other_name})"]
    return df
