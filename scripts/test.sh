#!/usr/bin/env bash
# test.sh - the test command: install deps, build, start services, run every test, stop services.
#
#   scripts/test.sh            full run: unit + integration + chaos, then unit tests again under ASan+UBSan
#   scripts/test.sh --quick    one build, unit + integration + chaos, no sanitizer pass
#
# Exits non-zero on any failure. Services started here are stopped on every exit path.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1

scripts/install-deps.sh

# Every service and tool a test needs is installed above or started below: a test that finds
# one missing fails instead of skipping (obx_test_have in tests/support).
export OBX_TEST_STRICT=1

JOBS=$(nproc)
BUILD=${OBX_BUILD_DIR:-$ROOT/build}
# Optimised, but with assert() kept: the tests must see the bugs the asserts catch.
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g" \
  -DOBX_WERROR=ON >/dev/null
cmake --build "$BUILD" -j "$JOBS"

# RabbitMQ and Apache Kafka: a private node and a private broker for this run (own names,
# ports, data directories). A service started here is stopped on every exit path (one already
# running in a given $OBX_RMQ_DIR / $OBX_KAFKA_DIR is used and left running); a directory made
# here is removed after a green run (kept for its logs otherwise). The Kafka broker is fetched
# by Maven on the first run on a machine (cached in ~/.m2). Tests read its directory from
# OBX_TEST_KAFKA_DIR (tests/support/obx_test_kafka.h); tests that inject protocol faults start
# their own kafka-mockd.
RMQ_TMP=""
if [ -z "${OBX_RMQ_DIR:-}" ]; then
  RMQ_TMP=$(mktemp -d /tmp/obx-rmq.XXXXXX)
  export OBX_RMQ_DIR=$RMQ_TMP
fi
KAFKA_TMP=""
if [ -z "${OBX_KAFKA_DIR:-}" ]; then
  KAFKA_TMP=$(mktemp -d /tmp/obx-kafka.XXXXXX)
  export OBX_KAFKA_DIR=$KAFKA_TMP
fi
RMQ_OWN=0
scripts/rabbitmq.sh status >/dev/null || RMQ_OWN=1
KAFKA_OWN=0
scripts/kafka.sh status >/dev/null || KAFKA_OWN=1
rmq_stop() { if [ "$RMQ_OWN" = 1 ]; then scripts/rabbitmq.sh stop; fi; }
kafka_stop() { if [ "$KAFKA_OWN" = 1 ]; then scripts/kafka.sh stop; fi; }
cleanup() {
  local rc=$?
  kafka_stop || true
  rmq_stop || true
  if [ "$rc" = 0 ]; then
    [ -z "$RMQ_TMP" ] || rm -rf "$RMQ_TMP"
    [ -z "$KAFKA_TMP" ] || rm -rf "$KAFKA_TMP"
  else
    [ -z "$RMQ_TMP" ] || echo "test.sh: RabbitMQ logs kept in $RMQ_TMP/log"
    [ -z "$KAFKA_TMP" ] || echo "test.sh: Kafka broker log kept in $KAFKA_TMP/broker.log"
  fi
}
trap cleanup EXIT
# ctest carries on with the next test when one is interrupted: it runs in its own process
# group, and an interrupt of this script ends that whole group (tests and their servers).
child=""
on_signal() {
  if [ -n "$child" ]; then
    kill -TERM -- "-$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  exit 130
}
trap on_signal INT TERM
run_group() {
  local rc=0
  setsid "$@" &
  child=$!
  wait "$child" || rc=$?
  child=""
  return "$rc"
}
scripts/rabbitmq.sh start
# shellcheck disable=SC1091
source "$OBX_RMQ_DIR/env"   # exports AMQP_URL for the tests
scripts/kafka.sh start
export OBX_TEST_KAFKA_DIR=$OBX_KAFKA_DIR

status=0
run_group ctest --test-dir "$BUILD" -L unit --output-on-failure -j "$JOBS" || status=1
run_group ctest --test-dir "$BUILD" -L integration --output-on-failure -j "$JOBS" || status=1
# The fault-injection scenarios, after the integration suite: they stop and start the run's
# Kafka broker and RabbitMQ node (tests/chaos/chaos.py).
run_group ctest --test-dir "$BUILD" -L chaos --output-on-failure -V || status=1   # -V: the ledger table
rmq_stop   # the sanitizer pass runs unit tests only
kafka_stop

if [ "$QUICK" = 0 ]; then
  ASAN_BUILD=${BUILD}-asan
  cmake -S . -B "$ASAN_BUILD" -DCMAKE_BUILD_TYPE=Debug -DOBX_WERROR=ON -DOBX_SANITIZE=ON >/dev/null
  cmake --build "$ASAN_BUILD" -j "$JOBS"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    run_group ctest --test-dir "$ASAN_BUILD" -L unit --output-on-failure -j "$JOBS" || status=1
fi

if [ "$status" = 0 ]; then echo "test.sh: all tests passed in ${SECONDS} s"; else echo "test.sh: FAILED after ${SECONDS} s"; fi
exit "$status"
