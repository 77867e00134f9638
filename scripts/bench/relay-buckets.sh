#!/usr/bin/env bash
# relay-buckets.sh - drain rate with 1, 2 and 4 relays sharing RELAY_BUCKETS over a Kafka with latency
#
#   scripts/bench/relay-buckets.sh [EVENTS] [RTT_MS] [BUCKETS] [KEYS] [RUNS]   (defaults 20000 200 4 5000 3)
#
# Starts a private devmongod and kafka-mockd (topics of 12 partitions) with RTT_MS of added
# round-trip time on every request (kafka-mockd's `rtt all`), builds
# scripts/bench/relay/relay_bench.c against libobx, then for each configuration:
#  1. starts the relays (`outboxd --roles relay`, RELAY_BUCKETS, a 2 s lease) at once on an
#     empty outbox and waits until they hold a fair share of the buckets each (src/relay/buckets.c);
#  2. inserts EVENTS outbox events (KEYS partition keys, batches of 1000), each with its bucket,
#     which the relays drain through their change streams as they come;
#  3. times from the first PUBLISHED event until none is PENDING (the insert of 20,000 events
#     takes well under the drain; process start and the share-out left out).
# Configurations: one relay with one bucket (a relay before buckets), then 1, 2 and 4 relays over
# BUCKETS buckets, each run RUNS times (the best counts). Prints events/s and the ratios to one relay over BUCKETS buckets and to one
# relay with one bucket. Builds into $OBX_BUILD_DIR (default build/). Everything started here is
# stopped on exit.
set -euo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_init relay-buckets
EVENTS=${1:-20000}
RTT=${2:-200}
BUCKETS=${3:-4}
KEYS=${4:-5000}
RUNS=${5:-3}

bench_build obx outboxd devmongod kafka-mockd
BENCH="$WORK/relay_bench"
bench_cc "$BENCH" scripts/bench/relay/relay_bench.c
bench_start_mongo mongo --oplog-size $((EVENTS * 10 + 100000))
bench_start_kafka one:12 r1:12 r2:12 r4:12 # each run of a configuration its own database, one topic
bench_kafka_cmd "rtt all $RTT"

# drain DB TOPIC RELAYS BUCKETS: prints the events/s of RELAYS relays draining EVENTS events.
drain() {
  local db=$1 topic=$2 relays=$3 buckets=$4 pids=() rate
  for r in $(seq "$relays"); do
    env MONGO_URI="$MONGO_URI" MONGO_DB="$db" KAFKA_BROKERS="$BOOTSTRAP" KAFKA_TOPIC="$topic" HTTP_PORT=0 \
      HTTP_BIND=127.0.0.1 LOG_LEVEL=info RELAY_BUCKETS="$buckets" RELAY_LEASE=2s \
      "$BUILD/outboxd" --roles relay >"$WORK/relay-$db-$r.log" 2>&1 &
    pids+=($!)
    PIDS+=($!)
  done
  "$BENCH" shares "$MONGO_URI" "$db" "$relays" "$buckets" 60 >/dev/null
  "$BENCH" rate "$MONGO_URI" "$db" "$EVENTS" 600 >"$WORK/rate-$db" &
  local timer=$!
  "$BENCH" preload "$MONGO_URI" "$db" "$EVENTS" "$KEYS" "$buckets"
  wait "$timer"
  rate=$(cat "$WORK/rate-$db")
  kill -TERM "${pids[@]}"
  wait "${pids[@]}" || true
  echo "$rate"
}

echo "relay-buckets.sh: $EVENTS events, $KEYS keys, 12 partitions, kafka-mockd with $RTT ms rtt ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
# best of RUNS runs of each configuration, the configurations interleaved (2 shared cores: the
# noise of other work hits every configuration alike)
declare -A BEST
for run in $(seq "$RUNS"); do
  for cfg in "one 1 1" "r1 1 $BUCKETS" "r2 2 $BUCKETS" "r4 4 $BUCKETS"; do
    read -r name relays buckets <<<"$cfg"
    rate=$(drain "${name}_$run" "$name" "$relays" "$buckets")
    echo "  run $run: $relays relay(s), $buckets bucket(s): $rate events/s" >&2
    BEST[$name]=$(echo "${BEST[$name]:-0} $rate" | awk '{print ($2 > $1 ? $2 : $1)}')
  done
done
ONE=${BEST[one]}
R1=${BEST[r1]}
R2=${BEST[r2]}
R4=${BEST[r4]}

awk -v n="$EVENTS" -v runs="$RUNS" -v b="$BUCKETS" -v rtt="$RTT" -v one="$ONE" -v r1="$R1" -v r2="$R2" -v r4="$R4" 'BEGIN {
  printf "\ndrain of %d events over kafka-mockd with %d ms rtt, best of %d runs\n", n, rtt, runs
  printf "                                     relays  buckets   events/s   / 1 relay   / 1 relay, 1 bucket\n"
  printf "  one relay, one bucket              %6d  %7d  %9.0f   %9s   %9.2f\n", 1, 1, one, "", 1
  printf "  relays sharing the buckets         %6d  %7d  %9.0f   %9.2f   %9.2f\n", 1, b, r1, 1, r1 / one
  printf "                                     %6d  %7d  %9.0f   %9.2f   %9.2f\n", 2, b, r2, r2 / r1, r2 / one
  printf "                                     %6d  %7d  %9.0f   %9.2f   %9.2f\n", 4, b, r4, r4 / r1, r4 / one
}'
