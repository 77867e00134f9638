#!/usr/bin/env bash
# orders.sh - POST /orders throughput and latency against the raw transaction rate
#
#   scripts/bench/orders.sh [SECONDS] [CONNECTIONS]      (defaults: 10 s, 16)
#
# Starts a private devmongod and `outboxd --roles api` on it, drives POST /orders (seed 001's
# payload, one API key) with wrk for SECONDS over CONNECTIONS connections, then runs
# orders_direct.c (the same order + outbox transaction through libmongoc, no HTTP) with as many
# threads for as long, on a fresh devmongod. Prints orders/s, p50 and p99 of both and the
# ratio HTTP/direct. Needs wrk (Debian package, in scripts/install-deps.sh). Builds into
# $OBX_BUILD_DIR (default build/). Everything started here is stopped on exit.
set -euo pipefail
# shellcheck source=scripts/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_init orders
SECONDS_RUN=${1:-10}
CONNS=${2:-16}

command -v wrk >/dev/null || { echo "orders.sh: wrk is not installed (scripts/install-deps.sh)" >&2; exit 1; }
bench_build obx outboxd outboxctl devmongod
# shellcheck disable=SC2046
cc -O2 -o "$WORK/orders_direct" scripts/bench/orders_direct.c \
  $(pkg-config --cflags --libs libmongoc-1.0 libbson-1.0) -lpthread

# ---- HTTP: outboxd --roles api --------------------------------------------------------------
bench_start_mongo mongo-http
KEY_OUT=$("$BUILD/outboxctl" apikey new --org bench --perm orders:write)
KEY=$(sed -n 's/^key:  //p' <<<"$KEY_OUT")
sed -n 's/^line: //p' <<<"$KEY_OUT" >"$WORK/keys"
"$BUILD/outboxd" --roles api -X "mongo.uri=$MONGO_URI" -X http.port=0 \
  -X "api.keys_file=$WORK/keys" -X log.level=info >"$WORK/outboxd.log" 2>&1 &
PIDS+=($!)
wait_for grep -q '"http listening"' "$WORK/outboxd.log"
PORT=$(sed -n 's/.*"http listening".*"port":"\([0-9]*\)".*/\1/p' "$WORK/outboxd.log" | head -1)
wait_for curl -sf "http://127.0.0.1:$PORT/readyz"

cat >"$WORK/post.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"customerEmail": "customer@company.com", "amount": "149.90"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $KEY"
LUA
WRK_THREADS=$(( CONNS < 2 ? CONNS : 2 ))
wrk -t "$WRK_THREADS" -c "$CONNS" -d "${SECONDS_RUN}s" --latency -s "$WORK/post.lua" \
  "http://127.0.0.1:$PORT/orders" >"$WORK/wrk.txt"
HTTP_RPS=$(awk '/^Requests\/sec:/ {print $2}' "$WORK/wrk.txt")
# wrk prints latencies with units (us, ms, s): normalise to ms.
to_ms() { awk -v v="$1" 'BEGIN { if (v ~ /us$/) printf "%.2f", v / 1000; else if (v ~ /ms$/) printf "%.2f", v + 0;
  else if (v ~ /s$/) printf "%.2f", v * 1000; else printf "%s", v }'; }
HTTP_P50=$(to_ms "$(awk '$1 == "50%" {print $2}' "$WORK/wrk.txt")")
HTTP_P99=$(to_ms "$(awk '$1 == "99%" {print $2}' "$WORK/wrk.txt")")
NON2XX=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$WORK/wrk.txt")
CREATED=$(curl -s "http://127.0.0.1:$PORT/metrics" |
  awk '/^outboxd_http_requests_total\{.*route="\/orders".*status="201"/ {print $NF}')

# ---- direct: the same transaction through libmongoc ------------------------------------------
bench_start_mongo mongo-direct
DIRECT=$("$WORK/orders_direct" "$MONGO_URI" "$SECONDS_RUN" "$CONNS")
DIRECT_RPS=$(sed -n 's/.*orders_per_s=\([0-9.]*\).*/\1/p' <<<"$DIRECT")
DIRECT_P50=$(sed -n 's/.*p50_ms=\([0-9.]*\).*/\1/p' <<<"$DIRECT")
DIRECT_P99=$(sed -n 's/.*p99_ms=\([0-9.]*\).*/\1/p' <<<"$DIRECT")

printf '\nPOST /orders vs the raw transaction (%ss, %s connections/threads, devmongod)\n' "$SECONDS_RUN" "$CONNS"
printf '%-22s %12s %10s %10s\n' "" "orders/s" "p50 ms" "p99 ms"
printf '%-22s %12s %10s %10s\n' "HTTP (wrk -> outboxd)" "$HTTP_RPS" "$HTTP_P50" "$HTTP_P99"
printf '%-22s %12s %10s %10s\n' "direct (libmongoc)" "$DIRECT_RPS" "$DIRECT_P50" "$DIRECT_P99"
awk -v h="$HTTP_RPS" -v d="$DIRECT_RPS" 'BEGIN { if (d > 0) printf "ratio HTTP/direct: %.2f\n", h / d }'
echo "HTTP 201s counted by outboxd: ${CREATED:-0}; non-2xx seen by wrk: ${NON2XX:-0}"
