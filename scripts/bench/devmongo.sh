#!/usr/bin/env bash
# devmongo.sh - devmongod throughput through libmongoc: ping round trips (the ceiling),
# single inserts, inserts in transactions, change-stream events read.
#
#   scripts/bench/devmongo.sh [PHASE_MS] [TXN_SIZE] [STREAM_EVENTS]     (defaults 2000 10 20000)
#
# Builds devmongod and the bench client in $OBX_BUILD_DIR (default build/), starts a private
# devmongod on a free port, prints a table, stops the server.
set -euo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_init devmongo
bench_build devmongod devmongo_bench
bench_start_mongo mongo
"$BUILD/tests/fixtures/devmongo/devmongo_bench" "$MONGO_URI" "$@"
