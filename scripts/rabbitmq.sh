#!/usr/bin/env bash
# rabbitmq.sh - a private RabbitMQ node for the tests and the local quick start.
#
#   scripts/rabbitmq.sh start     start the node (no-op if it already runs), wait until ready
#   scripts/rabbitmq.sh stop      stop it and make sure its processes are gone (idempotent)
#   scripts/rabbitmq.sh status    exit 0 and print the URL if it runs, exit 3 if not
#   scripts/rabbitmq.sh ctl ARGS  run `rabbitmqctl ARGS` against the node (e.g. list_queues
#                                 name arguments); exit 3 if it does not run
#
# Everything lives in $OBX_RMQ_DIR (default /tmp/obx-rmq; created if missing): mnesia, logs,
# config, its own Erlang cookie, and `env`, written once the node is ready:
#   export AMQP_URL=amqp://guest:guest@127.0.0.1:PORT/%2F
#   export OBX_RMQ_NODE=obx-<hash of the dir>@localhost
# The node never collides with a system RabbitMQ: own node name, AMQP port ($OBX_RMQ_PORT or
# a free one), distribution port, CLI port range, and its own epmd on its own port, all bound
# to 127.0.0.1. Run as root, the node runs as the `rabbitmq` user (the dir is chowned to it).
# Only processes carrying this node's name in their environment are ever signalled.
#
# Knobs: OBX_RMQ_DIR, OBX_RMQ_PORT, OBX_RMQ_START_TIMEOUT (seconds, default 180),
# OBX_RMQ_CONF_EXTRA (lines appended to the node's rabbitmq.conf, e.g. listeners.ssl.default).
set -euo pipefail

DIR=${OBX_RMQ_DIR:-/tmp/obx-rmq}
START_TIMEOUT=${OBX_RMQ_START_TIMEOUT:-180}
STOP_TIMEOUT=60
RMQ_BIN=/usr/lib/rabbitmq/bin
STATE=$DIR/node.conf    # node name and ports of the node that owns this dir

log() { echo "rabbitmq.sh: $*" >&2; }

if [ "$(id -u)" = 0 ]; then
  RUN_AS=(runuser -u rabbitmq --)
  OWNER=rabbitmq
else
  RUN_AS=()
  OWNER=$(id -un)
fi

# A port is busy when something listens on it or a live connection uses it as its local port;
# TIME-WAIT (and other closing states) left by the node we just stopped do not count: the
# listener binds over them, so a restart on the same port works at once.
port_free() { ! ss -Htan state listening state established "( sport = :$1 )" 2>/dev/null | grep -q .; }

# Picks the AMQP port P and derives the others from it: distribution P+1, CLI range P+2..P+12,
# epmd P+13. Every one must be free. The block sits below the kernel's ephemeral range
# (32768 up), so an outgoing connection elsewhere on the machine never takes one of its ports
# between a stop and the next start.
block_free() { local i; for i in $(seq 0 13); do port_free $(($1 + i)) || return 1; done; }
pick_ports() {
  local tries=0 p
  while :; do
    if [ -n "${OBX_RMQ_PORT:-}" ]; then p=$OBX_RMQ_PORT; else p=$((20000 + 16 * (RANDOM % 750))); fi
    if block_free "$p"; then
      PORT=$p
      return 0
    fi
    tries=$((tries + 1))
    if [ -n "${OBX_RMQ_PORT:-}" ] || [ "$tries" -ge 50 ]; then
      log "no free port set (last tried AMQP port $p)"
      return 1
    fi
  done
}

load_state() {
  [ -f "$STATE" ] || return 1
  # shellcheck disable=SC1090
  . "$STATE"
}

