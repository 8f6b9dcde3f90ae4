#!/usr/bin/env bash
# The tests: install (first time), then pytest against the real scripted provider, the real
# llama.cpp server, a throwaway PostgreSQL cluster and a local Ray cluster. Extra arguments go
# to pytest. --fast (first argument) runs the quick subset, one pytest worker per core: no
# llama.cpp, PostgreSQL or Ray, nothing marked slow.
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh"
cd "$ROOT"
if [ "${1:-}" = "--fast" ]; then
  shift
  exec python -m pytest -q -n "$(nproc)" -m "not llama and not postgres and not ray and not slow" "$@"
fi
exec python -m pytest -q "$@"
