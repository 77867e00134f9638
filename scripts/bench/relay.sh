#!/usr/bin/env bash
# relay.sh - relay drain rate next to raw baselines, and commit-to-ack latency at two rates vs polling
#
#   scripts/bench/relay.sh [EVENTS] [RATE] [SECONDS] [HIGH_RATE]      (defaults 20000 20 15 2000)
#
# Starts a private devmongod and a real Apache Kafka broker (scripts/kafka.sh; topics of 6
# partitions), builds scripts/bench/relay/relay_bench.c against libobx, then:
#  1. preloads EVENTS outbox events (500 partition keys) after a recorded resume token;
#  2. drain: (a) a raw libmongoc change-stream reader reading those EVENTS changes,
#     (b) a raw idempotent rdkafka producer (acks=all) sending the same key/payload records,
#     (c) `outboxd --roles relay` resuming from that token until every event is PUBLISHED
#         (read, CloudEvents record, Kafka ack, outbox update, checkpoint), and its ratio to
#         min(a, b) (the target is >= 0.8), also timed from its first PUBLISHED event;
#  3. latency: RATE and then HIGH_RATE events/s, one insert each, for SECONDS, through the stream
#     relay, RATE through RELAY_MODE=poll with the seed's 2000 ms / batch 50, and RATE and
#     HIGH_RATE with RELAY_FENCING=transactions (the transactional producer); p50/p99 of
#     publishedAt - occurredAt (commit to acknowledged-and-recorded; the target is p99 <= 20 ms),
#     next to a raw idempotent producer's produce -> report at HIGH_RATE (the broker's share).
# The relay's settings from the environment reach it (e.g. RELAY_KEY_WINDOW=16).
# Prints one table with the ratios. Builds into $OBX_BUILD_DIR (default build/). Everything
# started here is stopped on exit.
set -euo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_init relay
EVENTS=${1:-20000}
RATE=${2:-20}
SECONDS_LOAD=${3:-15}
HIGH_RATE=${4:-2000}

bench_build obx outboxd devmongod
BENCH="$WORK/relay_bench"
bench_cc "$BENCH" scripts/bench/relay/relay_bench.c
bench_start_mongo mongo --oplog-size $((EVENTS * 2 + HIGH_RATE * SECONDS_LOAD * 2 + 100000))
bench_start_broker relay:6 raw:6 raw_steady:6 stream:6 stream_high:6 poll:6 txn:6 txn_high:6

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

echo "relay.sh: $EVENTS events, 500 keys, 6 partitions, real Kafka broker ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"

# ---- drain ----
TOKEN=$("$BENCH" token "$MONGO_URI" drain)
"$BENCH" preload "$MONGO_URI" drain "$EVENTS" 500
T_STREAM=$("$BENCH" stream "$MONGO_URI" drain "$EVENTS" "$TOKEN")
T_PRODUCE=$("$BENCH" produce "$BOOTSTRAP" raw "$MONGO_URI" drain "$EVENTS")
"$BENCH" checkpoint "$MONGO_URI" drain "$TOKEN"
T0=$(date +%s.%N)
relay_start drain relay
"$BENCH" rate "$MONGO_URI" drain "$EVENTS" 600 >"$WORK/rate" & # the same drain, from its first PUBLISHED event
RATE_PID=$!
T_RELAY=$("$BENCH" wait "$MONGO_URI" drain "$EVENTS" 600)
wait "$RATE_PID"
read -r R_RELAY _ <"$WORK/rate" # events/s (then the seconds from the lease to the first event)
T_RELAY=$(echo "$T_RELAY $(date +%s.%N) $T0" | awk '{print $2 - $3}') # includes process start
kill -TERM "$RELAY_PID"; wait "$RELAY_PID" || true

