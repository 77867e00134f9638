#!/usr/bin/env bash
# devmongo.sh - devmongod throughput through libmongoc: ping round trips (the ceiling),
# single inserts, inserts in transactions, change-stream events read.
#
#   scripts/bench/devmongo.sh [PHASE_MS] [TXN_SIZE] [STREAM_EVENTS]     (defaults 2000 10 20000)
#
# Builds devmongod and the bench client in $OBX_BUILD_DIR (default build/), starts a private
# devmongod on a free port, prints a table, stops the server.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${OBX_BUILD_DIR:-$PWD/build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" --target devmongod devmongo_bench -j "$(nproc)" >/dev/null
PORT_FILE=$(mktemp /tmp/devmongo-bench.XXXXXX)
rm -f "$PORT_FILE"
"$BUILD/tests/fixtures/devmongo/devmongod" --port 0 --port-file "$PORT_FILE" >/dev/null &
PID=$!
trap 'kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; rm -f "$PORT_FILE"' EXIT
for _ in $(seq 1 200); do [ -s "$PORT_FILE" ] && break; sleep 0.05; done
[ -s "$PORT_FILE" ] || { echo "devmongod did not start" >&2; exit 1; }
PORT=$(cat "$PORT_FILE")
"$BUILD/tests/fixtures/devmongo/devmongo_bench" "mongodb://127.0.0.1:$PORT/?replicaSet=rs0" "$@"
