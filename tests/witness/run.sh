#!/usr/bin/env bash
# run.sh - the second official driver's witness test: PyPI's pymongo against devmongod.
#
#   tests/witness/run.sh BUILD_DIR
#
# Installs the pinned pymongo into a virtual environment under BUILD_DIR/witness-venv (once;
# pip from PyPI, serialised by a lock so parallel runs share one), then runs
# pymongo_witness.py against the devmongod built in BUILD_DIR. Exits non-zero on any failure,
# including a failed install (the test never skips).
set -euo pipefail
BUILD=${1:?usage: run.sh BUILD_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=$BUILD/witness-venv
PYMONGO=$(cat "$HERE/pymongo.version")
(
  flock 9
  if ! "$VENV/bin/python" -c "import pymongo, sys; sys.exit(pymongo.version != '$PYMONGO')" 2>/dev/null; then
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "pymongo==$PYMONGO"
  fi
) 9>"$BUILD/witness-venv.lock"
exec "$VENV/bin/python" "$HERE/pymongo_witness.py" "$BUILD/tests/fixtures/devmongo/devmongod"
