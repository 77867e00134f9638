#!/usr/bin/env bash
# relay.sh - relay drain rate next to raw baselines, and commit-to-ack latency vs polling
#
#   scripts/bench/relay.sh [EVENTS] [RATE] [SECONDS]        (defaults 20000 20 15)
#
# Starts a private devmongod and kafka-mockd (topics of 6 partitions), builds
# scripts/bench/relay/relay_bench.c against libobx, then:
#  1. preloads EVENTS outbox events (500 partition keys) after a recorded resume token;
#  2. drain: (a) a raw libmongoc change-stream reader reading those EVENTS changes,
#     (b) a raw idempotent rdkafka producer sending the same key/payload records,
#     (c) `outboxd --roles relay` resuming from that token until every event is PUBLISHED
#         (read, CloudEvents record, Kafka ack, outbox update, checkpoint);
#  3. latency: RATE events/s, one insert each, for SECONDS, through the stream relay and then
#     through RELAY_MODE=poll with the seed's 2000 ms / batch 50; p50/p99 of
#     publishedAt - occurredAt (commit to acknowledged-and-recorded).
# Prints one table with the ratios. Builds into $OBX_BUILD_DIR (default build/). Everything
# started here is stopped on exit.
set -euo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_init relay
EVENTS=${1:-20000}
RATE=${2:-20}
SECONDS_LOAD=${3:-15}

bench_build obx outboxd devmongod kafka-mockd
BENCH="$WORK/relay_bench"
bench_cc "$BENCH" scripts/bench/relay/relay_bench.c
bench_start_mongo mongo --oplog-size $((EVENTS * 2 + 100000))
bench_start_kafka relay:6 raw:6 stream:6 poll:6

# Runs outboxd --roles relay on database $1, topic $2, extra environment after; waits until it
# leads (and, in stream mode, finished its first scan). Sets RELAY_PID.
relay_start() {
  local db=$1 topic=$2 log="$WORK/relay-$1.log"
  shift 2
  env MONGO_URI="$MONGO_URI" MONGO_DB="$db" KAFKA_BROKERS="$BOOTSTRAP" KAFKA_TOPIC="$topic" HTTP_PORT=0 \
    HTTP_BIND=127.0.0.1 LOG_LEVEL=info "$@" "$BUILD/outboxd" --roles relay >"$log" 2>&1 &
  RELAY_PID=$!
  PIDS+=("$RELAY_PID")
  wait_for grep -q "relay is the leader" "$log"
}

echo "relay.sh: $EVENTS events, 500 keys, 6 partitions ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"

# ---- drain ----
TOKEN=$("$BENCH" token "$MONGO_URI" drain)
"$BENCH" preload "$MONGO_URI" drain "$EVENTS" 500
T_STREAM=$("$BENCH" stream "$MONGO_URI" drain "$EVENTS" "$TOKEN")
T_PRODUCE=$("$BENCH" produce "$BOOTSTRAP" raw "$MONGO_URI" drain "$EVENTS")
"$BENCH" checkpoint "$MONGO_URI" drain "$TOKEN"
T0=$(date +%s.%N)
relay_start drain relay
T_RELAY=$("$BENCH" wait "$MONGO_URI" drain "$EVENTS" 600)
T_RELAY=$(echo "$T_RELAY $(date +%s.%N) $T0" | awk '{print $2 - $3}') # includes process start
kill -TERM "$RELAY_PID"; wait "$RELAY_PID" || true

# ---- latency under a steady load ----
relay_start steady_stream stream
wait_for grep -q "full scan" "$WORK/relay-steady_stream.log"
read -r S50 S99 SN <<<"$("$BENCH" steady "$MONGO_URI" steady_stream "$RATE" "$SECONDS_LOAD" 50)"
kill -TERM "$RELAY_PID"; wait "$RELAY_PID" || true
relay_start steady_poll poll RELAY_MODE=poll OUTBOX_POLL_INTERVAL_MS=2000 OUTBOX_BATCH_SIZE=50
read -r P50 P99 PN <<<"$("$BENCH" steady "$MONGO_URI" steady_poll "$RATE" "$SECONDS_LOAD" 50)"
kill -TERM "$RELAY_PID"; wait "$RELAY_PID" || true

awk -v n="$EVENTS" -v ts="$T_STREAM" -v tp="$T_PRODUCE" -v tr="$T_RELAY" \
    -v s50="$S50" -v s99="$S99" -v sn="$SN" -v p50="$P50" -v p99="$P99" -v pn="$PN" \
    -v rate="$RATE" -v secs="$SECONDS_LOAD" 'BEGIN {
  printf "\ndrain of %d preloaded events                 seconds    events/s   relay / this\n", n
  printf "  (a) raw change-stream reader (libmongoc)  %8.3f  %10.0f   %6.2f\n", ts, n / ts, tr / ts
  printf "  (b) raw idempotent producer (rdkafka)     %8.3f  %10.0f   %6.2f\n", tp, n / tp, tr / tp
  printf "  (c) outboxd relay, stream -> PUBLISHED    %8.3f  %10.0f   %6.2f\n", tr, n / tr, 1
  printf "\ncommit-to-ack (publishedAt - occurredAt), %d events/s for %d s\n", rate, secs
  printf "  mode                                   events   p50 ms   p99 ms\n"
  printf "  stream (change stream)                 %6d   %6d   %6d\n", sn, s50, s99
  printf "  poll (2000 ms, batch 50)               %6d   %6d   %6d\n", pn, p50, p99
  printf "  poll / stream                                   %6.1fx  %6.1fx\n", p50 / (s50 > 0 ? s50 : 1), p99 / (s99 > 0 ? s99 : 1)
}'
