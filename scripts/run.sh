#!/usr/bin/env bash
# run.sh - run the whole system locally on the embedded defaults, until Ctrl-C.
#
#   scripts/run.sh [--demo] [--no-build] [--state-dir DIR]
#
# Installs the Debian packages that are missing (scripts/install-deps.sh), builds, then starts
#   devmongod     in-memory MongoDB replica set        unless MONGO_URI is set
#   Kafka         topic domain-events (4 partitions)   unless KAFKA_BROKERS is set: an Apache
#                 Kafka broker (scripts/kafka.sh) when Java and Maven are installed, else
#                 kafka-mockd (librdkafka's mock cluster); OBX_RUN_KAFKA=mock forces kafka-mockd
#   RabbitMQ      a private node (scripts/rabbitmq.sh) unless AMQP_URL is set
#   outboxd       every role (api, relay, worker) on HTTP_PORT (default 8080; 0 picks one)
# creates an API key for org "demo" with every permission, named quickstart (the key in STATE/api-key, its hash
# in STATE/api-keys), applies config/pipelines/*.json (outboxctl pipelines apply), prints the
# API address and a ready-made curl line, and waits. Ctrl-C (SIGINT) or SIGTERM stops
# everything it started, in reverse order (outboxd first, while its services still answer);
# so does outboxd exiting on its own. Every process it starts runs in a session of its own
# (setsid), so a terminal's Ctrl-C, which signals the whole foreground process group, reaches
# only run.sh (the servers install SIGINT handlers, and outboxd's sigwait takes a blocked SIGINT
# even when a non-interactive shell set it to be ignored); run.sh then stops outboxd
# (SHUTDOWN_GRACE, default 3s here) and then the servers: everything is gone in under 5 s.
#
# STATE (--state-dir, default a fresh /tmp/outboxd-run.XXXXXX) holds the logs of every process
# and, once everything is ready, `ready`: shell assignments (API_URL, API_KEY_FILE, MONGO_URI,
# KAFKA_BROKERS, KAFKA_KIND (broker, kafka-mockd or external), AMQP_URL and the PIDs of what was
# started) for scripts and tests.
#   --demo       once ready, drive a short scenario and print each stage: an order integrated by
#                an order.post pipeline calling a local stub ERP (scripts/demo-stub.py), one whose
#                ERP call fails twice and recovers through the retry ladder, one that fails
#                terminally, is parked in the DLQ and redriven once the ERP is fixed. Retry tiers
#                are 1s,2s,4s and pipelines may call 127.0.0.0/8 in this mode.
#   --no-build   skip install-deps and the build (the binaries must be in OBX_BUILD_DIR)
# OBX_BUILD_DIR: build directory (default ./build).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${OBX_BUILD_DIR:-$ROOT/build}
BUILD_ON=1
DEMO=0
STATE=""
READY_TIMEOUT=${OBX_RUN_READY_TIMEOUT:-120}

while [ $# -gt 0 ]; do
  case "$1" in
    --demo) DEMO=1 ;;
    --no-build) BUILD_ON=0 ;;
    --state-dir) STATE=$2; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

log() { echo "run.sh: $*" >&2; }
die() { log "$*"; exit 1; }

if [ "$BUILD_ON" = 1 ]; then
  scripts/install-deps.sh
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$BUILD" -j "$(nproc)" --target outboxd outboxctl devmongod kafka-mockd
fi
OUTBOXD=$BUILD/outboxd
OUTBOXCTL=$BUILD/outboxctl
for b in "$OUTBOXD" "$OUTBOXCTL"; do [ -x "$b" ] || die "$b is missing (build first, or drop --no-build)"; done

if [ -z "$STATE" ]; then STATE=$(mktemp -d /tmp/outboxd-run.XXXXXX); fi
mkdir -p "$STATE"
rm -f "$STATE/ready"

