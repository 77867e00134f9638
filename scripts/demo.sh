# demo.sh - the scenario of `scripts/run.sh --demo`; sourced by run.sh once everything is ready.
#
# Uses API_URL, DEMO_KEY (org demo-e2e, every permission), STUB_URL (scripts/demo-stub.py) and
# STATE from run.sh. Everything goes through the public HTTP API; each stage waits for what it
# expects with a deadline and prints what it saw. demo_run returns non-zero when a stage did not
# happen in time.

DEMO_TIMEOUT=${OBX_DEMO_TIMEOUT:-90}

demo_api() { # METHOD PATH [BODY]
  curl -sS -X "$1" "$API_URL$2" -H "Authorization: Bearer $DEMO_KEY" -H 'Content-Type: application/json' \
    ${3:+-d "$3"}
}

demo_say() { printf 'demo: %s\n' "$*"; }

# Polls `jq -r FILTER` over GET PATH until it prints WANT; the last value in DEMO_GOT.
demo_wait() { # PATH FILTER WANT
  local deadline=$((SECONDS + DEMO_TIMEOUT))
  DEMO_GOT=""
  while [ "$SECONDS" -lt "$deadline" ]; do
    DEMO_GOT=$(demo_api GET "$1" | jq -r "$2" 2>/dev/null || true)
    [ "$DEMO_GOT" = "$3" ] && return 0
    sleep 0.3
  done
  demo_say "  timed out after ${DEMO_TIMEOUT}s waiting for $3 (last: ${DEMO_GOT:-nothing}) on GET $1"
  return 1
}

demo_inbox() { # EVENT_ID FIELD
  demo_api GET "/api/inbox?limit=1000" | jq -r --arg id "$1" ".items[] | select(._id.eventId == \$id) | .$2"
}

demo_calls() { curl -sS "$STUB_URL/calls" | jq -r --arg p "/erp/$1" '.[$p] // 0'; }

# Places an order; DEMO_EVENT receives its event id.
demo_order() { # ORDER_NUMBER
  local out
  out=$(demo_api POST /orders "{\"orderNumber\": \"$1\", \"customerEmail\": \"buyer@example.com\", \"amount\": \"149.90\"}")
  DEMO_EVENT=$(jq -r '.eventIds[0] // empty' <<<"$out")
  if [ -z "$DEMO_EVENT" ]; then
    demo_say "  POST /orders failed: $out"
    return 1
  fi
  demo_say "  POST /orders -> order $1, event $DEMO_EVENT"
}

demo_published() { # EVENT_ID
  demo_wait "/api/outbox?status=PUBLISHED&limit=1000" \
    ".items[] | select(._id == \"$1\") | .status" PUBLISHED || return 1
  local where
  where=$(demo_api GET "/api/outbox?status=PUBLISHED&limit=1000" |
    jq -r --arg id "$1" '.items[] | select(._id == $id) | "\(.kafka.topic) partition \(.kafka.partition) offset \(.kafka.offset)"')
  demo_say "  relay: outbox PUBLISHED -> Kafka $where"
}

demo_inbox_wait() { # EVENT_ID STATUS
  demo_wait "/api/inbox?limit=1000" ".items[] | select(._id.eventId == \"$1\") | .status" "$2"
}

demo_run() {
  local run n
  run=$(date +%H%M%S)
  echo
  demo_say "pipeline order.post for org demo-e2e: POST $STUB_URL/erp/{{orderNumber}}"
  demo_api POST /api/pipelines "{\"name\": \"demo-erp\", \"trigger\": \"order.post\", \"enabled\": true,
    \"nodes\": [{\"id\": \"start\", \"type\": \"start\"},
      {\"id\": \"notify\", \"type\": \"http-request\", \"config\": {\"method\": \"POST\",
        \"url\": \"$STUB_URL/erp/{{orderNumber}}\", \"body\": {\"number\": \"{{orderNumber}}\", \"total\": \"{{order.totalAmount}}\"}},
        \"onError\": \"abort\"},
      {\"id\": \"ok\", \"type\": \"set-status\", \"config\": {\"statusTag\": \"integrated\", \"name\": \"Integrated into the ERP\", \"phase\": \"order.post\"}}],
    \"edges\": [{\"from\": \"start\", \"to\": \"notify\"}, {\"from\": \"notify\", \"to\": \"ok\", \"branch\": \"success\"}]}" |
    jq -r '"demo:   created pipeline \(._id // .id // "?") version \(.version // "?")"'

  local ok="DEMO-OK-$run" flaky="DEMO-FLAKY-$run" dlq="DEMO-DLQ-$run" e_ok e_flaky e_dlq
  echo
  demo_say "1/3 an order integrated at once"
  demo_order "$ok" || return 1
  e_ok=$DEMO_EVENT
  demo_published "$e_ok" || return 1
  demo_inbox_wait "$e_ok" DONE || return 1
  demo_say "  worker: inbox DONE, ERP called $(demo_calls "$ok") time(s)"

  echo
  demo_say "2/3 an order whose ERP call fails twice (503) and recovers through the retry ladder"
  demo_order "$flaky" || return 1
  e_flaky=$DEMO_EVENT
  demo_published "$e_flaky" || return 1
  demo_inbox_wait "$e_flaky" RETRYING || return 1
  demo_say "  worker: inbox RETRYING, last error: $(demo_inbox "$e_flaky" lastError)"
  demo_inbox_wait "$e_flaky" DONE || return 1
  demo_say "  worker: inbox DONE after $(demo_calls "$flaky") ERP calls (tiers 1s, 2s)"

  echo
  demo_say "3/3 an order the ERP rejects (400, terminal): parked in the DLQ, redriven once fixed"
  demo_order "$dlq" || return 1
  e_dlq=$DEMO_EVENT
  demo_published "$e_dlq" || return 1
  demo_inbox_wait "$e_dlq" DEAD || return 1
  demo_wait "/api/dlq?eventId=$e_dlq" ".items[] | .eventId" "$e_dlq" || return 1
  local dl_id
  dl_id=$(demo_api GET "/api/dlq?eventId=$e_dlq" | jq -r '.items[0]._id')
  demo_say "  DLQ: $(demo_api GET "/api/dlq/$dl_id" | jq -r '"\(.failureClass): \(.lastError)"') (dead letter $dl_id)"
  curl -sS -X POST "$STUB_URL/control/fix" >/dev/null
  demo_say "  ERP fixed; POST /api/dlq/redrive {\"ids\": [\"$dl_id\"]} -> $(demo_api POST /api/dlq/redrive "{\"ids\": [\"$dl_id\"]}" | jq -c '{count, ids, redriveId}')"
  demo_inbox_wait "$e_dlq" DONE || return 1
  n=$(demo_calls "$dlq")
  demo_say "  worker: inbox DONE after the redrive, ERP called $n times"
  echo
  demo_say "done (GET $API_URL/api/inbox, /api/outbox, /api/dlq with the key in $STATE/demo-api-key)"
  printf '%s\n' "$DEMO_KEY" >"$STATE/demo-api-key"
  chmod 600 "$STATE/demo-api-key"
}
