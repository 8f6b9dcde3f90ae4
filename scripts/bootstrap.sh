#!/usr/bin/env bash
# Create ./.venv and install runner with its test tools, once. Sourced by main.sh and test.sh.
# llama-cpp-python compiles llama.cpp on first install: about 3-5 minutes on 2 cores.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RUNNER_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
stamp="$VENV/.runner-installed"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing runner and its dependencies (first time compiles llama.cpp)" >&2
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[dev]"
  echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
