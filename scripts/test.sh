#!/usr/bin/env bash
# The tests: install (first time), then pytest against the real scripted provider, the real
# llama.cpp server, a throwaway PostgreSQL cluster and a local Ray cluster. Extra arguments go
# to pytest. --fast (first argument) runs the quick subset: no llama.cpp, PostgreSQL or Ray,
# nothing marked slow (docs/testing.md says what is in it).
# On a fresh machine it first installs the system packages the tests need (system_deps.sh:
# a compiler, Node and npm; for the full run also PostgreSQL 15 and Chromium), saying which.
set -euo pipefail
source "$(dirname "$0")/system_deps.sh"
if [ "${1:-}" = "--fast" ]; then
  system_deps build node
else
  system_deps build node postgres chromium
fi
source "$(dirname "$0")/bootstrap.sh"
source "$(dirname "$0")/mcp_servers.sh"   # the MCP servers tests/test_mcp.py starts (once; then ~10 ms)
cd "$ROOT"
# The suite starts many Python processes (pytest workers, the CLI, the scripted provider):
# let them share compiled bytecode (gitignored __pycache__ folders) instead of each compiling
# runner and the tests from source, as they do under PYTHONDONTWRITEBYTECODE.
unset PYTHONDONTWRITEBYTECODE
if [ "${1:-}" = "--fast" ]; then
  # Two pytest workers per core: most of the subset's time is spent waiting (on timers, retry
  # back-offs, servers and child processes), not computing; worksteal evens out the tail.
  shift
  exec python -m pytest -q -n "$(( 2 * $(nproc) ))" --dist worksteal \
    -m "not llama and not postgres and not ray and not slow" "$@"
fi
exec python -m pytest -q "$@"
