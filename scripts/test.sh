#!/usr/bin/env bash
# test.sh - the test command: install deps, build, start services, run every test, stop services.
#
#   scripts/test.sh            full run: unit + integration, then unit tests again under ASan+UBSan
#   scripts/test.sh --quick    one build, unit + integration, no sanitizer pass
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

# RabbitMQ: a private node for this run (own name, ports, data directory). A node started
# here is stopped on every exit path (one already running in a given $OBX_RMQ_DIR is used and
# left running); a directory made here is removed after a green run (kept for its logs
# otherwise).
RMQ_TMP=""
if [ -z "${OBX_RMQ_DIR:-}" ]; then
  RMQ_TMP=$(mktemp -d /tmp/obx-rmq.XXXXXX)
  export OBX_RMQ_DIR=$RMQ_TMP
fi
RMQ_OWN=0
scripts/rabbitmq.sh status >/dev/null || RMQ_OWN=1
rmq_stop() { if [ "$RMQ_OWN" = 1 ]; then scripts/rabbitmq.sh stop; fi; }
cleanup() {
  local rc=$?
  rmq_stop || true
  if [ -n "$RMQ_TMP" ]; then
    if [ "$rc" = 0 ]; then
      rm -rf "$RMQ_TMP"
    else
      echo "test.sh: RabbitMQ logs kept in $RMQ_TMP/log"
    fi
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

status=0
run_group ctest --test-dir "$BUILD" -L unit --output-on-failure -j "$JOBS" || status=1
run_group ctest --test-dir "$BUILD" -L integration --output-on-failure || status=1
rmq_stop   # the sanitizer pass runs unit tests only

if [ "$QUICK" = 0 ]; then
  ASAN_BUILD=${BUILD}-asan
  cmake -S . -B "$ASAN_BUILD" -DCMAKE_BUILD_TYPE=Debug -DOBX_WERROR=ON -DOBX_SANITIZE=ON >/dev/null
  cmake --build "$ASAN_BUILD" -j "$JOBS"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    run_group ctest --test-dir "$ASAN_BUILD" -L unit --output-on-failure -j "$JOBS" || status=1
fi

if [ "$status" = 0 ]; then echo "test.sh: all tests passed"; else echo "test.sh: FAILED"; fi
exit "$status"
