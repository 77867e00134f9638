#!/usr/bin/env bash
# pyenv.sh - the Python virtual environment of the test bed, made from tests/requirements.txt.
#
#   scripts/pyenv.sh          create or update it (only when the requirements changed); print its python
#
# The environment lives in $OBX_PYENV (default /var/tmp/obx-pyenv): created with the machine's
# python3 -m venv, filled with pip from PyPI, and stamped with the checksum of the requirements,
# so a second call is instant and a change of pins reinstalls. Prints the interpreter's path on
# stdout, for `PY=$(scripts/pyenv.sh)`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REQ=$ROOT/tests/requirements.txt
ENV_DIR=${OBX_PYENV:-/var/tmp/obx-pyenv}
log() { echo "pyenv.sh: $*" >&2; }

sum=$(cksum <"$REQ" | cut -d' ' -f1)
if [ ! -x "$ENV_DIR/bin/python" ] || [ "$(cat "$ENV_DIR/.requirements.sum" 2>/dev/null)" != "$sum" ]; then
  if ! python3 -m venv --help >/dev/null 2>&1; then
    log "python3 -m venv is missing (scripts/install-deps.sh installs python3-venv)"; exit 1
  fi
  log "installing $(grep -cv '^#' "$REQ") packages into $ENV_DIR"
  python3 -m venv "$ENV_DIR"
  "$ENV_DIR/bin/pip" install --quiet --disable-pip-version-check -r "$REQ" >&2
  echo "$sum" >"$ENV_DIR/.requirements.sum"
fi
echo "$ENV_DIR/bin/python"
