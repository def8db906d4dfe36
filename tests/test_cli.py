import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "kvlab", *args], capture_output=True, text=True, timeout=300)


def test_env_prints_the_report():
    res = run("env")
    assert res.returncode == 0, res.stderr
    for key in ("python", "torch", "vllm", "cores usable", "memory total", "quick mode"):
        assert key in res.stdout


def test_prepare_model_twice_does_nothing_the_second_time(model_dir):
    res = run("prepare-model")
    assert res.returncode == 0 and "already prepared" in res.stdout
