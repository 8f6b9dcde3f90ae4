#!/usr/bin/env bash
# The MCP servers the tests talk to, installed once into a cache outside the checkout
# ($RUNNER_MCP_SERVERS, default ~/.cache/runner/mcp): the npm ones with `npm --prefix`, the
# PyPI ones in a venv of their own there (they pin their own copy of the mcp SDK). Pinned
# versions; a stamp of them makes a second call a no-op (~10 ms). Tests never download a
# server (no npx -y, no uvx): they find these. Sourced or run; prints where they are.
set -euo pipefail
MCP_DIR="${RUNNER_MCP_SERVERS:-$HOME/.cache/runner/mcp}"
NPM_SERVERS="@modelcontextprotocol/server-filesystem@2026.8.31 @modelcontextprotocol/server-everything@2026.8.31"
PY_SERVERS="mcp-server-time==2026.10.19 mcp-server-git==2026.10.19"
want="$(printf '%s\n%s\n' "$NPM_SERVERS" "$PY_SERVERS" | sha256sum | cut -c1-16)"
stamp="$MCP_DIR/.installed"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  start=$SECONDS
  mkdir -p "$MCP_DIR"
  echo "mcp servers: installing into $MCP_DIR (npm: $NPM_SERVERS; PyPI: $PY_SERVERS)" >&2
  command -v npm >/dev/null || { echo "mcp servers: npm is needed (apt-get install nodejs npm)" >&2; exit 1; }
  # shellcheck disable=SC2086
  npm install --prefix "$MCP_DIR" --no-audit --no-fund --loglevel=error $NPM_SERVERS >/dev/null
  [ -x "$MCP_DIR/py/bin/python" ] || "${PYTHON:-python3}" -m venv "$MCP_DIR/py"
  # shellcheck disable=SC2086
  "$MCP_DIR/py/bin/python" -m pip install -q --disable-pip-version-check $PY_SERVERS
  echo "$want" > "$stamp"
  echo "mcp servers: done in $((SECONDS - start)) s" >&2
fi
export RUNNER_MCP_SERVERS="$MCP_DIR"
