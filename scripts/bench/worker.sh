#!/usr/bin/env bash
# worker.sh - worker throughput against its baselines, side by side in one run (issue 11 item 9):
#   (a) an instant pipeline: worker events/s / the durable floor (the inbox and execution writes
#       of each event issued directly through libmongoc from as many threads as runners);
#   (b) a 50 ms endpoint, SLOW_KEYS keys: worker events/s / (min(keys, BOUND) / 50 ms), at BOUND
#       (the worker's default WORKER_MAX_INFLIGHT) and, for context, at OTHER_BOUND (at 500,
#       min(keys, bound) / 50 ms is above the durable floor).
#
#   scripts/bench/worker.sh [RECORDS] [CONCURRENCY] [PARTITIONS] [SLOW_EVENTS] [SLOW_KEYS] [BOUND] [OTHER_BOUND]
#                           (defaults 5000 4 4 10000 1000 200 500)
#
# Starts a private devmongod and kafka-mockd (topics bench-instant and bench-slow with PARTITIONS
# partitions; kafka-mockd, not a real broker: the figures are the worker's, not Kafka's), builds
# scripts/bench/worker_bench.c against libobx and runs it; the 50 ms endpoint is a stub inside
# worker_bench. CONCURRENCY is ORDER_POST_CONCURRENCY (runner threads), BOUND and OTHER_BOUND
# WORKER_MAX_INFLIGHT.
# RabbitMQ is not needed (every run succeeds); AMQP_URL is used when set. Builds into
# $OBX_BUILD_DIR (default build/). Everything started here is stopped on exit.
set -euo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_init worker
RECORDS=${1:-5000}
CONCURRENCY=${2:-4}
PARTITIONS=${3:-4}
SLOW_EVENTS=${4:-10000}
SLOW_KEYS=${5:-1000}
BOUND=${6:-200}
OTHER_BOUND=${7:-500}

bench_build obx devmongod kafka-mockd
bench_cc "$WORK/worker_bench" scripts/bench/worker_bench.c
bench_start_mongo mongo
bench_start_kafka "bench-instant:$PARTITIONS" "bench-slow:$PARTITIONS"

echo "worker.sh: (a) $RECORDS records, (b) $SLOW_EVENTS events of $SLOW_KEYS keys; $CONCURRENCY runners, bound $BOUND ($OTHER_BOUND), $PARTITIONS partitions, kafka-mockd ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
"$WORK/worker_bench" "$MONGO_URI" "$BOOTSTRAP" "$RECORDS" "$CONCURRENCY" "$SLOW_EVENTS" "$SLOW_KEYS" "$BOUND" "$OTHER_BOUND" ${AMQP_URL:+"$AMQP_URL"}
