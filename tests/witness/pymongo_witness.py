"""pymongo_witness.py - devmongod driven by a second official driver (PyPI's pymongo)

DESIGN: libmongoc is the driver the product uses; pymongo has its own habits (its own session
pool, transaction retry loop, resume logic and retryable-write rules), so a devmongod shaped to
one client's quirks fails here. Each check starts from a fresh database on one private
devmongod (--exit-with-parent), asserts through pymongo's public API only, and prints one line;
the first failure raises and the process exits non-zero. Waiting is bounded by the driver's
own timeouts (maxAwaitTimeMS, server selection), never by sleeps.

usage: pymongo_witness.py DEVMONGOD
"""
import os
import subprocess
import sys
import tempfile

import pymongo
from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern


def start_server(binary, workdir):
    port_file = os.path.join(workdir, "port")
    proc = subprocess.Popen([binary, "--port", "0", "--port-file", port_file, "--exit-with-parent"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # the port file is written once the server listens; read it with the driver's deadline
    import time
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if os.path.exists(port_file) and open(port_file).read().strip():
            return proc, int(open(port_file).read().split()[0])
        if proc.poll() is not None:
            raise SystemExit("devmongod exited with %s" % proc.returncode)
        time.sleep(0.02)  # polling a file the server writes, bounded by the deadline above
    proc.kill()
    raise SystemExit("devmongod did not write its port file")


def fail_point(client, doc):
    return client.admin.command(doc)


def check(name):
    def deco(fn):
        CHECKS.append((name, fn))
        return fn
    return deco


CHECKS = []


@check("with_transaction commits two collections atomically, retrying a transient error")
def with_transaction(client, db):
    db.create_collection("a")
    db.create_collection("b")
    calls = []
    fail_point(client, {"configureFailPoint": "failCommand", "mode": {"times": 1},
                        "data": {"failCommands": ["insert"], "errorCode": 112}})

    def body(session):
        calls.append(1)
        db.a.insert_one({"_id": 1}, session=session)
        db.b.insert_one({"_id": 1}, session=session)
        assert db.a.count_documents({}) == 0, "a transaction's write is visible outside before commit"
    with client.start_session() as s:
        s.with_transaction(body, read_concern=ReadConcern("snapshot"), write_concern=WriteConcern("majority"))
    assert len(calls) == 2, "callback ran %d times, want 2 (WriteConflict is TransientTransactionError)" % len(calls)
    assert db.a.count_documents({}) == 1 and db.b.count_documents({}) == 1


@check("abort_transaction leaves nothing; an error inside aborts server-side (NoSuchTransaction)")
def abort(client, db):
    db.c.insert_one({"_id": 1, "n": 0})
    with client.start_session() as s:
        s.start_transaction()
        db.c.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=s)
        db.c.insert_one({"_id": 2}, session=s)
        s.abort_transaction()
        assert db.c.find_one({"_id": 1})["n"] == 0 and db.c.count_documents({}) == 1
        s.start_transaction()
        db.c.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=s)
        try:
            db.c.insert_one({"_id": 1}, session=s)
            raise AssertionError("duplicate _id inside a transaction succeeded")
        except pymongo.errors.DuplicateKeyError as e:
            assert not e.has_error_label("TransientTransactionError")
        try:
            s.commit_transaction()
            raise AssertionError("commit after a failed statement succeeded")
        except OperationFailure as e:
            assert e.code == 251 and e.has_error_label("TransientTransactionError"), (e.code, e.details)
    assert db.c.find_one({"_id": 1})["n"] == 0


@check("write conflict between transactions: 112 with TransientTransactionError, first writer wins")
def write_conflict(client, db):
    db.d.insert_one({"_id": 1, "n": 0})
    with client.start_session() as s1, client.start_session() as s2:
        s1.start_transaction()
        s2.start_transaction()
        db.d.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=s1)
        try:
            db.d.update_one({"_id": 1}, {"$inc": {"n": 10}}, session=s2)
            raise AssertionError("second writer of a locked document succeeded")
        except OperationFailure as e:
            assert e.code == 112 and e.has_error_label("TransientTransactionError"), (e.code, e.details)
        s2.abort_transaction()
        s1.commit_transaction()
    assert db.d.find_one({"_id": 1})["n"] == 1


@check("retryable writes: a lost reply after the write commits is answered from the record (+1, not +2)")
def retryable_writes(client, db):
    db.e.insert_one({"_id": 1, "n": 0})
    fail_point(client, {"configureFailPoint": "onPrimaryTransactionalWrite", "mode": {"times": 1}})
    res = db.e.update_one({"_id": 1}, {"$inc": {"n": 1}})
    fired = fail_point(client, {"configureFailPoint": "onPrimaryTransactionalWrite", "mode": "off"})["count"]
    assert fired == 1, "the fail point fired %d times, want 1 (no retry happened)" % fired
    assert res.modified_count == 1 and db.e.find_one({"_id": 1})["n"] == 1, db.e.find_one({"_id": 1})
    fail_point(client, {"configureFailPoint": "onPrimaryTransactionalWrite", "mode": {"times": 1},
                        "data": {"failBeforeCommitExceptionCode": 91}})
    doc = db.e.find_one_and_update({"_id": 1}, {"$inc": {"n": 1}}, return_document=pymongo.ReturnDocument.AFTER)
    assert doc["n"] == 2 and db.e.find_one({"_id": 1})["n"] == 2
    fail_point(client, {"configureFailPoint": "failCommand", "mode": {"times": 1},
                        "data": {"failCommands": ["insert"], "closeConnection": True}})
    db.e.insert_many([{"_id": 10}, {"_id": 11}])
    assert db.e.count_documents({"_id": {"$gte": 10}}) == 2


