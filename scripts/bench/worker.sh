#!/usr/bin/env bash
# worker.sh - worker consumer throughput (inbox + one-node pipeline) against a raw librdkafka
# consumer reading the same records; the ratio is the figure.
#
#   scripts/bench/worker.sh [RECORDS] [CONCURRENCY] [PARTITIONS]      (defaults 5000 4 4)
#
# Starts a private devmongod and kafka-mockd (topic domain-events with PARTITIONS partitions),
# builds scripts/bench/worker_bench.c against libobx and runs it: it produces RECORDS
# CloudEvents as the relay does, times a plain consumer over them, then the worker with
# CONCURRENCY lanes. RabbitMQ is not needed (every run succeeds); AMQP_URL is used when set.
# Builds into $OBX_BUILD_DIR (default build/). Everything started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
RECORDS=${1:-5000}
CONCURRENCY=${2:-4}
PARTITIONS=${3:-4}
BUILD=${OBX_BUILD_DIR:-$ROOT/build}
WORK=$(mktemp -d /tmp/obx-bench-worker.XXXXXX)
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

wait_for() {
  for _ in $(seq 300); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "worker.sh: timed out waiting for: $*" >&2
  return 1
}

cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target obx devmongod kafka-mockd >/dev/null
# shellcheck disable=SC2046
cc -O2 -std=gnu11 -D_GNU_SOURCE -I include -o "$WORK/worker_bench" scripts/bench/worker_bench.c "$BUILD/libobx.a" \
  $(pkg-config --cflags --libs libmongoc-1.0 libbson-1.0 rdkafka librabbitmq libcurl libmicrohttpd) -lcrypto -lpthread -lm

"$BUILD/tests/fixtures/devmongo/devmongod" --port 0 --port-file "$WORK/mongo.port" >"$WORK/mongo.log" 2>&1 &
PIDS+=($!)
"$BUILD/tests/fixtures/kafka-mock/kafka-mockd" --topic "domain-events:$PARTITIONS" \
  --bootstrap-file "$WORK/bootstrap" --control "$WORK/kafka.ctl" >"$WORK/kafka.log" 2>&1 </dev/null &
PIDS+=($!)
wait_for test -s "$WORK/mongo.port"
wait_for test -s "$WORK/bootstrap"
MONGO_URI="mongodb://127.0.0.1:$(head -1 "$WORK/mongo.port")/?replicaSet=rs0"
BOOTSTRAP=$(head -1 "$WORK/bootstrap")

echo "worker.sh: $RECORDS records, $CONCURRENCY lanes, $PARTITIONS partitions ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
"$WORK/worker_bench" "$MONGO_URI" "$BOOTSTRAP" "$RECORDS" "$CONCURRENCY" ${AMQP_URL:+"$AMQP_URL"}