# ---- stopping ------------------------------------------------------------------------------
PIDS=()          # started here, stopped in reverse order
RMQ_DIR=""       # set when the private RabbitMQ node was started here
KAFKA_DIR=""     # set when the Apache Kafka broker was started here
stopping=0
stop_all() {
  [ "$stopping" = 1 ] && return
  stopping=1
  trap '' INT TERM
  rm -f "$STATE/ready"
  local i pid
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    pid=${PIDS[$i]}
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then log "pid $pid did not stop in 15 s: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
    wait "$pid" 2>/dev/null || true
  done
  if [ -n "$RMQ_DIR" ]; then
    if OBX_RMQ_DIR=$RMQ_DIR scripts/rabbitmq.sh stop >/dev/null 2>&1; then rm -rf "$RMQ_DIR"
    else log "RabbitMQ stop failed (its logs: $RMQ_DIR/log)"; fi
  fi
  if [ -n "$KAFKA_DIR" ]; then
    if OBX_KAFKA_DIR=$KAFKA_DIR scripts/kafka.sh stop >/dev/null 2>&1; then rm -rf "$KAFKA_DIR"
    else log "Kafka broker stop failed (its log: $KAFKA_DIR/broker.log)"; fi
  fi
  log "stopped (logs in $STATE)"
}
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
trap 'rc=$?; stop_all; exit $rc' EXIT

# Waits until a file exists and is not empty.
wait_file() {
  local path=$1 what=$2 pid=$3 deadline=$((SECONDS + READY_TIMEOUT))
  while [ ! -s "$path" ]; do
    kill -0 "$pid" 2>/dev/null || die "$what exited; log: $STATE/$what.log"
    [ "$SECONDS" -lt "$deadline" ] || die "$what not ready after ${READY_TIMEOUT}s; log: $STATE/$what.log"
    sleep 0.1
  done
}

# ---- services --------------------------------------------------------------------------------
if [ -z "${MONGO_URI:-}" ]; then
  setsid "$BUILD/tests/fixtures/devmongo/devmongod" --port 0 --port-file "$STATE/devmongod.port" \
    </dev/null >"$STATE/devmongod.log" 2>&1 &
  PIDS+=($!); DEVMONGOD_PID=$!
  wait_file "$STATE/devmongod.port" devmongod "$DEVMONGOD_PID"
  MONGO_URI="mongodb://127.0.0.1:$(cat "$STATE/devmongod.port")/?replicaSet=rs0"
  log "devmongod on $MONGO_URI"
fi
KAFKA_KIND=external
KAFKA_PID=""
if [ -z "${KAFKA_BROKERS:-}" ]; then
  if [ "${OBX_RUN_KAFKA:-auto}" != mock ] && command -v java >/dev/null && command -v mvn >/dev/null; then
    KAFKA_KIND=broker
    KAFKA_DIR=$(mktemp -d /tmp/obx-kafka-run.XXXXXX)
    log "Java found: starting an Apache Kafka broker (scripts/kafka.sh; the first start on a" \
      "machine fetches it with Maven, about 70 MB, some 15 s on a fast link; then cached in ~/.m2)"
    t0=$SECONDS
    OBX_KAFKA_DIR=$KAFKA_DIR setsid scripts/kafka.sh start domain-events:4 >"$STATE/kafka.log" 2>&1 ||
      die "the Kafka broker did not start; log: $STATE/kafka.log and $KAFKA_DIR/broker.log"
    KAFKA_BROKERS=$(. "$KAFKA_DIR/env" && echo "$KAFKA_BROKERS")
    KAFKA_PID=$(cat "$KAFKA_DIR/broker.pid")
    log "Apache Kafka broker on $KAFKA_BROKERS (topic domain-events, 4 partitions), up in $((SECONDS - t0)) s"
  else
    KAFKA_KIND=kafka-mockd
    if [ "${OBX_RUN_KAFKA:-auto}" != mock ]; then
      log "no Java/Maven: using kafka-mockd, librdkafka's mock cluster (install Java 17 and Maven" \
        "for a real broker)"
    fi
    setsid "$BUILD/tests/fixtures/kafka-mock/kafka-mockd" --brokers 1 --topic domain-events:4 \
      --bootstrap-file "$STATE/kafka.bootstrap" --control "$STATE/kafka.control" \
      </dev/null >"$STATE/kafka-mockd.log" 2>&1 &
    PIDS+=($!); KAFKA_PID=$!
    wait_file "$STATE/kafka.bootstrap" kafka-mockd "$KAFKA_PID"
    KAFKA_BROKERS=$(head -n1 "$STATE/kafka.bootstrap")
    log "kafka-mockd on $KAFKA_BROKERS (topic domain-events, 4 partitions)"
  fi
