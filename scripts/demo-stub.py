#!/usr/bin/env python3
"""demo-stub.py - the stand-in ERP of `scripts/run.sh --demo`.

    demo-stub.py PORT_FILE

Listens on 127.0.0.1 (a free port, written to PORT_FILE once listening) and answers
POST /erp/<orderNumber> by the order number:
    ...-FLAKY-...  503 for the first two calls of that number, then 200 (the retry ladder)
    ...-DLQ-...    400 (a terminal failure: straight to the DLQ) until POST /control/fix
    anything else  200 {"erpId": ...}
GET /calls answers {"<path>": <calls>}. One line per request on stderr. Stops on SIGTERM.
"""
import http.server
import json
import os
import signal
import sys
import threading

calls = {}
fixed = False
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    def reply(self, status, doc):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/calls":
            with lock:
                self.reply(200, dict(calls))
        else:
            self.reply(404, {"error": "not found"})

    def do_POST(self):
        global fixed
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.path == "/control/fix":
            with lock:
                fixed = True
            self.reply(200, {"fixed": True})
            return
        if not self.path.startswith("/erp/"):
            self.reply(404, {"error": "not found"})
            return
        number = self.path[len("/erp/"):]
        with lock:
            n = calls[self.path] = calls.get(self.path, 0) + 1
            is_fixed = fixed
        if "-FLAKY-" in number and n <= 2:
            self.reply(503, {"error": "ERP busy, try later"})
        elif "-DLQ-" in number and not is_fixed:
            self.reply(400, {"error": "unknown customer"})
        else:
            self.reply(200, {"erpId": "ERP-" + number, "call": n})

    def log_message(self, fmt, *args):
        sys.stderr.write("demo-stub: %s\n" % (fmt % args))


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    tmp = sys.argv[1] + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % server.server_address[1])
    os.rename(tmp, sys.argv[1])
    server.serve_forever()


if __name__ == "__main__":
    main()
