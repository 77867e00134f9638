#!/usr/bin/env bash
# kafka.sh - a private Apache Kafka broker (KRaft, no ZooKeeper) for the tests and the quick start.
#
#   scripts/kafka.sh start [TOPIC...]  start the broker (no-op if it already runs), wait until it
#                                      answers, then create the topics given (see TOPIC below)
#   scripts/kafka.sh topic TOPIC...    create topics on the running broker (existing ones are kept)
#   scripts/kafka.sh stop              stop it and make sure its process is gone (idempotent)
#   scripts/kafka.sh status            exit 0 and print the bootstrap address if it runs, 3 if not
#   scripts/kafka.sh classpath         print the class path of the broker, its tools and the Java
#                                      client (fetched with Maven first if need be)
#
# TOPIC is NAME[:PARTITIONS[:KEY=VALUE,...]] with topic configs such as min.insync.replicas or
# retention.ms, e.g. domain-events:4:retention.ms=604800000,min.insync.replicas=1. Topics can
# also be given in $OBX_KAFKA_TOPICS (space-separated, created by `start`).
#
# The broker and its dependencies (the pinned version in tests/kafka/pom.xml) are resolved by
# Maven into ~/.m2, so only the first start on a machine downloads them (about 70 MB). One
# combined broker+controller runs with everything in $OBX_KAFKA_DIR (default /tmp/obx-kafka;
# created if missing): KRaft storage formatted on the first start, server.properties, the log,
# and `env`, written once the broker answers:
#   export KAFKA_BROKERS=127.0.0.1:PORT
#   export OBX_KAFKA_CLASSPATH=<jars>          (for the Java witness and Kafka's CLI tools)
# Ports: the client port ($OBX_KAFKA_PORT or a free one) and the controller port (the next
# one), bound to 127.0.0.1 and kept in $OBX_KAFKA_DIR/broker.conf, so a restart after a crash
# comes back on the same address with its data. Only the JVM carrying -Dobx.kafka.dir=<this
# dir> on its command line is ever signalled.
#
# Knobs: OBX_KAFKA_DIR, OBX_KAFKA_PORT, OBX_KAFKA_HEAP (default 512m),
#        OBX_KAFKA_START_TIMEOUT (seconds, default 120), OBX_KAFKA_EXIT_WITH (a pid: the broker
#        is stopped once that process is gone; tests set it for their private brokers).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
POM=$ROOT/tests/kafka/pom.xml
DIR=${OBX_KAFKA_DIR:-/tmp/obx-kafka}
START_TIMEOUT=${OBX_KAFKA_START_TIMEOUT:-120}
STOP_TIMEOUT=30
HEAP=${OBX_KAFKA_HEAP:-512m}

log() { echo "kafka.sh: $*" >&2; }

# Nothing listens on the port (connections left in TIME_WAIT do not keep the broker from binding).
port_free() { ! ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

resolve_dir() {
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd)
  STATE=$DIR/broker.conf
}

# The class path, resolved by Maven from the pom and cached in $DIR/classpath next to the
# checksum of the pom it came from, and once per machine in $CACHE (keyed by that checksum), so
# a fresh directory (a test's private broker, run.sh) needs no Maven run; every jar must still
# be there.
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/outboxd
jars_present() {
  local jar IFS=:
  for jar in $1; do [ -f "$jar" ] || return 1; done
}
classpath() {
  local sum cp
  sum=$(cksum <"$POM" | cut -d' ' -f1)
  if [ -s "$DIR/classpath" ] && [ "$(cat "$DIR/classpath.sum" 2>/dev/null)" = "$sum" ]; then
    cp=$(cat "$DIR/classpath")
    if jars_present "$cp"; then
      CP=$cp
      return 0
    fi
  fi
  if [ -s "$CACHE/kafka-classpath.$sum" ]; then
    cp=$(cat "$CACHE/kafka-classpath.$sum")
    if jars_present "$cp"; then
      printf '%s' "$cp" >"$DIR/classpath"
      echo "$sum" >"$DIR/classpath.sum"
      CP=$cp
      return 0
    fi
  fi
  command -v java >/dev/null || { log "java not found (Java 17+ runs the broker)"; return 1; }
  command -v mvn >/dev/null || { log "mvn not found (Maven fetches the broker)"; return 1; }
  local t0=$SECONDS
  # Offline first: nothing to fetch when ~/.m2 has it all.
  if ! mvn -o -q -B -f "$POM" dependency:build-classpath -Dmdep.outputFile="$DIR/classpath.tmp" \
       >"$DIR/maven.log" 2>&1; then
    log "fetching the Kafka broker and its dependencies with Maven (first time on this machine)"
    if ! mvn -q -B -f "$POM" dependency:build-classpath -Dmdep.outputFile="$DIR/classpath.tmp" \
         >"$DIR/maven.log" 2>&1; then
      log "Maven could not resolve $POM; last lines of $DIR/maven.log:"
      tail -n 20 "$DIR/maven.log" >&2
      return 1
    fi
    log "fetched in $((SECONDS - t0)) s"
  fi
  mv "$DIR/classpath.tmp" "$DIR/classpath"
  echo "$sum" >"$DIR/classpath.sum"
  CP=$(cat "$DIR/classpath")
  # The machine-wide copy is an optimisation only: a cache that cannot be written is skipped.
  { mkdir -p "$CACHE" && cp "$DIR/classpath" "$CACHE/kafka-classpath.$sum.tmp.$$" &&
      mv "$CACHE/kafka-classpath.$sum.tmp.$$" "$CACHE/kafka-classpath.$sum"; } 2>/dev/null || true
}

