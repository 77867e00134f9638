#!/usr/bin/env bash
# devmongo.sh - devmongod throughput through libmongoc, before and after: ping round trips (the
# ceiling), single inserts, inserts in transactions, change-stream events read, and a ranged
# query with a sort on a large collection through a secondary index and by _id.
#
#   scripts/bench/devmongo.sh [PHASE_MS] [TXN_SIZE] [STREAM_EVENTS] [RANGE_DOCS] [ROUNDS]
#                              (defaults 2000 10 20000 1000000 2)
#
# "before" is devmongod built from DEVMONGO_BENCH_BASE (default b1a7d85, main before the query
# planner) in a temp dir, "after" the one in $OBX_BUILD_DIR (default build/). The same bench
# client drives both, alternately ROUNDS times each (a private server per run), so load on the
# machine hits both alike; the table has every run and after/before of the medians.
set -euo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_init devmongo
PHASE_MS=${1:-2000}
TXN_SIZE=${2:-10}
STREAM_EVENTS=${3:-20000}
RANGE_DOCS=${4:-1000000}
ROUNDS=${5:-2}
BASE=${DEVMONGO_BENCH_BASE:-b1a7d85}
bench_build devmongod devmongo_bench

# the baseline server: its sources at BASE, compiled as the project compiles them
mkdir -p "$WORK/base"
git -C "$ROOT" archive "$BASE" tests/fixtures/devmongo | tar -x -C "$WORK/base"
# shellcheck disable=SC2046
cc -O2 -g -std=gnu11 -D_GNU_SOURCE -I "$WORK/base/tests/fixtures/devmongo" -o "$WORK/devmongod-base" \
  "$WORK/base/tests/fixtures/devmongo/"*.c $(pkg-config --cflags --libs libbson-1.0) -lm

run_one() { # run_one LABEL SERVER
  local name=$1 server=$2
  "$server" --port 0 --port-file "$WORK/$name.port" >"$WORK/$name.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  wait_for test -s "$WORK/$name.port"
  "$BUILD/tests/fixtures/devmongo/devmongo_bench" "mongodb://127.0.0.1:$(head -1 "$WORK/$name.port")/?replicaSet=rs0" \
    "$PHASE_MS" "$TXN_SIZE" "$STREAM_EVENTS" "$RANGE_DOCS" >"$WORK/$name.tsv"
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
}

for r in $(seq "$ROUNDS"); do
  run_one "before$r" "$WORK/devmongod-base"
  run_one "after$r" "$BUILD/tests/fixtures/devmongo/devmongod"
done

echo "devmongod before ($BASE) and after ($(git -C "$ROOT" rev-parse --short HEAD)); phases ${PHASE_MS} ms, $RANGE_DOCS documents for the range queries"
awk -F'\t' -v rounds="$ROUNDS" '
  function median(s,   v, cnt, x, y, tmp) { # locals named apart from the globals (mawk)
    cnt = split(s, v, " ")
    for (x = 1; x <= cnt; x++) for (y = x + 1; y <= cnt; y++) if (v[y] + 0 < v[x] + 0) { tmp = v[x]; v[x] = v[y]; v[y] = tmp }
    return cnt % 2 ? v[(cnt + 1) / 2] : (v[cnt / 2] + v[cnt / 2 + 1]) / 2
  }
  FNR == 1 { np = split(FILENAME, p, "/"); side = p[np] ~ /^before/ ? "before" : "after" }
  {
    if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 }
    vals[$1, side] = vals[$1, side] (vals[$1, side] == "" ? "" : " ") $2
  }
  END {
    printf "%-48s %-24s %-24s %12s\n", "measure", "before (runs)", "after (runs)", "after/before"
    for (i = 1; i <= n; i++) {
      m = order[i]; b = median(vals[m, "before"]); a = median(vals[m, "after"])
      printf "%-48s %-24s %-24s %12.2f\n", m, vals[m, "before"], vals[m, "after"], (b > 0 ? a / b : 0)
    }
  }' $(for r in $(seq "$ROUNDS"); do echo "$WORK/before$r.tsv" "$WORK/after$r.tsv"; done)
