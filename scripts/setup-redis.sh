#!/usr/bin/env bash
# Debian's redis-server for the gateway's response cache (kvlab/gateway.py), installed only when missing. The course
# starts its own Redis on 127.0.0.1 and a free port, without persistence, and stops it (kvlab/redis_server.py): the
# package's system service is kept from starting (policy-rc.d), so nothing listens that the course did not start.
# Needs root and apt-get; elsewhere it says so and the gateway's tests skip with that reason.
set -uo pipefail
if command -v redis-server >/dev/null 2>&1; then
  echo "redis: $(redis-server --version | head -1)"
  exit 0
fi
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
  echo "redis: installing Debian's redis-server for the gateway's response cache (under a minute)…"
  export DEBIAN_FRONTEND=noninteractive
  policy=/usr/sbin/policy-rc.d
  made_policy=0
  if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made_policy=1; fi
  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  ok=$?
  [[ $made_policy == 1 ]] && rm -f "$policy"
  if [[ $ok == 0 ]] && command -v redis-server >/dev/null 2>&1; then
    echo "redis: $(redis-server --version | head -1)"
    exit 0
  fi
fi
echo "redis: no redis-server and it could not be installed (needs root and apt-get); the gateway's tests will be skipped." >&2
exit 0
