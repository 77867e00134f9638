#!/usr/bin/env bash
# relay-buckets.sh - drain rate with 1, 2 and 4 relays sharing RELAY_BUCKETS over a Kafka with latency
#
#   scripts/bench/relay-buckets.sh [EVENTS] [RTT_MS] [BUCKETS]          (defaults 20000 20 4)
#
# Starts a private devmongod and kafka-mockd (topics of 12 partitions) with RTT_MS of added
# round-trip time on every request (kafka-mockd's `rtt all`), builds
# scripts/bench/relay/relay_bench.c against libobx, then for each configuration:
#  1. preloads EVENTS outbox events (500 partition keys), each with its bucket, after a
#     recorded resume token, which becomes every bucket's checkpoint;
#  2. starts the relays (`outboxd --roles relay`, RELAY_BUCKETS, a 2 s lease) at once; they
#     share the buckets (src/relay/buckets.c) and drain the events through their change streams;
#  3. times from the first PUBLISHED event until none is PENDING (process start left out; the
#     share-out of the buckets at start is in it).
# Configurations: one relay with one bucket (a relay before buckets), then 1, 2 and 4 relays over
# BUCKETS buckets. Prints events/s and the ratios to one relay over BUCKETS buckets and to one
# relay with one bucket. Builds into $OBX_BUILD_DIR (default build/). Everything started here is
# stopped on exit.
set -euo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_init relay-buckets
EVENTS=${1:-20000}
RTT=${2:-20}
BUCKETS=${3:-4}

bench_build obx outboxd devmongod kafka-mockd
BENCH="$WORK/relay_bench"
bench_cc "$BENCH" scripts/bench/relay/relay_bench.c
bench_start_mongo mongo --oplog-size $((EVENTS * 10 + 100000))
bench_start_kafka one:12 r1:12 r2:12 r4:12
bench_kafka_cmd "rtt all $RTT"

# drain DB TOPIC RELAYS BUCKETS: prints the events/s of RELAYS relays draining EVENTS events.
drain() {
  local db=$1 topic=$2 relays=$3 buckets=$4 token pids=() rate
  token=$("$BENCH" token "$MONGO_URI" "$db")
  "$BENCH" preload "$MONGO_URI" "$db" "$EVENTS" 500 "$buckets"
  "$BENCH" checkpoint "$MONGO_URI" "$db" "$token" "$buckets"
  for r in $(seq "$relays"); do
    env MONGO_URI="$MONGO_URI" MONGO_DB="$db" KAFKA_BROKERS="$BOOTSTRAP" KAFKA_TOPIC="$topic" HTTP_PORT=0 \
      HTTP_BIND=127.0.0.1 LOG_LEVEL=info RELAY_BUCKETS="$buckets" RELAY_LEASE=2s \
      "$BUILD/outboxd" --roles relay >"$WORK/relay-$db-$r.log" 2>&1 &
    pids+=($!)
    PIDS+=($!)
  done
  rate=$("$BENCH" rate "$MONGO_URI" "$db" "$EVENTS" 600)
  kill -TERM "${pids[@]}"
  wait "${pids[@]}" || true
  echo "$rate"
}

echo "relay-buckets.sh: $EVENTS events, 500 keys, 12 partitions, kafka-mockd with $RTT ms rtt ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
ONE=$(drain one one 1 1)
R1=$(drain r1 r1 1 "$BUCKETS")
R2=$(drain r2 r2 2 "$BUCKETS")
R4=$(drain r4 r4 4 "$BUCKETS")

awk -v n="$EVENTS" -v b="$BUCKETS" -v rtt="$RTT" -v one="$ONE" -v r1="$R1" -v r2="$R2" -v r4="$R4" 'BEGIN {
  printf "\ndrain of %d events, %d ms rtt        relays  buckets   events/s   / 1 relay   / 1 relay, 1 bucket\n", n, rtt
  printf "  one relay, one bucket              %6d  %7d  %9.0f   %9s   %9.2f\n", 1, 1, one, "", 1
  printf "  relays sharing the buckets         %6d  %7d  %9.0f   %9.2f   %9.2f\n", 1, b, r1, 1, r1 / one
  printf "                                     %6d  %7d  %9.0f   %9.2f   %9.2f\n", 2, b, r2, r2 / r1, r2 / one
  printf "                                     %6d  %7d  %9.0f   %9.2f   %9.2f\n", 4, b, r4, r4 / r1, r4 / one
}'
