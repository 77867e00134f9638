#!/usr/bin/env bash
# relay-sweep.sh - recovery of a PENDING backlog by the sweeper: does its rate hold as the backlog grows?
#
#   scripts/bench/relay-sweep.sh [SMALL] [LARGE]        (defaults 10000 1000000)
#
# Starts a private devmongod and a real Kafka broker (scripts/kafka.sh; topics of 6 partitions),
# builds scripts/bench/relay/relay_bench.c against libobx, then for each size N (SMALL is the
# baseline, LARGE is measured against it in the same run):
#  1. raw: a raw idempotent rdkafka producer sends the N records (what Kafka alone allows);
#  2. scan: N PENDING events (500 partition keys) and `outboxd --roles relay` with no checkpoint:
#     it opens the change stream and publishes the backlog with its full sweep (the recovery
#     after a lost history or a first start), timed until every event is PUBLISHED;
#  3. poll: the same backlog in another database, RELAY_MODE=poll (the sweeper is the relay).
# Rates are taken from the first event published (process start, lease and producer set-up left
# out; the raw producer's first record is acknowledged before its clock starts). The takeover
# (lease taken -> first event published: the held keys loaded, an earlier holder's claims
# released, the first batch claimed and acknowledged) is printed in seconds for each size.
# Prints events/s per size and LARGE / SMALL for each (the target is >= 0.9: the sweeper's cost
# per event does not grow with the backlog). Builds into $OBX_BUILD_DIR (default build/).
# Everything started here is stopped on exit.
set -euo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_init relay-sweep
SMALL=${1:-10000}
LARGE=${2:-1000000}

bench_build obx outboxd devmongod
BENCH="$WORK/relay_bench"
bench_cc "$BENCH" scripts/bench/relay/relay_bench.c
bench_start_mongo mongo --oplog-size 1000
bench_start_broker "raw-$SMALL:6" "raw-$LARGE:6" "scan-$SMALL:6" "scan-$LARGE:6" "poll-$SMALL:6" "poll-$LARGE:6"

# Runs outboxd --roles relay on database $1, topic $2 (extra environment after) until its N
# events are PUBLISHED; prints events/s from its first PUBLISHED event (start-up left out) and
# the takeover's seconds.
relay_drain() {
  local db=$1 topic=$2 n=$3 log="$WORK/relay-$1.log" pid rate
  shift 3
  env MONGO_URI="$MONGO_URI" MONGO_DB="$db" KAFKA_BROKERS="$BOOTSTRAP" KAFKA_TOPIC="$topic" HTTP_PORT=0 \
    HTTP_BIND=127.0.0.1 LOG_LEVEL=info "$@" "$BUILD/outboxd" --roles relay >"$log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  rate=$("$BENCH" rate "$MONGO_URI" "$db" "$n" 3600)
  kill -TERM "$pid"; wait "$pid" || true
  echo "$rate"
}

echo "relay-sweep.sh: $SMALL and $LARGE PENDING events, 500 keys, 6 partitions ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
declare -A R
for n in "$SMALL" "$LARGE"; do
  s0=$(date +%s)
  "$BENCH" preload "$MONGO_URI" "scan_$n" "$n" 500
  "$BENCH" preload "$MONGO_URI" "poll_$n" "$n" 500
  echo "  preloaded 2 x $n events in $(($(date +%s) - s0)) s" >&2
  R[raw_$n]=$(echo "$n $("$BENCH" produce "$BOOTSTRAP" "raw-$n" "$MONGO_URI" "scan_$n" "$n")" | awk '{print $1 / $2}')
  read -r R[scan_$n] R[scan_take_$n] <<<"$(relay_drain "scan_$n" "scan-$n" "$n")"
  read -r R[poll_$n] R[poll_take_$n] <<<"$(relay_drain "poll_$n" "poll-$n" "$n" RELAY_MODE=poll)"
done

awk -v s="$SMALL" -v l="$LARGE" -v rs="${R[raw_$SMALL]}" -v rl="${R[raw_$LARGE]}" \
    -v ss="${R[scan_$SMALL]}" -v sl="${R[scan_$LARGE]}" -v ps="${R[poll_$SMALL]}" -v pl="${R[poll_$LARGE]}" \
    -v ts="${R[scan_take_$SMALL]}" -v tl="${R[scan_take_$LARGE]}" -v us="${R[poll_take_$SMALL]}" \
    -v ul="${R[poll_take_$LARGE]}" 'BEGIN {
  printf "\nrecovery of a PENDING backlog      events/s at %-9d events/s at %-9d  large / small\n", s, l
  printf "  raw idempotent producer        %12.0f          %12.0f          %6.2f\n", rs, rl, rl / rs
  printf "  stream relay, full sweep       %12.0f          %12.0f          %6.2f   (target >= 0.90)\n", ss, sl, sl / ss
  printf "  poll relay (sweep only)        %12.0f          %12.0f          %6.2f   (target >= 0.90)\n", ps, pl, pl / ps
  printf "  full sweep / raw producer      %12.2f          %12.2f\n", ss / rs, sl / rl
  printf "\ntakeover: lease taken -> first event published, s\n"
  printf "  stream relay                   %12.3f          %12.3f\n", ts, tl
  printf "  poll relay                     %12.3f          %12.3f\n", us, ul
}'
