#!/usr/bin/env bash
# The one command for a lent GPU machine (bare, offline): install the wheels `make device-wheels` put in
# .device-wheels (carried with the call) into a folder of their own, then run gpu_check.py, whose JSON
# and log land in $OUT. Arguments go to gpu_check.py. The device-stack test runs this same file with
# PYTHON, WHEELS and SITE pointing at its own venv and wheels, and --dry-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.device-wheels}
SITE=${SITE:-$(mktemp -d -t rlcode-device-site.XXXXXX)}
ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "no wheels in $WHEELS: run \`make device-wheels\` here and carry .device-wheels" >&2; exit 2; }
started=$(date +%s)
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
    --upgrade --target "$SITE" "$WHEELS"/*.whl
echo "installed $(ls "$WHEELS"/*.whl | wc -l) carried wheels into $SITE in $(( $(date +%s) - started )) s"
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=disabled
exec "$PYTHON" benchmarks/gpu_check.py "$@"
