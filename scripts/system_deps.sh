#!/usr/bin/env bash
# The machine's own packages the two README commands need, installed with apt-get when missing
# (with sudo when not root), each with a line saying what and why; what is present is skipped
# without a word, so on a set-up machine this is a no-op of a few milliseconds.
# Sourced by main.sh and test.sh: `system_deps PART...`, a part being
#   build     python3's venv module and a C/C++ compiler (bootstrap.sh compiles llama.cpp)
#   node      Node.js and npm (scripts/mcp_servers.sh installs the MCP servers tests/test_mcp.py starts)
#   postgres  PostgreSQL 15's binaries (the PostgresStore tests start a throwaway cluster)
#   chromium  Debian's chromium (the browser tests of tests/test_view.py)
# A machine without apt-get gets the list of what to install and the commands go on: the tests
# that need a missing part fail or skip saying so (docs/testing.md).
set -euo pipefail

_SYSTEM_DEPS_UPDATED=""

_system_deps_install() {  # _system_deps_install WHY PACKAGE...
  local why="$1"; shift
  echo "system deps: installing $* ($why)" >&2
  if ! command -v apt-get >/dev/null; then
    echo "system deps: no apt-get here: install $* yourself; going on without" >&2
    return 0
  fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null; then
      echo "system deps: not root and no sudo here: install $* yourself; going on without" >&2
      return 0
    fi
    sudo="sudo"
  fi
  local log
  log="$(mktemp)"
  if { [ -n "$_SYSTEM_DEPS_UPDATED" ] || $sudo apt-get update -qq; } >"$log" 2>&1 \
      && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >>"$log" 2>&1; then
    _SYSTEM_DEPS_UPDATED=1
    rm -f "$log"
    return 0
  fi
  echo "system deps: FAILED to install $*; last lines of apt-get:" >&2
  tail -n 15 "$log" >&2
  rm -f "$log"
  return 1
}

system_deps() {  # system_deps PART...: install each part that is missing
  local part
  for part in "$@"; do
    case "$part" in
      build)
        "${PYTHON:-python3}" -c 'import ensurepip, venv' 2>/dev/null \
          || _system_deps_install "python3 -m venv makes ./.venv" python3-venv
        { command -v cc && command -v c++ && command -v make; } >/dev/null \
          || _system_deps_install "llama-cpp-python compiles llama.cpp when runner is installed" build-essential
        ;;
      node)
        command -v npm >/dev/null \
          || _system_deps_install "the MCP servers tests/test_mcp.py starts are npm packages" nodejs npm
        ;;
      postgres)
        [ -x "${RUNNER_PG_BIN:-/usr/lib/postgresql/15/bin}/initdb" ] \
          || _system_deps_install "the PostgresStore tests start a throwaway PostgreSQL 15 cluster" postgresql-15
        ;;
      chromium)
        [ -x /usr/bin/chromium ] \
          || _system_deps_install "the browser tests of runner view drive a headless Chromium" chromium
        ;;
      *)
        echo "system deps: unknown part $part" >&2
        return 2
        ;;
    esac
  done
}
