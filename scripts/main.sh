#!/usr/bin/env bash
# The main job: install (first time), then run the six-task suite on the scripted provider
# and the local model side by side. Extra arguments go to `runner suite`.
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh"
cd "$ROOT"
exec runner suite "$@"