# The environment every rabbitmq program of this node runs with.
node_env() {
  ENVV=(
    HOME="$DIR"
    RABBITMQ_NODENAME="$NODE"
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    RABBITMQ_NODE_PORT="$PORT"
    RABBITMQ_DIST_PORT=$((PORT + 1))
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    RABBITMQ_CTL_DIST_PORT_MIN=$((PORT + 2))
    RABBITMQ_CTL_DIST_PORT_MAX=$((PORT + 12))
    ERL_EPMD_PORT=$((PORT + 13))
    ERL_EPMD_ADDRESS=127.0.0.1
    RABBITMQ_CONF_ENV_FILE="$DIR/rabbitmq-env.conf"
    RABBITMQ_CONFIG_FILE="$DIR/rabbitmq.conf"
    RABBITMQ_ADVANCED_CONFIG_FILE="$DIR/advanced.config"
    RABBITMQ_ENABLED_PLUGINS_FILE="$DIR/enabled_plugins"
    RABBITMQ_MNESIA_BASE="$DIR/mnesia"
    RABBITMQ_LOG_BASE="$DIR/log"
    RABBITMQ_PID_FILE="$DIR/rabbitmq.pid"
  )
}

as_node() { (cd "$DIR" && "${RUN_AS[@]}" env "${ENVV[@]}" "$@"); }
ctl() { as_node "$RMQ_BIN/rabbitmqctl" -n "$NODE" "$@"; }

