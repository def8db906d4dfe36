#!/usr/bin/env bash
# Debian's Chromium for the real-browser test (tests/test_browser.py), installed only when missing.
# Needs root and apt-get; elsewhere it says so and the browser test skips with that reason.
set -uo pipefail
if [[ -n ${KVLAB_CHROMIUM:-} ]] || command -v chromium >/dev/null 2>&1; then
  echo "browser: $(${KVLAB_CHROMIUM:-chromium} --version 2>/dev/null | head -1)"
  exit 0
fi
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
  echo "browser: installing Debian's chromium for the browser test (about a minute)…"
  export DEBIAN_FRONTEND=noninteractive
  if apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null; then
    echo "browser: $(chromium --version | head -1)"
    exit 0
  fi
fi
echo "browser: no Chromium and it could not be installed (needs root and apt-get); the browser test will be skipped." >&2
exit 0