@check("change streams: resumeAfter continues after the named event, startAtOperationTime from a time")
def change_stream_resume(client, db):
    coll = db.f
    with coll.watch(max_await_time_ms=200) as cs:
        coll.insert_one({"_id": 1})
        coll.insert_one({"_id": 2})
        first = cs.next()
        assert first["operationType"] == "insert" and first["documentKey"]["_id"] == 1
        token = cs.resume_token
    coll.insert_one({"_id": 3})
    with coll.watch(resume_after=token, max_await_time_ms=200) as cs:
        ids = [cs.next()["documentKey"]["_id"] for _ in range(2)]
    assert ids == [2, 3], ids
    with client.start_session() as s:
        coll.insert_one({"_id": 4}, session=s)
        at = s.operation_time  # the insert's cluster time: events "at or after" start there
    assert isinstance(at, Timestamp)
    with coll.watch(start_at_operation_time=at, max_await_time_ms=200) as cs:
        ev = cs.next()
    assert ev["documentKey"]["_id"] == 4 and ev["clusterTime"] >= at, ev
    with coll.watch(full_document="updateLookup", max_await_time_ms=200) as cs:
        coll.update_one({"_id": 4}, {"$set": {"x": 1}})
        ev = cs.next()
        assert ev["operationType"] == "update" and ev["fullDocument"] == {"_id": 4, "x": 1}, ev
        assert ev["updateDescription"]["updatedFields"] == {"x": 1}
    with coll.watch(max_await_time_ms=200) as cs:
        coll.update_one({"_id": 4}, {"$set": {"x": 2}})
        ev = cs.next()
        assert "fullDocument" not in ev, "an update event carries fullDocument without being asked"


@check("database-level watch of a transaction over two collections: both events, one clusterTime, lsid/txnNumber")
def database_watch_transaction(client, db):
    db.create_collection("g1")
    db.create_collection("g2")
    with db.watch(max_await_time_ms=200) as cs:
        with client.start_session() as s:
            s.with_transaction(lambda s: (db.g1.insert_one({"_id": "x"}, session=s),
                                          db.g2.insert_one({"_id": "y"}, session=s)))
        a, b = cs.next(), cs.next()
    assert (a["ns"]["coll"], b["ns"]["coll"]) == ("g1", "g2"), (a["ns"], b["ns"])
    assert a["clusterTime"] == b["clusterTime"], "a transaction's events have different cluster times"
    assert "lsid" in a and a["txnNumber"] == b["txnNumber"], a


@check("change stream errors: unknown stage 40324 at once, a changed _id 280 on the getMore")
def change_stream_errors(client, db):
    try:
        db.h.watch([{"$bogus": {}}])
        raise AssertionError("an unknown stage was accepted")
    except OperationFailure as e:
        assert e.code == 40324, e.details
    with db.h.watch([{"$project": {"_id": 0}}], max_await_time_ms=200) as cs:
        db.h.insert_one({"_id": 1})
        try:
            cs.next()
            raise AssertionError("an event with its _id projected out was returned")
        except OperationFailure as e:
            assert e.code == 280 and e.has_error_label("NonResumableChangeStreamError"), e.details


@check("explain: an index answers a range with its sort (FETCH over IXSCAN, no SORT)")
def explain(client, db):
    db.p.insert_many([{"_id": i, "v": i % 50, "w": i} for i in range(500)])
    db.p.create_index([("v", 1), ("w", -1)])
    plan = db.p.find({"v": 7, "w": {"$gte": 100}}).sort("w", -1).explain()
    stage = plan["queryPlanner"]["winningPlan"]
    assert stage["stage"] == "FETCH" and stage["inputStage"]["stage"] == "IXSCAN", stage
    assert plan["executionStats"]["totalDocsExamined"] == 8, plan["executionStats"]


def main():
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_server(binary, tmp)
        try:
            client = pymongo.MongoClient("mongodb://127.0.0.1:%d/?replicaSet=rs0" % port,
                                         serverSelectionTimeoutMS=10000, appname="pymongo_witness")
            print("pymongo %s against devmongod (%s)" % (pymongo.version, client.server_info()["version"]))
            for i, (name, fn) in enumerate(CHECKS):
                fail_point(client, {"configureFailPoint": "failCommand", "mode": "off"})
                fn(client, client["w%d" % i])
                print("ok   %s" % name)
            client.close()
        finally:
            proc.terminate()
            proc.wait(10)
    print("%d checks passed" % len(CHECKS))


if __name__ == "__main__":
    main()