# PIDs of every process started for this node (server, beam, epmd, helpers): they all carry
# RABBITMQ_NODENAME=<our node> in their environment.
node_pids() {
  local f pid
  for f in /proc/[0-9]*/environ; do
    pid=${f#/proc/}
    pid=${pid%/environ}
    [ "$pid" = "$$" ] && continue
    if grep -qzxF "RABBITMQ_NODENAME=$NODE" "$f" 2>/dev/null; then echo "$pid"; fi
  done
}

amqp_port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

write_env() {
  cat >"$DIR/env.tmp" <<EOF
export AMQP_URL=amqp://guest:guest@127.0.0.1:$PORT/%2F
export OBX_RMQ_NODE=$NODE
EOF
  mv "$DIR/env.tmp" "$DIR/env"
}

start() {
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd)
  STATE=$DIR/node.conf
  if load_state && [ -n "$(node_pids)" ]; then
    node_env
    if amqp_port_open && ctl -q await_startup --timeout 30 >/dev/null 2>&1; then
      write_env
      log "already running: $NODE on port $PORT"
      return 0
    fi
    log "a node for $DIR exists but does not answer; restarting it"
    stop
  fi

  local t0 hash
  t0=$(date +%s%N)
  hash=$(printf '%s' "$DIR" | cksum | cut -d' ' -f1)
  NODE="obx-$hash@localhost"
  pick_ports
  mkdir -p "$DIR/mnesia" "$DIR/log"
  rm -f "$DIR/env" "$DIR/rabbitmq.pid"
  printf 'NODE=%s\nPORT=%s\n' "$NODE" "$PORT" >"$STATE"
  : >"$DIR/rabbitmq-env.conf"
  echo '[].' >"$DIR/enabled_plugins"
  cat >"$DIR/rabbitmq.conf" <<EOF
# private test node; see scripts/rabbitmq.sh
log.console = false
log.file.level = info
EOF
  # At-least-once dead-lettering (the retry tiers) tries a dead letter it could not route again
  # only after this timeout (RabbitMQ's default: 180 s). At boot a vhost's quorum queues come back
  # before its exchanges, so a tier expiring its messages at once finds no exchange and holds
  # them that long (test_ladder_restart; README: RabbitMQ). It is not in rabbitmq.conf's schema.
  # The worker does not need it (its retry sweep republishes an overdue retry); it shortens the wait.
  echo '[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, 5000}]}].' >"$DIR/advanced.config"
  # extra rabbitmq.conf lines, e.g. a TLS listener for test_ladder_tls
  if [ -n "${OBX_RMQ_CONF_EXTRA:-}" ]; then printf '%s\n' "$OBX_RMQ_CONF_EXTRA" >>"$DIR/rabbitmq.conf"; fi
  if [ ! -s "$DIR/.erlang.cookie" ]; then
    (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$DIR/.erlang.cookie")
  fi
  chmod 400 "$DIR/.erlang.cookie"
  chown -R "$OWNER" "$DIR"
  if ! "${RUN_AS[@]}" test -w "$DIR/mnesia"; then
    log "$OWNER cannot write $DIR (a parent directory closed to it?); pick another OBX_RMQ_DIR"
    return 1
  fi
  node_env

  log "starting $NODE on 127.0.0.1:$PORT (dir $DIR)"
  (cd "$DIR" && exec setsid "${RUN_AS[@]}" env "${ENVV[@]}" "$RMQ_BIN/rabbitmq-server" \
     >>"$DIR/log/startup.log" 2>&1 </dev/null) &
  local launcher=$! deadline=$((SECONDS + START_TIMEOUT))
  until amqp_port_open; do
    if ! kill -0 "$launcher" 2>/dev/null; then
      log "rabbitmq-server exited during start-up; last lines of $DIR/log:"
      tail -n 30 "$DIR/log/startup.log" "$DIR/log/$NODE.log" >&2 2>/dev/null || true
      stop
      return 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "not listening on port $PORT after ${START_TIMEOUT}s; see $DIR/log"
      stop
      return 1
    fi
    sleep 0.2
  done
  if ! ctl -q await_startup --timeout $((deadline - SECONDS > 10 ? deadline - SECONDS : 10)); then
    log "await_startup failed; see $DIR/log"
    stop
    return 1
  fi
  write_env
  log "ready in $((($(date +%s%N) - t0) / 1000000)) ms: $NODE, AMQP port $PORT; env in $DIR/env"
}

stop() {
  [ -d "$DIR" ] || return 0
  DIR=$(cd "$DIR" && pwd)
  STATE=$DIR/node.conf
  load_state || return 0
  node_env
  rm -f "$DIR/env"
  local pids
  pids=$(node_pids)
  if [ -z "$pids" ]; then
    log "$NODE is not running"
    return 0
  fi
  if [ -s "$DIR/rabbitmq.pid" ]; then
    # Waits for the server process to exit; bounded in case the node is wedged.
    as_node timeout "$STOP_TIMEOUT" "$RMQ_BIN/rabbitmqctl" -n "$NODE" -q stop \
      "$DIR/rabbitmq.pid" >/dev/null 2>&1 ||
      log "rabbitmqctl stop failed; terminating $NODE's processes"
  fi
  # Whatever is left (epmd, a node that never finished booting): TERM, then KILL at the deadline.
  local deadline=$((SECONDS + STOP_TIMEOUT)) sig=TERM
  while pids=$(node_pids) && [ -n "$pids" ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      [ "$sig" = KILL ] && { log "processes of $NODE still alive: $pids"; return 1; }
      sig=KILL
      deadline=$((SECONDS + 10))
    fi
    # shellcheck disable=SC2086
    kill -s "$sig" $pids 2>/dev/null || true
    sleep 0.2
  done
  rm -f "$DIR/rabbitmq.pid"
  log "stopped $NODE"
}

status() {
  if [ ! -d "$DIR" ]; then
    echo "stopped (no $DIR)"
    return 3
  fi
  DIR=$(cd "$DIR" && pwd)
  STATE=$DIR/node.conf
  if load_state && [ -n "$(node_pids)" ] && amqp_port_open; then
    echo "running: $NODE amqp://guest:guest@127.0.0.1:$PORT/%2F (dir $DIR)"
    return 0
  fi
  echo "stopped (dir $DIR)"
  return 3
}

ctl_node() {
  [ -d "$DIR" ] || { log "no node (no $DIR)"; return 3; }
  DIR=$(cd "$DIR" && pwd)
  STATE=$DIR/node.conf
  if ! load_state || [ -z "$(node_pids)" ]; then
    log "no node runs in $DIR"
    return 3
  fi
  node_env
  ctl "$@"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  ctl) shift; ctl_node "$@" ;;
  *)
    echo "usage: $0 start|stop|status|ctl ARGS..." >&2
    exit 2
    ;;
esac
