#!/usr/bin/env bash
# Create ./.venv and install runner with its test tools, once. Sourced by main.sh and test.sh.
# llama-cpp-python compiles llama.cpp on first install: about 3-5 minutes on 2 cores, so the
# install prints a line every 20 s and, on failure, the tail of its log.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RUNNER_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
stamp="$VENV/.runner-installed"
# llama.cpp is compiled for this CPU (-march=native), except on a CPU with AMX: ggml's AMX
# matrix kernels end in a general protection fault where the kernel does not grant the tile
# state (seen on this kind of machine: every prompt of more than one token crashed the
# process), so there the build names the CPU's instruction sets itself, AMX left out.
if [ "$(uname -m)" = x86_64 ] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null && [ -z "${CMAKE_ARGS:-}" ]; then
  export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  for flag in AVX512:avx512f AVX512_VBMI:avx512vbmi AVX512_VNNI:avx512_vnni AVX512_BF16:avx512_bf16 AVX_VNNI:avx_vnni; do
    grep -qw "${flag#*:}" /proc/cpuinfo && CMAKE_ARGS="$CMAKE_ARGS -DGGML_${flag%%:*}=ON"
  done
fi
want="$(cat "$ROOT/pyproject.toml" <(echo "${CMAKE_ARGS:-}") | sha256sum | cut -c1-16)"

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
  # pip reuses a wheel it built before whatever the flags: a build that cannot evaluate a prompt
  # (AMX, above) is dropped from pip's cache and made again from source (the new one is cached).
  # (the subshell waits for the check itself, so a crash's "Segmentation fault" line goes to /dev/null too)
  if ! ( "$VENV/bin/python" "$ROOT/scripts/llama_smoke.py"; status=$?; exit "$status" ) >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip cache remove 'llama_cpp_python*' >/dev/null 2>&1 || true
    _bootstrap_step "rebuilding llama.cpp (${CMAKE_ARGS:-native}): the installed build crashed on a prompt" \
      "$VENV/bin/python" -m pip install --force-reinstall --no-deps \
      "$(grep -o 'llama-cpp-python==[0-9.]*' "$ROOT/pyproject.toml")"
    "$VENV/bin/python" "$ROOT/scripts/llama_smoke.py" >&2
  fi
  echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
