#!/usr/bin/env bash
# chaos.sh - the fault-injection scenarios (tests/chaos/chaos.py) with the services they need.
#
#   scripts/chaos.sh [--scenario NAME]... [--orders N] [--events N] [--cycles M] [--seed S] ...
#   scripts/chaos.sh --list
#
# Every option goes to tests/chaos/chaos.py (its --help lists them; the default size is the
# one CI runs, e.g. `--orders 500 --events 1000 --cycles 5` is a long run). Prints one ledger
# row per scenario and exits non-zero when any ledger does not hold; the seed (--seed, or
# OBX_CHAOS_SEED) replays a failing schedule.
#
# Services: RabbitMQ from AMQP_URL (with OBX_RMQ_DIR naming its scripts/rabbitmq.sh node), or a
# private node started here; Kafka from KAFKA_BROKERS, or the scripts/kafka.sh broker running in
# OBX_KAFKA_DIR, or a private broker started here when Java is present, or else a kafka-mockd per
# scenario (chaos.py). What is started here is stopped on every exit path.
# OBX_BUILD_DIR: build directory (default ./build; built by scripts/test.sh or scripts/run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${OBX_BUILD_DIR:-$PWD/build}
PY=$(scripts/pyenv.sh)
log() { echo "chaos.sh: $*" >&2; }

case " $* " in *" --list "*|*" --help "*|*" -h "*) exec "$PY" tests/chaos/chaos.py --build "$BUILD" "$@" ;; esac

RMQ_TMP="" KAFKA_TMP=""
cleanup() {
  if [ -n "$KAFKA_TMP" ]; then OBX_KAFKA_DIR=$KAFKA_TMP scripts/kafka.sh stop || true; rm -rf "$KAFKA_TMP"; fi
  if [ -n "$RMQ_TMP" ]; then OBX_RMQ_DIR=$RMQ_TMP scripts/rabbitmq.sh stop || true; rm -rf "$RMQ_TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -z "${AMQP_URL:-}" ]; then
  RMQ_TMP=$(mktemp -d /tmp/obx-rmq-chaos.XXXXXX)
  export OBX_RMQ_DIR=$RMQ_TMP
  scripts/rabbitmq.sh start
  # shellcheck disable=SC1091
  source "$OBX_RMQ_DIR/env"
fi
if [ -z "${KAFKA_BROKERS:-}" ]; then
  if [ -n "${OBX_KAFKA_DIR:-}" ] && scripts/kafka.sh status >/dev/null 2>&1; then
    # shellcheck disable=SC1091
    source "$OBX_KAFKA_DIR/env"
  elif command -v java >/dev/null && command -v mvn >/dev/null; then
    KAFKA_TMP=$(mktemp -d /tmp/obx-kafka-chaos.XXXXXX)
    export OBX_KAFKA_DIR=$KAFKA_TMP
    scripts/kafka.sh start
    # shellcheck disable=SC1091
    source "$OBX_KAFKA_DIR/env"
  else
    log "no Java: each scenario runs against a kafka-mockd of its own"
  fi
fi
export AMQP_URL KAFKA_BROKERS
"$PY" tests/chaos/chaos.py --build "$BUILD" "$@"