# JVM options of every Java program run here: a heap sized for a small machine, serial GC (no
# GC threads competing with the tests on 2 cores) and class data sharing for a fast start.
java_opts() {
  JOPTS=(-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto
         -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -Dorg.slf4j.simpleLogger.showDateTime=true)
}

# Runs one of Kafka's tools (a main class) against the broker with the resolved class path.
tool() {
  java_opts
  java "${JOPTS[@]}" -Xmx256m -cp "$CP" "$@"
}

pick_ports() {
  local tries=0 p
  while :; do
    if [ -n "${OBX_KAFKA_PORT:-}" ]; then p=$OBX_KAFKA_PORT; else p=$((20000 + RANDOM % 9000)); fi
    if port_free "$p" && port_free $((p + 1)); then
      PORT=$p
      CPORT=$((p + 1))
      return 0
    fi
    tries=$((tries + 1))
    if [ -n "${OBX_KAFKA_PORT:-}" ] || [ "$tries" -ge 50 ]; then
      log "no free port pair (last tried $p)"
      return 1
    fi
  done
}

load_state() {
  [ -f "$STATE" ] || return 1
  # shellcheck disable=SC1090
  . "$STATE"
}

# The broker's JVM: the one whose command line carries -Dobx.kafka.dir=$DIR.
broker_pid() {
  local f pid
  for f in /proc/[0-9]*/cmdline; do
    pid=${f#/proc/}
    pid=${pid%/cmdline}
    # No pipe: under pipefail an early grep -q exit would fail the writer and hide a match.
    if grep -qzxF -- "-Dobx.kafka.dir=$DIR" "$f" 2>/dev/null; then
      echo "$pid"
      return 0
    fi
  done
  return 1
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The broker answers a metadata request and lists itself (it is unfenced, so it takes writes).
answers() { kcat -b "127.0.0.1:$PORT" -L -m 2 2>/dev/null | grep -q "broker 1 at 127.0.0.1:$PORT"; }

write_env() {
  cat >"$DIR/env.tmp" <<EOF
export KAFKA_BROKERS=127.0.0.1:$PORT
export OBX_KAFKA_CLASSPATH='$CP'
EOF
  mv "$DIR/env.tmp" "$DIR/env"
}

write_config() {
  cat >"$DIR/server.properties" <<EOF
# private test broker; see scripts/kafka.sh
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CPORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CPORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$DIR/data
# One node: every internal topic has one replica; few partitions keep the first group and the
# first transaction quick to set up.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=3
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# Tests create their topics: a typo fails instead of creating a topic nobody reads.
auto.create.topics.enable=false
num.partitions=1
# A group rebalances as soon as members join (the default waits 3 s for more).
group.initial.rebalance.delay.ms=0
# Small thread pools and buffers for a 2-core machine.
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
background.threads=2
log.cleaner.threads=1
log.cleaner.dedupe.buffer.size=8388608
auto.leader.rebalance.enable=false
# After a crash (SIGKILL) the restarted broker is unfenced once the old incarnation's session
# ended: keep that short (the default is 9 s).
broker.session.timeout.ms=2000
broker.heartbeat.interval.ms=500
EOF
}

create_topics() {
  [ $# -gt 0 ] || return 0
  local spec name parts cfg args c
  for spec in "$@"; do
    IFS=: read -r name parts cfg <<<"$spec"
    [ -n "$name" ] || { log "empty topic name in '$spec'"; return 1; }
    args=(--bootstrap-server "127.0.0.1:$PORT" --create --if-not-exists --topic "$name"
          --partitions "${parts:-1}" --replication-factor 1)
    if [ -n "$cfg" ]; then
      local IFS=,
      for c in $cfg; do args+=(--config "$c"); done
      unset IFS
    fi
    if ! tool org.apache.kafka.tools.TopicCommand "${args[@]}" >>"$DIR/topics.log" 2>&1; then
      log "creating topic '$spec' failed; last lines of $DIR/topics.log:"
      tail -n 5 "$DIR/topics.log" >&2
      return 1
    fi
    log "topic $name (${parts:-1} partitions${cfg:+, $cfg})"
  done
}

start() {
  resolve_dir
  classpath
  # shellcheck disable=SC2206
  local topics=(${OBX_KAFKA_TOPICS:-} "$@")
  if load_state && broker_pid >/dev/null; then
    if answers; then
      write_env
      log "already running on 127.0.0.1:$PORT"
      create_topics "${topics[@]}"
      return 0
    fi
    log "a broker for $DIR runs but does not answer; restarting it"
    stop
  fi

  local t0
  t0=$(date +%s%N)
  # A restart keeps the ports and the data of the broker that owned the dir.
  if ! load_state || ! port_free "$PORT" || ! port_free "$CPORT"; then
    [ -f "$STATE" ] && log "the ports in $STATE are taken; picking new ones"
    pick_ports
    # A KRaft cluster id: 16 random bytes in URL-safe base64. One that starts with '-' would be
    # read by kafka-storage as an option (as Kafka's own Uuid.randomUuid, draw again).
    while [ -z "${CLUSTER_ID:-}" ] || [ "${CLUSTER_ID#-}" != "$CLUSTER_ID" ]; do
      CLUSTER_ID=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
    done
    printf 'PORT=%s\nCPORT=%s\nCLUSTER_ID=%s\n' "$PORT" "$CPORT" "$CLUSTER_ID" >"$STATE"
  fi
  mkdir -p "$DIR/data"
  rm -f "$DIR/env"
  write_config
  java_opts
  if [ ! -f "$DIR/data/meta.properties" ]; then
    if ! java "${JOPTS[@]}" -Xmx256m -cp "$CP" kafka.tools.StorageTool format \
         -t "$CLUSTER_ID" -c "$DIR/server.properties" >"$DIR/format.log" 2>&1; then
      log "formatting the KRaft storage failed:"
      tail -n 20 "$DIR/format.log" >&2
      return 1
    fi
  fi

  log "starting the broker on 127.0.0.1:$PORT (controller $CPORT, dir $DIR)"
  (cd "$DIR" && exec setsid java "${JOPTS[@]}" -Xms"$HEAP" -Xmx"$HEAP" -Dobx.kafka.dir="$DIR" \
     -Dorg.slf4j.simpleLogger.defaultLogLevel=info -Dorg.slf4j.simpleLogger.log.kafka.log=warn \
     -Dorg.slf4j.simpleLogger.log.org.apache.kafka.storage=warn \
     -cp "$CP" kafka.Kafka "$DIR/server.properties" >>"$DIR/broker.log" 2>&1 </dev/null) &
  local launcher=$! deadline=$((SECONDS + START_TIMEOUT))
  echo "$launcher" >"$DIR/broker.pid"
  # A broker started for a test process ends with it (OBX_KAFKA_EXIT_WITH: that process's
  # pid), so a crashed test leaves no broker behind.
  if [ -n "${OBX_KAFKA_EXIT_WITH:-}" ]; then
    (while kill -0 "$OBX_KAFKA_EXIT_WITH" 2>/dev/null && kill -0 "$launcher" 2>/dev/null; do sleep 1; done
     if kill -0 "$launcher" 2>/dev/null; then OBX_KAFKA_DIR=$DIR "$ROOT/scripts/kafka.sh" stop; fi
    ) </dev/null >/dev/null 2>&1 &
  fi
  until port_open "$PORT" && answers; do
    if ! kill -0 "$launcher" 2>/dev/null; then
      log "the broker exited during start-up; last lines of $DIR/broker.log:"
      tail -n 30 "$DIR/broker.log" >&2
      rm -f "$DIR/broker.pid"
      return 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "the broker does not answer on port $PORT after ${START_TIMEOUT}s; see $DIR/broker.log"
      stop
      return 1
    fi
    sleep 0.2
  done
  log "ready in $((($(date +%s%N) - t0) / 1000000)) ms on 127.0.0.1:$PORT; env in $DIR/env"
  create_topics "${topics[@]}"
  write_env
}

stop() {
  [ -d "$DIR" ] || return 0
  resolve_dir
  load_state || return 0
  rm -f "$DIR/env"
  local pid
  if ! pid=$(broker_pid); then
    rm -f "$DIR/broker.pid"
    log "the broker of $DIR is not running"
    return 0
  fi
  # A stopped (SIGSTOP) broker cannot act on SIGTERM: let it run again first.
  kill -CONT "$pid" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + STOP_TIMEOUT))
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "the broker (pid $pid) did not stop in ${STOP_TIMEOUT}s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      deadline=$((SECONDS + 10))
    fi
    sleep 0.1
  done
  rm -f "$DIR/broker.pid"
  log "stopped the broker on 127.0.0.1:$PORT"
}

status() {
  if [ ! -d "$DIR" ]; then
    echo "stopped (no $DIR)"
    return 3
  fi
  resolve_dir
  if load_state && broker_pid >/dev/null && answers; then
    echo "running: 127.0.0.1:$PORT (dir $DIR)"
    return 0
  fi
  echo "stopped (dir $DIR)"
  return 3
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  start) start "$@" ;;
  stop) stop ;;
  status) status ;;
  topic)
    resolve_dir
    load_state && broker_pid >/dev/null || { log "no broker runs for $DIR"; exit 3; }
    classpath
    create_topics "$@"
    ;;
  classpath)
    resolve_dir
    classpath
    echo "$CP"
    ;;
  *)
    echo "usage: $0 start [TOPIC...]|topic TOPIC...|stop|status|classpath" >&2
    exit 2
    ;;
esac
