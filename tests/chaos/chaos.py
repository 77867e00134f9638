#!/usr/bin/env python3
"""chaos.py - fault-injection scenarios for outboxd, each ending in one exact ledger.

NAME
  chaos.py - run a workload through separate outboxd processes (api, two relays, two workers)
  while a fault schedule runs, wait for quiescence, then print and assert the ledger.

SYNOPSIS
  chaos.py --build DIR [--scenario NAME ...] [--orders N] [--events N] [--keys N]
           [--cycles N] [--period S] [--seed N] [--raw KIND,...] [--quiet-timeout S] [--list]

DESCRIPTION
  Services: a private devmongod per scenario; Kafka from KAFKA_BROKERS (the real broker of
  scripts/kafka.sh; OBX_KAFKA_DIR names its directory so the broker scenario can stop and start
  it) or, without it, a private kafka-mockd; RabbitMQ from AMQP_URL (OBX_RMQ_DIR names the node
  of scripts/rabbitmq.sh, which the rabbitmq scenario stops and starts). Every scenario has its
  own database, topic, consumer group and RabbitMQ queue prefix, so scenarios share nothing.
  Each outboxd role connects to MongoDB as appName chaos-<role>, so failCommand can aim at one.

  Workload: N orders through POST /orders (their OrderConfirmed events run the order.post
  pipeline) and N third-party events written by this script through pymongo (another official
  MongoDB driver) in its own transactions, in the public outbox schema, over K keys with a
  per-key sequence number (their ChaosTick events run an event.ChaosTick pipeline). Both
  pipelines call one stub endpoint in this process, which records every call (start, end,
  answer, Idempotency-Key) and can answer 503, hang, or refuse poison events. The poison
  scenario mixes in poison of every class (POISON_CLASSES below): 400 answers (terminal), 503
  answers until the attempts run out (exhausted), third-party ChaosShip events whose pipeline's
  set-status names an order that does not exist (terminal), and records produced straight to
  the topic with confluent-kafka (RAW_KINDS: malformed ones, and an empty key).

  Ledger (one line per scenario; the assertions below are what "nothing lost, no side effect
  doubled, per-key order kept" means here):
    orders         orders accepted by POST /orders
    api / third    outbox events written by the API / by the third-party writer
    written        api + third (must equal their sum)
    raw            records produced straight to Kafka (each must have a dead letter of its class)
    kafka          distinct event ids read back from the topic (must equal written)
    done / dead    inbox entries DONE / DEAD (dead must be exactly the poison events, each with
                   a dead letter whose failureClass is the one its class must end in)
    dead_letters   documents in dead_letters
    effects        distinct Idempotency-Keys the endpoint answered 2xx for (= done events)
    concurrent     keys with two calls in flight at once (must be 0)
    repeats        keys answered 2xx more than once, one after the other (at-least-once
                   repeats, allowed only by the scenarios that kill a worker mid-call)
    inversions     third-party events whose first effect came after a later event of their key
    lost           written and neither DONE nor dead-lettered with a reason, plus raw records
                   without their dead letter (must be 0)
    faults         faults injected (kills, outages; for failCommand the times it fired)

EXIT
  0 when every ledger holds, 1 when one does not, 2 on bad usage or a missing prerequisite.

DESIGN: one process, one thread per concern (the stub server, the fault schedule, the workload);
every wait polls a condition with a deadline; the random schedule comes from --seed so a failing
run can be replayed with the same seed.
"""
import argparse
import atexit
import http.server
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from datetime import datetime, timezone

try:
    import pymongo
    from bson.codec_options import CodecOptions
    from pymongo.read_concern import ReadConcern
    from pymongo.write_concern import WriteConcern
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic
except ImportError as e:  # the venv of scripts/pyenv.sh has both
    print(f"chaos.py: {e}: run it with the interpreter of scripts/pyenv.sh", file=sys.stderr)
    sys.exit(2)

ORG = "chaos"
PARTITIONS = 4


def log(msg):
    print(f"chaos: {msg}", file=sys.stderr, flush=True)


def now():
    return time.monotonic()


def wait_for(cond, timeout, what, poll=0.1):
    """Polls cond() until true or timeout seconds pass; returns its last answer."""
    deadline = now() + timeout
    while True:
        got = cond()
        if got or now() >= deadline:
            if not got:
                log(f"timed out after {timeout:.0f}s waiting for {what}")
            return got
        time.sleep(poll)


# ---- processes -----------------------------------------------------------------------------

LIVE = set()     # every Proc started; the ones still running are killed when the harness exits


@atexit.register
def kill_leftovers():
    for proc in list(LIVE):
        proc.kill9()


