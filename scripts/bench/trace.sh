#!/usr/bin/env bash
# trace.sh - does span export slow the event path? orders.sh with the OTLP collector up, down
# and hung, side by side
#
#   scripts/bench/trace.sh [SECONDS] [CONNECTIONS] [ROUNDS]      (defaults: 10 s, 16, 2)
#
# Runs scripts/bench/orders.sh (POST /orders through outboxd: a server span and a MongoDB
# transaction span per order, next to the same transaction through libmongoc as the run's own
# baseline) in ROUNDS rounds of four, each starting one condition later (load drifts hit all):
# without tracing (no OTEL_* variables), with the collector up
# (otlp_sink.c answering 200 at once), down (OTEL_EXPORTER_OTLP_ENDPOINT on a closed port:
# connection refused) and hung (accepts, answers after 60 s: every export waits out the 10 s
# timeout). Prints orders/s, p50/p99 and HTTP/direct per run, the ratios of the medians against
# "up", and the spans the collector received. Builds into $OBX_BUILD_DIR (default build/).
set -euo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_init trace
SECONDS_RUN=${1:-10}
CONNS=${2:-16}
ROUNDS=${3:-2}

# shellcheck disable=SC2046
cc -O2 -D_GNU_SOURCE -o "$WORK/otlp_sink" scripts/bench/otlp_sink.c $(pkg-config --cflags --libs libmicrohttpd) -lpthread
"$WORK/otlp_sink" "$WORK/up.port" >"$WORK/up.out" &
UP_PID=$!
PIDS+=("$UP_PID")
"$WORK/otlp_sink" "$WORK/hung.port" 60000 >"$WORK/hung.out" &
PIDS+=($!)
wait_for test -s "$WORK/up.port"
wait_for test -s "$WORK/hung.port"

# run NAME [VAR=VALUE...]: one orders.sh with those variables; its table in $WORK/NAME.txt.
run() {
  local name=$1
  shift
  echo "trace.sh: $name (load $(cut -d' ' -f1 /proc/loadavg))"
  env "$@" OTEL_SERVICE_NAME=outboxd-bench scripts/bench/orders.sh "$SECONDS_RUN" "$CONNS" >"$WORK/$name.txt"
}
CONDITIONS=(up down hung off)
declare -A ENV=([up]="OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$(head -1 "$WORK/up.port")"
  [down]="OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1"
  [hung]="OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$(head -1 "$WORK/hung.port")"
  [off]="OTEL_SDK_DISABLED=true")
for r in $(seq "$ROUNDS"); do # each round starts one condition later: a load drift hits all alike
  for i in 0 1 2 3; do
    c=${CONDITIONS[$(((i + r - 1) % 4))]}
    run "$c.$r" "${ENV[$c]}"
  done
done
kill -TERM "$UP_PID"
wait "$UP_PID" || true
UP_SPANS=$(sed -n 's/.*spans=\([0-9]*\).*/\1/p' "$WORK/up.out")

# field NAME ROW COLUMN: a number from the orders.sh table of run NAME.
field() { awk -v row="$2" -v col="$3" 'index($0, row) == 1 { n = split(substr($0, 23), f, " "); print f[col] }' "$WORK/$1.txt"; }
ratio() { sed -n 's/^ratio HTTP\/direct: //p' "$WORK/$1.txt"; }

printf '\nPOST /orders with span export (%ss, %s connections; direct = the same transaction via libmongoc, same run)\n' \
  "$SECONDS_RUN" "$CONNS"
printf '%-12s %12s %8s %8s %14s %12s\n' "collector" "HTTP ord/s" "p50 ms" "p99 ms" "direct ord/s" "HTTP/direct"
for c in "${CONDITIONS[@]}"; do
  for r in $(seq "$ROUNDS"); do
    printf '%-12s %12s %8s %8s %14s %12s\n' "$c.$r" "$(field "$c.$r" "HTTP (" 1)" "$(field "$c.$r" "HTTP (" 2)" \
      "$(field "$c.$r" "HTTP (" 3)" "$(field "$c.$r" "direct (" 1)" "$(ratio "$c.$r")"
  done
done
# median CONDITION WHAT: the median over the rounds of orders/s ("rps") or of HTTP/direct ("ratio").
median() {
  for r in $(seq "$ROUNDS"); do if [ "$2" = rps ]; then field "$1.$r" "HTTP (" 1; else ratio "$1.$r"; fi; done |
    sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
for c in down hung off; do
  awk -v n="$c" -v a="$(median "$c" rps)" -v b="$(median up rps)" -v ra="$(median "$c" ratio)" \
    -v rb="$(median up ratio)" 'BEGIN { if (b > 0 && rb > 0) printf "median ratio %s/up: orders/s %.2f, HTTP/direct %.2f\n", n, a / b, ra / rb }'
done
echo "spans received by the collector in the 'up' run: ${UP_SPANS:-0}"