fi
if [ -z "${AMQP_URL:-}" ]; then
  RMQ_DIR=$(mktemp -d /tmp/obx-rmq-run.XXXXXX)
  OBX_RMQ_DIR=$RMQ_DIR setsid scripts/rabbitmq.sh start >"$STATE/rabbitmq.log" 2>&1 ||
    die "RabbitMQ did not start; log: $STATE/rabbitmq.log"
  # shellcheck disable=SC1091
  AMQP_URL=$(. "$RMQ_DIR/env" && echo "$AMQP_URL")
  log "RabbitMQ on ${AMQP_URL%%/%2F}"
fi
export MONGO_URI KAFKA_BROKERS AMQP_URL

# ---- API key, outboxd, pipelines ---------------------------------------------------------------
"$OUTBOXCTL" apikey new --org demo --perm '*' --name quickstart >"$STATE/apikey.out"
sed -n 's/^key: *//p' "$STATE/apikey.out" >"$STATE/api-key"
sed -n 's/^line: *//p' "$STATE/apikey.out" >"$STATE/api-keys"
rm -f "$STATE/apikey.out"
chmod 600 "$STATE/api-key"
API_KEY=$(cat "$STATE/api-key")

# a short retry ladder, so the sample pipeline's failing call reaches the dead letters in under a minute
QUICK_LADDER=${RETRY_LADDER:-2s,5s,10s}
DEMO_ARGS=(-X "worker.retry_ladder=$QUICK_LADDER")
if [ "$DEMO" = 1 ]; then
  setsid python3 "$ROOT/scripts/demo-stub.py" "$STATE/demo-stub.port" </dev/null >"$STATE/demo-stub.log" 2>&1 &
  PIDS+=($!)
  wait_file "$STATE/demo-stub.port" demo-stub "$!"
  STUB_URL="http://127.0.0.1:$(cat "$STATE/demo-stub.port")"
  "$OUTBOXCTL" apikey new --org demo-e2e --perm '*' >"$STATE/apikey.out"
  DEMO_KEY=$(sed -n 's/^key: *//p' "$STATE/apikey.out")
  sed -n 's/^line: *//p' "$STATE/apikey.out" >>"$STATE/api-keys"
  rm -f "$STATE/apikey.out"
  # the demo's ERP stub listens on 127.0.0.1: allowlisted and its network allowed
  DEMO_ARGS=(-X egress.allow_networks=127.0.0.0/8 -X worker.retry_ladder=1s,2s,4s
    -X "egress.allowlist=${EGRESS_ALLOWLIST:-erp.exemplo.com,desk.exemplo.com},127.0.0.1")
fi

# the hosts config/pipelines call (an empty allowlist lets http-request nodes call no host)
SHUTDOWN_GRACE=${SHUTDOWN_GRACE:-3s} setsid "$OUTBOXD" -X "http.port=${HTTP_PORT:-8080}" -X "http.bind=127.0.0.1" -X "api.keys_file=$STATE/api-keys" \
  -X "egress.allowlist=${EGRESS_ALLOWLIST:-erp.exemplo.com,desk.exemplo.com}" "${DEMO_ARGS[@]}" </dev/null >"$STATE/outboxd.log" 2>&1 &
