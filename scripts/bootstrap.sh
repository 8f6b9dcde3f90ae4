#!/usr/bin/env bash
# Create ./.venv and install runner with its test tools, once. Sourced by main.sh and test.sh.
# llama-cpp-python compiles llama.cpp on first install: about 3-5 minutes on 2 cores, so the
# install prints a line every 20 s and, on failure, the tail of its log.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RUNNER_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
stamp="$VENV/.runner-installed"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"

_bootstrap_step() {  # _bootstrap_step LABEL CMD...: run CMD with a heartbeat, log to a file
  local label="$1"; shift
  local log="$VENV/install.log" start=$SECONDS next=20 pid
  echo "bootstrap: $label" >&2
  "$@" >>"$log" 2>&1 & pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 2
    if (( SECONDS - start >= next )) && kill -0 "$pid" 2>/dev/null; then
      next=$((next + 20))
      echo "bootstrap:   ... still at it, $((SECONDS - start)) s ($(tail -c 200 "$log" | tr '\r\n' '  ' | grep -o '[^ ].\{0,60\}$' || true))" >&2
    fi
  done
  if ! wait "$pid"; then
    echo "bootstrap: FAILED after $((SECONDS - start)) s: $label; last lines of $log:" >&2
    tail -n 25 "$log" >&2
    return 1
  fi
  echo "bootstrap:   done in $((SECONDS - start)) s" >&2
}

if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
  _bootstrap_step "upgrading pip" "$VENV/bin/python" -m pip install --upgrade pip
  _bootstrap_step "installing runner (the first time compiles llama.cpp: 3-5 min)" \
    "$VENV/bin/python" -m pip install -e "$ROOT[dev]"
  echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
