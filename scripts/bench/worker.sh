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
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_init worker
RECORDS=${1:-5000}
CONCURRENCY=${2:-4}
PARTITIONS=${3:-4}

bench_build obx devmongod kafka-mockd
bench_cc "$WORK/worker_bench" scripts/bench/worker_bench.c
bench_start_mongo mongo
bench_start_kafka "domain-events:$PARTITIONS"

echo "worker.sh: $RECORDS records, $CONCURRENCY lanes, $PARTITIONS partitions ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
"$WORK/worker_bench" "$MONGO_URI" "$BOOTSTRAP" "$RECORDS" "$CONCURRENCY" ${AMQP_URL:+"$AMQP_URL"}