PIDS+=($!); OUTBOXD_PID=$!
deadline=$((SECONDS + READY_TIMEOUT))
PORT=""
while [ -z "$PORT" ]; do
  kill -0 "$OUTBOXD_PID" 2>/dev/null || die "outboxd exited; log: $STATE/outboxd.log"
  [ "$SECONDS" -lt "$deadline" ] || die "outboxd did not listen after ${READY_TIMEOUT}s; log: $STATE/outboxd.log"
  PORT=$(grep '"http listening"' "$STATE/outboxd.log" | sed -n 's/.*"port":"\([0-9]*\)".*/\1/p' | head -n1 || true)
  [ -n "$PORT" ] || sleep 0.1
done
API_URL="http://127.0.0.1:$PORT"
until curl -fsS -o /dev/null "$API_URL/readyz"; do
  kill -0 "$OUTBOXD_PID" 2>/dev/null || die "outboxd exited; log: $STATE/outboxd.log"
  [ "$SECONDS" -lt "$deadline" ] || die "outboxd not ready after ${READY_TIMEOUT}s ($API_URL/readyz); log: $STATE/outboxd.log"
  sleep 0.2
done
"$OUTBOXCTL" pipelines apply "$ROOT/config/pipelines" >"$STATE/pipelines.log" 2>&1 ||
  die "pipelines apply failed: $(cat "$STATE/pipelines.log")"
sed 's/^/run.sh: pipelines: /' "$STATE/pipelines.log" >&2

{
  echo "API_URL=$API_URL"
  echo "API_KEY_FILE=$STATE/api-key"
  echo "MONGO_URI='$MONGO_URI'"
  echo "KAFKA_BROKERS='$KAFKA_BROKERS'"
  echo "AMQP_URL='$AMQP_URL'"
  echo "OUTBOXD_PID=$OUTBOXD_PID"
  echo "DEVMONGOD_PID=${DEVMONGOD_PID:-}"
  echo "KAFKA_KIND=$KAFKA_KIND"
  echo "KAFKA_PID=$KAFKA_PID"
  echo "KAFKA_DIR=$KAFKA_DIR"
  echo "RMQ_DIR=$RMQ_DIR"
} >"$STATE/ready.tmp"
mv "$STATE/ready.tmp" "$STATE/ready"

cat <<EOF

outboxd is running (all roles). Logs: $STATE
  API        $API_URL   (key for org "demo", every permission: $STATE/api-key)
  MongoDB    $MONGO_URI
  Kafka      $KAFKA_BROKERS   ($KAFKA_KIND, topic domain-events)
  RabbitMQ   ${AMQP_URL%%/%2F}   (retry ladder $QUICK_LADDER: short for the quick start; RETRY_LADDER sets it)

Place an order:
  curl -s -X POST $API_URL/orders -H "Authorization: Bearer $API_KEY" -H 'Content-Type: application/json' \\
    -d '{"customerEmail": "customer@company.com", "amount": "149.90"}'
Then look at it:
  curl -s "$API_URL/api/outbox?limit=5" -H "Authorization: Bearer $API_KEY"
  MONGO_URI='$MONGO_URI' AMQP_URL='$AMQP_URL' $OUTBOXCTL status

Ctrl-C stops everything.
EOF

if [ "$DEMO" = 1 ]; then
  # shellcheck source=scripts/demo.sh
  . "$ROOT/scripts/demo.sh"
  demo_run || die "demo failed; logs in $STATE"
fi

# Waits for outboxd; a signal interrupts the wait and the traps stop everything.
set +e
wait "$OUTBOXD_PID"
rc=$?
set -e
log "outboxd exited with status $rc; log: $STATE/outboxd.log"
exit 1
