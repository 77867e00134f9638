# shellcheck shell=bash disable=SC2034
# lib.sh - shared by the bench scripts: build, start private servers, stop them all on exit
#
#   . "$(dirname "$0")/lib.sh"; bench_init NAME
#
# bench_init moves to the repository root and sets ROOT, BUILD ($OBX_BUILD_DIR, default build/)
# and WORK (a temp dir removed on exit). Every process started by bench_start_* (or appended to
# PIDS by the caller) gets SIGTERM on exit and is waited for. The variables set here are read
# by the sourcing script (hence SC2034 off).

# bench_init NAME: NAME labels the temp dir and the error messages.
bench_init() {
  BENCH_NAME=$1
  cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
  ROOT=$PWD
  BUILD=${OBX_BUILD_DIR:-$ROOT/build}
  WORK=$(mktemp -d "/tmp/obx-bench-$BENCH_NAME.XXXXXX")
  PIDS=()
  trap bench_cleanup EXIT INT TERM
}

bench_cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ -n "${BENCH_BROKER_DIR:-}" ]; then OBX_KAFKA_DIR=$BENCH_BROKER_DIR "$ROOT/scripts/kafka.sh" stop >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}

# wait_for CMD...: retries CMD for up to 30 s.
wait_for() {
  for _ in $(seq 300); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "$BENCH_NAME.sh: timed out waiting for: $*" >&2
  return 1
}

# bench_build TARGET...: configures $BUILD (RelWithDebInfo) and builds the targets.
bench_build() {
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$BUILD" -j "$(nproc)" --target "$@" >/dev/null
}

# bench_cc OUT SRC: compiles a bench program against $BUILD/libobx.a and its libraries.
bench_cc() {
  # shellcheck disable=SC2046
  cc -O2 -std=gnu11 -D_GNU_SOURCE -I include -o "$1" "$2" "$BUILD/libobx.a" \
    $(pkg-config --cflags --libs libmongoc-1.0 libbson-1.0 rdkafka librabbitmq libcurl libmicrohttpd) -lcrypto -lpthread -lm
}

# bench_start_mongo NAME [ARG...]: starts devmongod (log $WORK/NAME.log) with the extra
# arguments, waits until it listens, sets MONGO_URI.
bench_start_mongo() {
  local name=$1
  shift
  "$BUILD/tests/fixtures/devmongo/devmongod" --port 0 --port-file "$WORK/$name.port" "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  wait_for test -s "$WORK/$name.port"
  MONGO_URI="mongodb://127.0.0.1:$(head -1 "$WORK/$name.port")/?replicaSet=rs0"
}

# bench_start_kafka TOPIC:PARTITIONS...: starts kafka-mockd with these topics, waits until it
# listens, sets BOOTSTRAP.
bench_start_kafka() {
  local topics=()
  for t in "$@"; do topics+=(--topic "$t"); done
  "$BUILD/tests/fixtures/kafka-mock/kafka-mockd" "${topics[@]}" \
    --bootstrap-file "$WORK/bootstrap" --control "$WORK/kafka.ctl" >"$WORK/kafka.log" 2>&1 </dev/null &
  PIDS+=($!)
  wait_for test -s "$WORK/bootstrap"
  BOOTSTRAP=$(head -1 "$WORK/bootstrap")
}

# bench_kafka_cmd COMMAND...: one command to the kafka-mockd of bench_start_kafka (its control
# socket; the commands are listed at the top of kafka_mockd.c); fails unless it answers "ok".
bench_kafka_cmd() {
  python3 - "$WORK/kafka.ctl" "$*" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall((sys.argv[2] + "\n").encode())
answer = s.makefile().readline().strip()
sys.exit(0 if answer == "ok" else "kafka-mockd: " + sys.argv[2] + ": " + answer)
PY
}

# bench_start_broker TOPIC...: starts a real Apache Kafka broker of its own (scripts/kafka.sh, in
# $WORK/kafka, stopped on exit) with these topics (NAME:PARTITIONS[:CONFIGS] as kafka.sh takes
# them), sets BOOTSTRAP.
bench_start_broker() {
  BENCH_BROKER_DIR=$WORK/kafka
  if ! OBX_KAFKA_DIR=$BENCH_BROKER_DIR OBX_KAFKA_EXIT_WITH=$$ "$ROOT/scripts/kafka.sh" start "$@" >"$WORK/kafka-start.log" 2>&1; then
    cat "$WORK/kafka-start.log" >&2
    echo "$BENCH_NAME.sh: the Kafka broker did not start" >&2
    return 1
  fi
  BOOTSTRAP=$(sed -n 's/^export KAFKA_BROKERS=//p' "$BENCH_BROKER_DIR/env")
}