class Proc:
    """A child process with its output in a log file; stopped on every exit path (kill_leftovers
    covers an interrupted run)."""

    def __init__(self, name, argv, logdir, env=None):
        self.name, self.argv, self.env = name, argv, env
        self.log_path = os.path.join(logdir, f"{name}.log")
        self.p = None
        self.starts = 0

    def start(self):
        self.starts += 1
        out = open(self.log_path, "a")
        out.write(f"---- start {self.starts}: {' '.join(self.argv)}\n")
        out.flush()
        env = dict(os.environ)
        env.update(self.env or {})
        self.p = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                                  start_new_session=True)
        out.close()
        LIVE.add(self)
        return self

    def alive(self):
        return self.p is not None and self.p.poll() is None

    def signal(self, sig):
        if self.alive():
            os.kill(self.p.pid, sig)

    def kill9(self):
        if self.alive():
            self.p.kill()
            self.p.wait()

    def stop(self, timeout=20):
        if not self.alive():
            return
        self.p.terminate()
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            log(f"{self.name} did not stop within {timeout}s of SIGTERM: SIGKILL")
            self.p.kill()
            self.p.wait()

    def log_text(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""


def read_port_file(path, timeout):
    def ready():
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return ""
    text = wait_for(ready, timeout, path)
    return text


# ---- the stub endpoint ---------------------------------------------------------------------

class Endpoint:
    """Records every call; answers as the current mode says ('ok', '503', 'hang')."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls = []          # dicts: ikey, event, key, seq, t0, t1, status
        self.mode = "ok"
        self.poison_fixed = False
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                t0 = now()
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                ikey = self.headers.get("Idempotency-Key") or (self.headers.get("X-Chaos-Event", "") + self.path)
                status = endpoint.answer(body, self.connection)
                rec = {"ikey": ikey, "event": self.headers.get("X-Chaos-Event"), "key": body.get("key"),
                       "seq": body.get("seq"), "t0": t0, "t1": now(), "status": status}
                with endpoint.lock:
                    endpoint.calls.append(rec)
                if status is None:      # the caller gave up while the call hung
                    self.close_connection = True
                    return
                out = json.dumps({"ok": status < 300}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, body, conn):
        # A poison tick names its answer ("400": terminal at once, "503": transient until its
        # attempts are exhausted); a poison order's email starts with "poison" (400).
        poison = str(body.get("poison", ""))
        if str(body.get("email", "")).startswith("poison"):
            poison = "400"
        if poison in ("400", "503") and not self.poison_fixed:
            return int(poison)
        mode = self.mode
        if mode == "503":
            return 503
        if mode == "hang":
            # Hold the call until the mode changes or the caller hangs up (its timeout).
            while self.mode == "hang":
                r, _, _ = select.select([conn], [], [], 0.05)
                if r:
                    try:
                        if conn.recv(1, socket.MSG_PEEK) == b"":
                            return None
                    except OSError:
                        return None
            return 200
        return 200

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def snapshot(self):
        with self.lock:
            return list(self.calls)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# ---- the stack -----------------------------------------------------------------------------

class Stack:
    """devmongod, Kafka, RabbitMQ names, the endpoint and the outboxd processes of one scenario."""

    def __init__(self, args, name, rng):
        self.args, self.name, self.rng = args, name, rng
        self.dir = tempfile.mkdtemp(prefix=f"obx-chaos-{name}-")
        tag = f"{name}-{args.seed}-{os.getpid()}"
        self.db = "chaos_" + name.replace("-", "_")
        self.topic = f"chaos-{tag}"
        self.group = f"chaos-{tag}"
        self.prefix = f"chaos.{tag}"
        self.procs = {}
        self.faults = 0          # faults injected (for failCommand: the times it fired)
        self.mockd = None
        self.endpoint = Endpoint()
        self.amqp_url = os.environ.get("AMQP_URL")
        if not self.amqp_url:
            raise SystemExit("chaos.py: AMQP_URL is not set (scripts/rabbitmq.sh start; source its env)")
        self.start_mongo()
        self.start_kafka()
        self.write_pipelines()
        self.make_key()

    # services
    def start_mongo(self):
        port_file = os.path.join(self.dir, "devmongod.port")
        self.mongod = Proc("devmongod", [os.path.join(self.args.build, "tests/fixtures/devmongo/devmongod"),
                                         "--port", "0", "--port-file", port_file], self.dir).start()
        port = read_port_file(port_file, 20)
        if not port:
            raise SystemExit("chaos.py: devmongod did not start; log: " + self.mongod.log_path)
        self.mongo_uri = f"mongodb://127.0.0.1:{port}/?replicaSet=rs0"
        self.client = pymongo.MongoClient(self.mongo_uri, serverSelectionTimeoutMS=10000)
        self.mdb = self.client[self.db]
        # A dead letter keeps a record's bytes as received: a header value that is not UTF-8 is
        # stored in a BSON string as it came, which pymongo only decodes with a replacing handler.
        self.dead_letters = self.mdb.get_collection(
            "dead_letters", codec_options=CodecOptions(unicode_decode_error_handler="backslashreplace"))

    def start_kafka(self):
        self.brokers = os.environ.get("KAFKA_BROKERS")
        if self.brokers:
            admin = AdminClient({"bootstrap.servers": self.brokers})
            fut = admin.create_topics([NewTopic(self.topic, PARTITIONS, 1)])[self.topic]
            fut.result(30)
            return
        bootstrap = os.path.join(self.dir, "kafka.bootstrap")
        self.mockd_control = os.path.join(self.dir, "kafka.control")
        self.mockd = Proc("kafka-mockd", [os.path.join(self.args.build, "tests/fixtures/kafka-mock/kafka-mockd"),
                                          "--topic", f"{self.topic}:{PARTITIONS}", "--bootstrap-file", bootstrap,
                                          "--control", self.mockd_control], self.dir).start()
        self.brokers = read_port_file(bootstrap, 30)
        if not self.brokers:
            raise SystemExit("chaos.py: kafka-mockd did not start; log: " + self.mockd.log_path)

    def mockd_cmd(self, line):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(self.mockd_control)
        s.sendall(line.encode() + b"\n")
        ans = s.recv(256).decode().strip()
        s.close()
        if ans != "ok":
            raise RuntimeError(f"kafka-mockd {line!r}: {ans}")

    def write_pipelines(self):
        pdir = os.path.join(self.dir, "pipelines")
        os.mkdir(pdir)

        def pipeline(name, trigger, path, body):
            return {"name": name, "orgId": ORG, "trigger": trigger, "enabled": True,
                    "nodes": [{"id": "start", "type": "start"},
                              {"id": "call", "type": "http-request", "onError": "abort",
                               "config": {"method": "POST", "url": self.endpoint.url(path),
                                          "headers": {"X-Chaos-Event": "{{event.id}}"}, "body": body}}],
                    "edges": [{"from": "start", "to": "call"}]}
        with open(os.path.join(pdir, "order.json"), "w") as f:
            json.dump(pipeline("chaos-order", "order.post", "/order",
                               {"number": "{{orderNumber}}", "email": "{{payload.customerEmail}}"}), f)
        with open(os.path.join(pdir, "tick.json"), "w") as f:
            json.dump(pipeline("chaos-tick", "event.ChaosTick", "/tick",
                               {"key": "{{payload.key}}", "seq": "{{payload.seq}}", "poison": "{{payload.poison}}"}), f)
        with open(os.path.join(pdir, "ship.json"), "w") as f:
            ship = pipeline("chaos-ship", "event.ChaosShip", "/ship", {})
            ship["nodes"][1] = {"id": "status", "type": "set-status",
                                "config": {"statusTag": "shipped", "name": "Shipped"}}
            ship["edges"][0]["to"] = "status"
            json.dump(ship, f)
        self.pipelines_dir = pdir

    def conf_args(self, role):
        a = self.args
        # appName per role: the mongo scenario aims failCommand at one role at a time.
        kv = {"mongo.uri": f"{self.mongo_uri}&appName=chaos-{role}", "mongo.db": self.db, "kafka.brokers": self.brokers,
              "kafka.topic": self.topic, "amqp.url": self.amqp_url, "worker.group": self.group,
              "worker.queue_prefix": self.prefix, "http.port": "0", "http.bind": "127.0.0.1",
              "api.keys_file": self.keys_file, "egress.allow_networks": "127.0.0.0/8",
              "egress.timeout": "2s", "worker.retry_ladder": a.ladder, "worker.attempts": str(a.attempts),
              "relay.lease": "3s", "outbox.poll_interval": "500ms", "log.level": "info"}
        out = []
        for k, v in kv.items():
            out += ["-X", f"{k}={v}"]
        return out

    def ctl(self, *argv, check=True):
        cmd = [os.path.join(self.args.build, "outboxctl")] + list(argv)
        env = dict(os.environ, MONGO_URI=self.mongo_uri, MONGO_DB=self.db, AMQP_URL=self.amqp_url,
                   KAFKA_BROKERS=self.brokers, KAFKA_TOPIC=self.topic, WORKER_GROUP=self.group,
                   WORKER_QUEUE_PREFIX=self.prefix, RETRY_LADDER=self.args.ladder)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise RuntimeError(f"outboxctl {' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
        return r

    def make_key(self):
        r = self.ctl("apikey", "new", "--org", ORG, "--perm", "*")
        key = line = None
        for ln in r.stdout.splitlines():
            if ln.startswith("key:"):
                key = ln.split(":", 1)[1].strip()
            if ln.startswith("line:"):
                line = ln.split(":", 1)[1].strip()
        self.keys_file = os.path.join(self.dir, "api-keys")
        with open(self.keys_file, "w") as f:
            f.write(line + "\n")
        self.api_key = key

    # outboxd
    def outboxd(self, name, roles):
        p = self.procs.get(name)
        if p is not None and p.alive():
            # never a second process under one name: it would share the first one's
            # worker.instance_id (Kafka fences the first, which still runs its events) and its
            # Proc would be lost, so nothing would ever stop it
            return p
        if p is None:
            argv = [os.path.join(self.args.build, "outboxd"), "--roles", roles] + self.conf_args(roles)
            if roles == "worker":   # static membership, as the production guide runs pods: a
                # restarted worker gets its partitions back at once (dynamic: after session.timeout.ms)
                argv += ["-X", f"worker.instance_id={self.group}-{name}"]
            p = self.procs[name] = Proc(name, argv, self.dir)
        return p.start()

    def start_outboxd(self):
        self.outboxd("api", "api")
        self.api_port = None

        def port():
            for ln in self.procs["api"].log_text().splitlines():
                if '"http listening"' in ln:
                    try:
                        self.api_port = int(json.loads(ln).get("port"))
                    except (ValueError, TypeError):
                        pass
            return self.api_port
        if not wait_for(port, 30, "the api to listen"):
            raise RuntimeError("api did not listen; log: " + self.procs["api"].log_path)
        if not wait_for(lambda: self.http("GET", "/readyz")[0] == 200, 60, "api /readyz"):
            raise RuntimeError("api not ready; log: " + self.procs["api"].log_path)
        self.ctl("pipelines", "apply", self.pipelines_dir, "-X", f"mongo.uri={self.mongo_uri}", "-X", f"mongo.db={self.db}")
        for n in ("relay-1", "relay-2"):
            self.outboxd(n, "relay")
        for n in ("worker-1", "worker-2"):
            self.outboxd(n, "worker")

    def http(self, method, path, body=None, headers=None):
        req = urllib.request.Request(f"http://127.0.0.1:{self.api_port}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode())
        req.add_header("Authorization", f"Bearer {self.api_key}")
        req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, {}
        except (urllib.error.URLError, OSError, ValueError):
            return 0, {}

    def close(self):
        for p in reversed(list(self.procs.values())):
            p.stop()
        self.endpoint.close()
        self.client.close()
        if self.mockd:
            self.mockd.stop()
        self.mongod.stop()


# ---- workload ------------------------------------------------------------------------------

# Poison classes a scenario can mix into its workload, each with the dead-letter class
# (x-failure-class, dead_letters.failureClass) it must end in:
#   4xx            orders and ticks the endpoint refuses with 400 -> terminal
#   exhausted      ticks the endpoint answers 503 until their attempts run out -> exhausted
#   missing-order  third-party events whose pipeline's set-status names an order that does not
#                  exist -> terminal
#   malformed      records produced straight to the topic (confluent-kafka) that do not decode
#                  or cannot be stored: a header value that is not UTF-8, no CloudEvent headers,
#                  a record key over 1 KB, more than 24 headers, a payload key starting with "$"
#                  -> malformed (no inbox entry: only a dead letter)
POISON_CLASSES = ("4xx", "exhausted", "missing-order", "malformed")
DEAD_CLASS = {"4xx": "terminal", "exhausted": "exhausted", "missing-order": "terminal", "malformed": "malformed"}
# Records produced straight to the topic, and the dead-letter class each must end in: the
# malformed ones, and an empty record key (a key like any other: the record decodes, and its
# payload lacks what the pipeline's template reads, a terminal failure). empty-header (a header
# with an empty name) is not in the default set, so the long run's counts stay comparable
# (`--raw all` adds it; its dead letter is stored like the others, see README).
RAW_KINDS = {"non-utf8-header": "malformed", "not-a-cloudevent": "malformed", "key-over-1kb": "malformed",
             "too-many-headers": "malformed", "empty-key": "terminal", "empty-header": "malformed"}
RAW_DEFAULT = ("non-utf8-header", "not-a-cloudevent", "key-over-1kb", "too-many-headers", "empty-key")


class Workload:
    """Writes the orders and third-party events (and the poison of the scenario's classes);
    remembers every id it wrote and the dead-letter class each poison event must end in."""

    def __init__(self, stack, n_orders, n_events, n_keys, poison_every, classes, rng):
        self.stack = stack
        self.n_orders, self.n_events, self.n_keys = n_orders, n_events, n_keys
        self.poison_every = poison_every if classes else 0
        self.classes = classes
        self.rng = rng            # the workload's own generator: ids and choices replay with --seed
        self.event_ids = {}       # event id -> "order" | "tick" | "ship"
        self.key_of = {}          # event id -> partition key
        self.poison_ids = set()
        self.poison_class = {}    # event id or malformed marker -> the dead-letter class it must end in
        self.raw = {}             # marker -> kind, of the records produced straight to Kafka
        self.orders = 0
        self.by_api = self.by_third_party = 0
        self.seq = {}
        self.lock = threading.Lock()
        self.producer = None

    def new_id(self):
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def place_order(self, i):
        poison = "4xx" in self.classes and i % self.poison_every == self.poison_every - 1
        email = f"{'poison' if poison else 'c'}{i}@chaos.test"   # the endpoint refuses poison* for good
        body = {"customerEmail": email, "amount": "10.00", "orderNumber": f"C-{i:05d}"}
        key = f"chaos-{self.stack.args.seed}-{i}"
        for attempt in range(30):   # a client retries with its Idempotency-Key until it gets an answer
            status, reply = self.stack.http("POST", "/orders", body, {"Idempotency-Key": key})
            if status == 201 or (status == 200 and reply.get("id")):
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"order {i} was never accepted (last status {status})")
        order = self.stack.mdb.orders.find_one({"orderNumber": body["orderNumber"], "orgId": ORG})
        with self.lock:
            self.orders += 1
            for ev in order.get("eventIds", reply.get("eventIds", [])):
                self.by_api += 1
                self.event_ids[ev] = "order"
                self.key_of[ev] = order["_id"]
                if poison:
                    self.poison_ids.add(ev)
                    self.poison_class[ev] = DEAD_CLASS["4xx"]

    def third_party_write(self, doc, side_effect):
        """Inserts doc in the public outbox schema in a transaction of its own (pymongo), with
        side_effect(db, session), the writer's own business write."""
        client = self.stack.client
        with client.start_session() as s:
            def txn(sess):
                db = client[self.stack.db]
                side_effect(db, sess)
                db.outbox.insert_one(doc, session=sess)
            s.with_transaction(txn, read_concern=ReadConcern("snapshot"),
                               write_concern=WriteConcern("majority"))
        with self.lock:
            self.by_third_party += 1

    def outbox_doc(self, ev_id, etype, agg_type, agg_id, key, payload):
        t = datetime.now(timezone.utc)
        return {"_id": ev_id, "eventType": etype, "eventVersion": 1, "orgId": ORG,
                "aggregateType": agg_type, "aggregateId": agg_id, "partitionKey": key,
                "correlationId": None, "causationId": None, "payload": payload,
                "occurredAt": t, "status": "PENDING", "attempts": 0, "availableAt": t, "lastError": None}

    def tick_poison(self, i):
        """The poison class of tick i: at most one per key (the third event of every other key),
        so it heads its key; the classes the endpoint decides (4xx, exhausted) alternate."""
        tick_classes = [c for c in ("4xx", "exhausted") if c in self.classes]
        if not tick_classes or i // self.n_keys != 2 or (i % self.n_keys) % 2:
            return None
        return tick_classes[(i % self.n_keys) // 2 % len(tick_classes)]

    def write_tick(self, i):
        key = f"k{i % self.n_keys}"
        with self.lock:
            seq = self.seq.get(key, 0) + 1
            self.seq[key] = seq
        cls = self.tick_poison(i)
        ev_id = self.new_id()
        answer = {"4xx": "400", "exhausted": "503"}.get(cls, "")
        doc = self.outbox_doc(ev_id, "ChaosTick", "Thing", key, key, {"key": key, "seq": seq, "poison": answer})
        self.third_party_write(doc, lambda db, sess: db.things.update_one({"_id": key}, {"$set": {"seq": seq}},
                                                                            upsert=True, session=sess))
        with self.lock:
            self.event_ids[ev_id] = "tick"
            self.key_of[ev_id] = key
            if cls:
                self.poison_ids.add(ev_id)
                self.poison_class[ev_id] = DEAD_CLASS[cls]

    def write_ship(self, i):
        """A third-party OrderShipped-like event about an order that does not exist: its
        pipeline's set-status cannot record the status (terminal, a key of its own)."""
        ev_id = self.new_id()
        missing = self.new_id()
        key = f"ship-{i}"
        doc = self.outbox_doc(ev_id, "ChaosShip", "Order", missing, key, {"order": missing})
        self.third_party_write(doc, lambda db, sess: db.shipments.insert_one({"_id": ev_id, "order": missing},
                                                                              session=sess))
        with self.lock:
            self.event_ids[ev_id] = "ship"
            self.key_of[ev_id] = key
            self.poison_ids.add(ev_id)
            self.poison_class[ev_id] = DEAD_CLASS["missing-order"]

    def produce_raw(self, i):
        """One record of kind --raw[i % n] straight to the topic; its marker (the record's ce_id,
        also in its value) finds its dead letter."""
        kinds = self.stack.args.raw
        kind = kinds[i % len(kinds)]
        marker = self.new_id()      # a valid ce_id (36 characters): the record is malformed for its kind only
        key = f"bad-{i}".encode()
        value = json.dumps({"marker": marker}).encode()
        ce = [("ce_specversion", b"1.0"), ("ce_id", marker.encode()), ("ce_source", b"/chaos/producer"),
              ("ce_type", b"ChaosTick"), ("ce_time", datetime.now(timezone.utc).isoformat().encode()),
              ("ce_orgid", ORG.encode()), ("ce_partitionkey", key), ("content-type", b"application/json")]
        subject = ("ce_subject", b"Thing/\xff\xfe\xc3(" if kind == "non-utf8-header" else b"Thing/" + key)
        ce.append(subject)
        if kind == "non-utf8-header":
            headers = ce
        elif kind == "not-a-cloudevent":
            headers = [("content-type", b"application/json")]
        elif kind == "key-over-1kb":
            key = (f"bad-{i}-" + "k" * 1100).encode()
            headers = [(k, key if k == "ce_partitionkey" else v) for k, v in ce]
        elif kind == "too-many-headers":
            headers = ce + [(f"x-extra-{n}", b"v") for n in range(25)]
        elif kind == "empty-header":     # decodes, but the inbox document cannot hold the header
            headers = ce + [("", b"1")]
        else:   # empty-key
            key = b""
            headers = [(k, key if k == "ce_partitionkey" else v) for k, v in ce]
        if self.producer is None:
            self.producer = Producer({"bootstrap.servers": self.stack.brokers, "acks": "all",
                                      "message.timeout.ms": 60000})
        errors = []
        self.producer.produce(self.stack.topic, value=value, key=key, headers=headers,
                              on_delivery=lambda err, msg: err and errors.append(err))
        left = self.producer.flush(90)
        if left or errors:
            raise RuntimeError(f"malformed record {marker} not delivered: {errors or 'flush timed out'}")
        with self.lock:
            self.raw[marker] = kind
            self.poison_class[marker] = RAW_KINDS[kind]

    def run(self, pace):
        """Interleaves orders, ticks and the poison of the scenario's classes; pace seconds
        between writes (the faults run meanwhile)."""
        n_ship = -(-self.n_events // 20) if "missing-order" in self.classes else 0
        n_raw = len(self.stack.args.raw) * -(-self.n_events // 40) if "malformed" in self.classes else 0
        kinds = {"o": (self.n_orders, self.place_order), "t": (self.n_events, self.write_tick),
                 "s": (n_ship, self.write_ship), "m": (n_raw, self.produce_raw)}
        jobs = [(k, i) for k, (n, _) in kinds.items() for i in range(n)]
        # Spread each kind over the run (the fraction of its kind done), ties in a fixed order.
        jobs.sort(key=lambda j: ((j[1] + 0.5) / kinds[j[0]][0], j[0]))
        for kind, i in jobs:
            kinds[kind][1](i)
            time.sleep(pace)


# ---- ledger --------------------------------------------------------------------------------

def kafka_ids(stack, want, timeout):
    c = Consumer({"bootstrap.servers": stack.brokers, "group.id": f"ledger-{uuid.uuid4()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([stack.topic])
    ids, records = set(), 0
    deadline = now() + timeout
    while now() < deadline and not want.issubset(ids):
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        records += 1
        for k, v in (m.headers() or []):
            if k == "ce_id":
                ids.add(v.decode(errors="replace"))
    c.close()
    return ids, records


def inbox_status(stack):
    out = {}
    for e in stack.mdb.inbox.find({}, {"status": 1, "lastError": 1}):
        ev = e["_id"]["eventId"] if isinstance(e["_id"], dict) else e.get("eventId")
        out[ev] = (e.get("status"), e.get("lastError"))
    return out


def parked_keys(stack):
    return {d["_id"]["key"] if isinstance(d["_id"], dict) else d.get("key") for d in stack.mdb.parked_keys.find({})}


def settled(stack, work, allow_parked):
    """Every written event is DONE or DEAD, or (allow_parked) BLOCKED behind a parked key, and
    every malformed record is dead-lettered."""
    st = inbox_status(stack)
    parked = parked_keys(stack) if allow_parked else set()
    for ev, kind in work.event_ids.items():
        s = st.get(ev, (None,))[0]
        if s in ("DONE", "DEAD"):
            continue
        if s == "BLOCKED" and work.key_of[ev] in parked:
            continue
        return False
    # and every record produced straight to Kafka has its dead letter
    return not work.raw or set(work.raw) <= set(dead_letter_index(stack, work))


def quiesce(stack, work, timeout, allow_parked=False):
    return wait_for(lambda: settled(stack, work, allow_parked), timeout, "every event settled", poll=0.5)


def dead_letter_index(stack, work):
    """{event id or malformed marker: [(failureClass, reason)]} of the dead_letters documents."""
    out = {}
    markers = list(work.raw)
    for d in stack.dead_letters.find({}):
        entry = (d.get("failureClass"), d.get("reason") or d.get("lastError"))
        ev = d.get("eventId")
        if ev in work.event_ids:
            out.setdefault(ev, []).append(entry)
            continue
        text = repr(d)     # a malformed record's marker is in its id, key or body, as stored
        for m in markers:
            if m in text:
                out.setdefault(m, []).append(entry)
                break
    return out


def ledger(stack, work, allowed):
    kafka, records = kafka_ids(stack, set(work.event_ids), 30)
    st = inbox_status(stack)
    letters = dead_letter_index(stack, work)
    calls = stack.endpoint.snapshot()
    by_key = {}
    for c in calls:
        by_key.setdefault(c["ikey"], []).append(c)
    concurrent = repeats = 0
    twice = []
    for ikey, lst in by_key.items():
        lst.sort(key=lambda c: c["t0"])
        if any(lst[i + 1]["t0"] < lst[i]["t1"] for i in range(len(lst) - 1)):
            concurrent += 1
        if sum(1 for c in lst if c["status"] and c["status"] < 300) > 1:
            repeats += 1
            twice.append(ikey)
    effects = sum(1 for lst in by_key.values() if any(c["status"] and c["status"] < 300 for c in lst))
    # First effect per (key, seq), in the order the endpoint answered them.
    first = {}
    for c in sorted(calls, key=lambda c: c["t1"]):
        if c["key"] is None or not (c["status"] and c["status"] < 300):
            continue
        first.setdefault((c["key"], int(c["seq"])), c["t1"])
    inversions = 0
    keys = {}
    for (k, seq), t in first.items():
        keys.setdefault(k, []).append((t, seq))
    for lst in keys.values():
        top = 0
        for _, seq in sorted(lst):
            if seq < top:
                inversions += 1
            top = max(top, seq)
    done = sum(1 for ev in work.event_ids if st.get(ev, (None,))[0] == "DONE")
    dead = {ev for ev in work.event_ids if st.get(ev, (None,))[0] == "DEAD"}

    def lettered(ev):    # dead-lettered with a reason (and, for poison, in the class it must end in)
        want = work.poison_class.get(ev)
        return any(reason and (want is None or cls == want) for cls, reason in letters.get(ev, []))
    # Lost: written and neither DONE nor dead-lettered with a reason; a record produced straight
    # to Kafka is lost unless it has a dead letter of its class with a reason.
    lost = [ev for ev in work.event_ids if st.get(ev, (None,))[0] != "DONE" and not (ev in dead and lettered(ev))]
    lost += [m for m in work.raw if not lettered(m)]
    for m, kind in sorted(work.raw.items(), key=lambda kv: kv[1])[:len(RAW_KINDS)]:
        log(f"raw record {kind}: {letters.get(m)}")
    try:
        dead_letters = stack.dead_letters.count_documents({})
    except pymongo.errors.PyMongoError:
        dead_letters = -1
    row = {"orders": work.orders, "api": work.by_api, "third": work.by_third_party, "written": len(work.event_ids),
           "kafka": len(kafka & set(work.event_ids)), "records": records, "raw": len(work.raw),
           "done": done, "dead": len(dead), "poison": len(work.poison_ids), "dead_letters": dead_letters,
           "effects": effects, "concurrent": concurrent, "repeats": repeats, "inversions": inversions,
           "lost": len(lost)}
    problems = []
    if row["kafka"] != row["written"]:
        problems.append(f"{row['written'] - row['kafka']} written events never reached Kafka")
    if row["api"] + row["third"] != row["written"]:
        problems.append(f"written {row['written']} != api {row['api']} + third party {row['third']}")
    if lost:
        problems.append(f"lost {len(lost)} (e.g. {lost[:3]}: {[(st.get(e), letters.get(e)) for e in lost[:3]]})")
    if dead != work.poison_ids:
        problems.append(f"dead {sorted(dead - work.poison_ids)[:3]} are not poison; poison not dead "
                        f"{sorted(work.poison_ids - dead)[:3]}")
    wrong = {ev: letters.get(ev) for ev in work.poison_class if not lettered(ev)}
    if wrong:
        problems.append(f"{len(wrong)} poison events without a dead letter of their class "
                        f"(e.g. {[(ev, work.poison_class[ev], got) for ev, got in list(wrong.items())[:3]]})")
    if effects != done:
        problems.append(f"effects {effects} != done {done}")
    if concurrent:
        problems.append(f"{concurrent} events ran twice at once")
    if repeats and "repeats" not in allowed:
        problems.append(f"{repeats} side effects repeated (e.g. {twice[:3]})")
    if inversions and "inversions" not in allowed:
        problems.append(f"{inversions} per-key inversions")
    return row, problems


# ---- faults --------------------------------------------------------------------------------

def relay_leader(stack, timeout=30):
    """The relay process holding the lease (owner "host:pid:serial"), waiting with a deadline
    for a live one (after a kill the standby takes over once the lease expires)."""
    def holder():
        doc = stack.mdb.leases.find_one({"_id": "relay"}) or {}
        parts = str(doc.get("owner", "")).split(":")
        pid = parts[-2] if len(parts) >= 3 else ""
        for n in ("relay-1", "relay-2"):
            p = stack.procs[n]
            if p.alive() and str(p.p.pid) == pid:
                return n
        return None
    return wait_for(holder, timeout, "a live relay leader")


def repeat(stack, stop, cycles, period, action):
    for i in range(cycles):
        if stop.wait(period):
            return
        if action(i) is not False:     # False: nothing to inject this time (not counted)
            stack.faults += 1


def fault_relay_kill(stack, stop, a):
    """Two kill -9s of the relay leader per cycle, each of the process that holds the lease;
    each kill after the first comes --period after the previous one's successor took over."""
    def act(i):
        if i and not relay_leader(stack):
            raise RuntimeError(f"no relay leader took over after kill {i}")
        if i and stop.wait(a.period):
            return
        n = relay_leader(stack)
        if not n:
            raise RuntimeError(f"no live relay leader to kill (kill {i + 1})")
        log(f"kill -9 {n}, the relay leader (kill {i + 1})")
        stack.procs[n].kill9()
        stack.outboxd(n, "relay")
    repeat(stack, stop, 2 * a.cycles, a.period / 2, act)


def fault_worker_kill(stack, stop, a):
    """Two kill -9s of a worker per cycle (either one, as the seed picks)."""
    def act(i):
        n = stack.rng.choice(["worker-1", "worker-2"])
        log(f"kill -9 {n} (kill {i + 1})")
        stack.procs[n].kill9()
        stack.outboxd(n, "worker")
    repeat(stack, stop, 2 * a.cycles, a.period / 2, act)


def fault_kafka(stack, stop, a):
    kdir = os.environ.get("OBX_KAFKA_DIR")

    def act(i):
        log(f"Kafka broker down (cycle {i + 1})")
        if stack.mockd:
            stack.mockd_cmd("broker down all")
        else:
            subprocess.run([os.path.join(a.root, "scripts/kafka.sh"), "stop"], env=dict(os.environ, OBX_KAFKA_DIR=kdir),
                           check=True, capture_output=True)
        stop.wait(a.outage)
        log("Kafka broker up")
        if stack.mockd:
            stack.mockd_cmd("broker up all")
        else:
            subprocess.run([os.path.join(a.root, "scripts/kafka.sh"), "start"], env=dict(os.environ, OBX_KAFKA_DIR=kdir),
                           check=True, capture_output=True)
    if not stack.mockd and not kdir:
        raise SystemExit("chaos.py: the kafka scenario needs OBX_KAFKA_DIR (the broker of scripts/kafka.sh)")
    repeat(stack, stop, a.cycles, a.period, act)


def fault_rabbitmq(stack, stop, a):
    rdir = os.environ.get("OBX_RMQ_DIR")
    if not rdir:
        raise SystemExit("chaos.py: the rabbitmq scenario needs OBX_RMQ_DIR (the node of scripts/rabbitmq.sh)")
    # A broker comes back on its own port: the one AMQP_URL names.
    port = urllib.parse.urlsplit(stack.amqp_url).port
    env = dict(os.environ, OBX_RMQ_DIR=rdir, OBX_RMQ_PORT=str(port))

    def act(i):
        stack.endpoint.mode = "503"     # events climb into the retry tiers
        stop.wait(a.period)
        # the window lasts --period and until an event sits in the tiers: the first events may
        # reach a worker only after --period (a relay taking its lease), and a cycle after the
        # workload finds none within the bound
        wait_for(lambda: stack.mdb.inbox.count_documents({"status": "RETRYING"}) > 0, 10,
                 "an event in the retry tiers", poll=0.2)
        in_tiers = stack.mdb.inbox.count_documents({"status": "RETRYING"})
        stack.endpoint.mode = "ok"     # the 503 window is --period; the tiers still hold its events
        if not in_tiers:   # the workload is over: nothing would sit in the tiers
            log(f"no event in the retry tiers: the node stays up (cycle {i + 1})")
            return False
        log(f"RabbitMQ node down with {in_tiers} events in the tiers (cycle {i + 1})")
        subprocess.run([os.path.join(a.root, "scripts/rabbitmq.sh"), "stop"], env=env, check=True, capture_output=True)
        stop.wait(a.outage)
        log("RabbitMQ node up")
        subprocess.run([os.path.join(a.root, "scripts/rabbitmq.sh"), "start"], env=env, check=True, capture_output=True)
        # The tiers drain before the next cycle answers 503 again (else their retries, released
        # when the node is back, meet the next 503 window and run out of attempts).
        if not wait_for(lambda: not stack.mdb.inbox.count_documents({"status": "RETRYING"}), a.quiet_timeout,
                        "the retry tiers to drain after the restart", poll=0.5):
            raise RuntimeError(f"events still in the retry tiers {a.quiet_timeout:.0f}s after the restart (cycle {i + 1})")
    repeat(stack, stop, a.cycles, 0.1, act)
    if not stack.faults:
        raise RuntimeError("no cycle found events in the retry tiers: the scenario injected nothing")


def fault_endpoint(mode):
    def f(stack, stop, a):
        def act(i):
            log(f"endpoint {mode} for {a.outage:.0f}s (cycle {i + 1})")
            stack.endpoint.mode = mode
            stop.wait(a.outage)
            stack.endpoint.mode = "ok"
            log("endpoint ok")
        repeat(stack, stop, a.cycles, a.period, act)
    return f


def fault_rebalance(stack, stop, a):
    def act(i):
        w3 = stack.procs.get("worker-3")
        if w3 is not None and w3.alive():
            log(f"worker-3 is still in the group (cycle {i + 1})")
        else:
            log(f"worker-3 joins (cycle {i + 1})")
            stack.outboxd("worker-3", "worker")
        stop.wait(a.period)
        n = stack.rng.choice(["worker-1", "worker-2", "worker-3"])
        log(f"{n} leaves (SIGTERM)")
        stack.procs[n].stop()
        stack.outboxd(n, "worker") if n != "worker-3" else None
    repeat(stack, stop, a.cycles, a.period, act)


def fault_mongo(stack, stop, a):
    """failCommand on the server, aimed at one role at a time by its appName (each outboxd role
    connects as chaos-<role>): commits answered with the UnknownTransactionCommitResult and
    TransientTransactionError labels (api and worker, the roles that run transactions) and
    closed connections (api, worker, relay). Each step is armed for 3 firings and polled until
    they happened or its deadline passed; every (role, fault) must have fired."""
    commit = ["commitTransaction"]
    ops = ["insert", "update", "find", "getMore", "aggregate", "findAndModify"]
    kinds = {"commit-unknown": {"failCommands": commit, "errorCode": 91, "errorLabels": ["UnknownTransactionCommitResult"]},
             "commit-transient": {"failCommands": commit, "errorCode": 112, "errorLabels": ["TransientTransactionError"]},
             "close": {"failCommands": ops, "closeConnection": True}}
    steps = [(role, kind) for role in ("api", "worker") for kind in kinds] + [("relay", "close")]
    fired = {step: 0 for step in steps}

    def arm(mode, data):
        reply = stack.client.admin.command({"configureFailPoint": "failCommand", "mode": mode, "data": data})
        return int(reply.get("count", 0))

    for cycle in range(a.cycles):
        for role, kind in steps:
            if stop.wait(a.period / len(steps)):
                break
            data = dict(kinds[kind], appName=f"chaos-{role}")
            log(f"failCommand {kind} on the {role} x3 (cycle {cycle + 1})")
            arm({"times": 3}, data)
            got = 0
            deadline = now() + max(a.period, 5)
            while got < 3 and now() < deadline and not stop.wait(0.2):
                got += arm({"times": 3 - got}, data)   # re-arming reads the firings so far
            got += arm("off", {})
            fired[(role, kind)] += got
    stack.faults = sum(fired.values())
    log("failCommand fired: " + ", ".join(f"{r}/{k} {n}" for (r, k), n in fired.items()))
    never = [f"{r}/{k}" for (r, k), n in fired.items() if not n]
    if never:
        raise RuntimeError(f"failCommand never fired on {', '.join(never)}: the scenario injected nothing there")


SCENARIOS = {
    # name: (fault, poison classes mixed in, departures the README allows ("repeats": at-least-once
    # repeats; "inversions": per-key order), what it shows)
    "baseline": (None, (), set(), "no fault: the ledger of a clean run"),
    "relay-kill": (fault_relay_kill, (), set(), "kill -9 of the relay leader, twice per cycle"),
    "worker-kill": (fault_worker_kill, (), {"repeats"}, "kill -9 of a worker, twice per cycle (a call in flight may repeat)"),
    "kafka": (fault_kafka, (), set(), "the Kafka broker stopped and started again"),
    "rabbitmq": (fault_rabbitmq, (), set(), "RabbitMQ stopped while events sit in the retry tiers"),
    "endpoint-503": (fault_endpoint("503"), (), set(), "the endpoint answers 503 for a while, then 200"),
    "endpoint-hang": (fault_endpoint("hang"), (), set(), "the endpoint hangs past the call timeout, then answers"),
    "poison": (None, POISON_CLASSES, set(), "poison of every class (4xx, exhausted, missing order, malformed "
               "records) ends dead-lettered in its class while the other keys flow"),
    "redrive": (None, ("4xx",), set(), "dead letters redriven unfixed (dead again), then fixed (done)"),
    "rebalance": (fault_rebalance, (), set(), "a worker joins and one leaves mid-run"),
    "mongo": (fault_mongo, (), set(), "failCommand: commit labels and closed connections on the api, relay and worker"),
}


def redrive_all(stack, work):
    """Redrives every dead letter; returns (endpoint calls of the redriven events, dead letters)."""
    before = len(stack.endpoint.snapshot())
    heads = {ev for ev, (s, _) in inbox_status(stack).items() if s == "DEAD" and ev in work.event_ids}

    def calls():
        return sum(1 for c in stack.endpoint.snapshot()[before:] if c["event"] in heads)
    r = stack.ctl("dlq", "redrive", "--all", check=False)
    said = " ".join((r.stdout + r.stderr).split())
    log(f"dlq redrive --all: exit {r.returncode}: {said[-120:]}")
    # Each redriven head is called once more; wait for those calls, then for the events to settle.
    wait_for(lambda: calls() >= len(heads), stack.args.quiet_timeout, "one call per redriven dead letter", poll=0.2)
    quiesce(stack, work, stack.args.quiet_timeout, allow_parked=True)
    return calls(), len(heads)


def release_parked(stack):
    keys = sorted(parked_keys(stack))
    for k in keys:
        stack.ctl("keys", "release", k)
    return keys


def run_scenario(args, name):
    fault, poison, allowed, what = SCENARIOS[name]
    rng = random.Random(f"{args.seed}-{name}")
    log(f"== {name}: {what} (seed {args.seed})")
    stack = Stack(args, name, rng)
    problems = []
    row = {}
    try:
        stack.start_outboxd()
        work = Workload(stack, args.orders, args.events, args.keys, args.poison_every, poison,
                        random.Random(f"{args.seed}-{name}-workload"))
        stop = threading.Event()
        th = None
        fault_errors = []

        def run_fault():
            try:
                fault(stack, stop, args)
            except BaseException as e:  # SystemExit included: a missing prerequisite fails the scenario
                fault_errors.append(f"fault schedule: {type(e).__name__}: {e}")
        if fault:
            th = threading.Thread(target=run_fault, daemon=True)
            th.start()
        t0 = now()
        work.run(args.pace)
        if th:
            th.join()
        problems += fault_errors
        if not quiesce(stack, work, args.quiet_timeout, allow_parked=bool(poison)):
            problems.append("not quiescent within the deadline")
        parked = sum(1 for ev in work.event_ids if inbox_status(stack).get(ev, (None,))[0] == "BLOCKED")
        if name == "redrive":
            runs, n = redrive_all(stack, work)
            if runs != n:
                problems.append(f"redrive of {n} unfixed dead letters made {runs} endpoint calls (want {n})")
            stack.endpoint.poison_fixed = True
            runs, n = redrive_all(stack, work)
            if runs != n:
                problems.append(f"redrive of {n} fixed dead letters made {runs} endpoint calls (want {n})")
            work.poison_ids, work.poison_class = set(), {}   # fixed: every event must now be DONE
        elif poison:
            log(f"releasing parked keys {release_parked(stack)}")
        if not quiesce(stack, work, args.quiet_timeout):
            problems.append("not quiescent within the deadline after the operator's action")
        row, more = ledger(stack, work, allowed)
        row["parked"] = parked
        row["faults"] = stack.faults
        row["seconds"] = round(now() - t0, 1)
        problems += more
    except Exception as e:  # a harness failure is a failed scenario, with its logs kept
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        stack.close()
    ok = not problems
    if ok:
        subprocess.run(["rm", "-rf", stack.dir])
    else:
        log(f"{name}: logs kept in {stack.dir}")
    return name, row, problems


COLS = ["orders", "api", "third", "written", "raw", "kafka", "done", "dead", "parked", "dead_letters", "effects", "concurrent", "repeats",
        "inversions", "lost", "faults", "seconds"]


def ladder_span(ladder, attempts):
    """Seconds from an event's first attempt to its last (the tiers' delays, the last tier
    repeated), or None when a tier is not a duration (e.g. "500ms", "2s", "1m")."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    delays = []
    for t in ladder.split(","):
        num = t.rstrip("mshd")
        unit = t[len(num):]
        try:
            delays.append(float(num) * units[unit])
        except (ValueError, KeyError):
            return None
    return sum(delays[min(i, len(delays) - 1)] for i in range(attempts - 1))


def main():
    ap = argparse.ArgumentParser(description="outboxd fault-injection scenarios with a ledger")
    ap.add_argument("--build", required=True, help="build directory (outboxd, outboxctl, devmongod, kafka-mockd)")
    ap.add_argument("--scenario", action="append", help="scenario to run (repeatable; default: all)")
    ap.add_argument("--orders", type=int, default=20)
    ap.add_argument("--events", type=int, default=40, help="third-party events")
    ap.add_argument("--keys", type=int, default=5, help="keys of the third-party events")
    ap.add_argument("--cycles", type=int, default=1, help="repetitions of each scenario's fault")
    ap.add_argument("--period", type=float, default=2.0, help="seconds between faults")
    ap.add_argument("--outage", type=float, default=4.0, help="seconds a service stays down")
    ap.add_argument("--pace", type=float, default=0.05, help="seconds between workload writes")
    ap.add_argument("--poison-every", type=int, default=10)
    ap.add_argument("--raw", default=",".join(RAW_DEFAULT),
                    help=f"kinds of records the poison scenario produces straight to Kafka ({', '.join(RAW_KINDS)}, or all)")
    ap.add_argument("--ladder", default="1s,2s,4s", help="retry tiers (their sum outlasts --outage)")
    ap.add_argument("--attempts", type=int, default=5)
    ap.add_argument("--seed", type=int, default=int(os.environ.get("OBX_CHAOS_SEED", "1")))
    ap.add_argument("--quiet-timeout", type=float, default=120)
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = ap.parse_args()
    args.raw = list(RAW_KINDS) if args.raw == "all" else args.raw.split(",")
    if not args.raw or not set(args.raw) <= set(RAW_KINDS):
        print(f"chaos.py: --raw: want kinds of {', '.join(RAW_KINDS)} (or all), got '{','.join(args.raw)}'",
              file=sys.stderr)
        return 2
    args.root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if args.list:
        for n, (_, _, _, what) in SCENARIOS.items():
            print(f"{n:14} {what}")
        return 0
    names = args.scenario or list(SCENARIOS)
    for n in names:
        if n not in SCENARIOS:
            print(f"chaos.py: unknown scenario '{n}' (--list shows them)", file=sys.stderr)
            return 2
    # The 503 windows (rabbitmq: --period, endpoint-503: --outage) must end before an event's
    # attempts do, or the ledger rightly finds them exhausted: refuse such a schedule up front.
    span = ladder_span(args.ladder, args.attempts)
    window = max([args.period] * ("rabbitmq" in names) + [args.outage] * ("endpoint-503" in names) + [0])
    if span is None or (window and span <= window):
        print(f"chaos.py: --ladder {args.ladder} with --attempts {args.attempts} retries for "
              f"{span if span is not None else '?'} s, not longer than the {window} s an endpoint answers 503 "
              f"(--period/--outage): lengthen the ladder", file=sys.stderr)
        return 2
    results = []
    for n in names:
        results.append(run_scenario(args, n))
        _, row, problems = results[-1]
        log(f"{n}: {'ok' if not problems else 'FAIL'} " + " ".join(f"{c}={row.get(c, '-')}" for c in COLS))
    print(f"{'scenario':14} " + " ".join(f"{c:>10}" for c in COLS) + "  result")
    failed = 0
    for name, row, problems in results:
        print(f"{name:14} " + " ".join(f"{row.get(c, '-')!s:>10}" for c in COLS) + ("  ok" if not problems else "  FAIL"))
        for p in problems:
            print(f"{'':14}   - {p}")
        failed += bool(problems)
    print(f"chaos: {len(results) - failed} passed, {failed} failed (seed {args.seed})")
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
    sys.exit(main())
