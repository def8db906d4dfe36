"""Shared fixtures: one real vLLM engine for the whole test session (engines are slow to start)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("KVLAB_QUICK", "1")


@pytest.fixture(scope="session")
def engine():
    """The default model in a real vLLM engine with KV Lab's settings (eager, 1 GiB KV on CPU)."""
    import kvlab

    llm = kvlab.make_engine(enforce_eager=True)
    yield llm
    kvlab.close_engine(llm)


@pytest.fixture(scope="session")
def second_model():
    """The second architecture (Qwen2 layout, random weights, made locally): the model most lab tests run, so one
    CI run per lab covers both the lab and the course beyond its own model (tests/test_second_model.py)."""
    from kvlab import model

    return model.prepare_second_model()


@pytest.fixture(scope="session")
def model_dir():
    """The prepared, verified default model folder."""
    import kvlab

    return kvlab.prepare_default_model()


def pytest_sessionfinish(session, exitstatus):
    """No vLLM server may outlive the tests or notebooks that started it: fail the run if one did."""
    from kvlab.serving import running_servers

    left = [p.pid for p in running_servers()]
    if left:
        print(f"\nvLLM server processes left running after the tests: {left}")
        session.exitstatus = 1
    import psutil

    ours = ("kvlab.gateway", "kvlab-redis-")  # the gateway's module; the Redis the course starts works in kvlab-redis-*
    others = [p.pid for p in psutil.process_iter(["cmdline"]) if any(m in " ".join(p.info["cmdline"] or []) for m in ours)]
    if others:
        print(f"\ngateway or Redis processes left running after the tests: {others}")
        session.exitstatus = 1
