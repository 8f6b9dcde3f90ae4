#!/usr/bin/env bash
# The tests: install (first time), then pytest against the real scripted provider and the
# real llama.cpp server on the packaged SmolLM2 model. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh"
cd "$ROOT"
exec python -m pytest -q "$@"