# ---- latency under a steady load ----
steady() { # db topic rate [env...]: prints p50 p99 n
  local db=$1 topic=$2 rate=$3
  shift 3
  relay_start "$db" "$topic" "$@"
  case "$*" in *RELAY_MODE=poll*) ;; *) wait_for grep -q "full scan" "$WORK/relay-$db.log" ;; esac
  "$BENCH" steady "$MONGO_URI" "$db" "$rate" "$SECONDS_LOAD" 50
  kill -TERM "$RELAY_PID"; wait "$RELAY_PID" || true
}
read -r S50 S99 SN <<<"$(steady steady_stream stream "$RATE")"
read -r H50 H99 HN <<<"$(steady steady_high stream_high "$HIGH_RATE")"
read -r K50 K99 KN <<<"$("$BENCH" produce-steady "$BOOTSTRAP" raw_steady "$HIGH_RATE" "$SECONDS_LOAD" 50)"
read -r P50 P99 PN <<<"$(steady steady_poll poll "$RATE" RELAY_MODE=poll OUTBOX_POLL_INTERVAL_MS=2000 OUTBOX_BATCH_SIZE=50)"
read -r X50 X99 XN <<<"$(steady steady_txn txn "$RATE" RELAY_FENCING=transactions)"
read -r Y50 Y99 YN <<<"$(steady steady_txn_high txn_high "$HIGH_RATE" RELAY_FENCING=transactions)"

awk -v n="$EVENTS" -v ts="$T_STREAM" -v tp="$T_PRODUCE" -v tr="$T_RELAY" -v rr="$R_RELAY" \
    -v s50="$S50" -v s99="$S99" -v sn="$SN" -v h50="$H50" -v h99="$H99" -v hn="$HN" \
    -v p50="$P50" -v p99="$P99" -v pn="$PN" -v x50="$X50" -v x99="$X99" -v xn="$XN" \
    -v y50="$Y50" -v y99="$Y99" -v yn="$YN" -v k50="$K50" -v k99="$K99" -v kn="$KN" \
    -v rate="$RATE" -v high="$HIGH_RATE" -v secs="$SECONDS_LOAD" 'BEGIN {
  printf "\ndrain of %d preloaded events                 seconds    events/s   relay / this\n", n
  printf "  (a) raw change-stream reader (libmongoc)  %8.3f  %10.0f   %6.2f\n", ts, n / ts, ts / tr
  printf "  (b) raw idempotent producer (rdkafka)     %8.3f  %10.0f   %6.2f\n", tp, n / tp, tp / tr
  printf "  (c) outboxd relay, stream -> PUBLISHED    %8.3f  %10.0f   %6.2f\n", tr, n / tr, 1
  slow = ts > tp ? ts : tp
  printf "  relay / min(a, b)                                             %6.2f   (target >= 0.80)\n", slow / tr
  printf "  (c) from its first PUBLISHED event (no process start, lease, set-up)  %10.0f   %6.2f\n", rr, rr * slow / n
  printf "\ncommit-to-ack (publishedAt - occurredAt), for %d s each\n", secs
  printf "  mode                                   events/s  events   p50 ms   p99 ms\n"
  printf "  stream (change stream)                 %8d  %6d   %6d   %6d\n", rate, sn, s50, s99
  printf "  stream (change stream)                 %8d  %6d   %6d   %6d\n", high, hn, h50, h99
  printf "  raw idempotent producer: produce->ack  %8d  %6d   %6d   %6d\n", high, kn, k50, k99
  printf "  poll (2000 ms, batch 50)               %8d  %6d   %6d   %6d\n", rate, pn, p50, p99
  printf "  stream, RELAY_FENCING=transactions     %8d  %6d   %6d   %6d\n", rate, xn, x50, x99
  printf "  stream, RELAY_FENCING=transactions     %8d  %6d   %6d   %6d\n", high, yn, y50, y99
  printf "  poll / stream at %d events/s                            %6.1fx  %6.1fx\n", rate, p50 / (s50 > 0 ? s50 : 1), p99 / (s99 > 0 ? s99 : 1)
}'
