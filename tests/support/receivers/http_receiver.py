"""A webhook receiver for the HTTP sink's tests: stores every request it gets as one JSON line
(method, path, headers, body after gzip, the Standard Webhooks verdict, the status it answered)
in --out, flushed and fsynced before it answers, and misbehaves on purpose with --mode.

Modes:
  ok            answer 200 to everything (a request whose signature does not verify: 401)
  retry_after   answer 503 with Retry-After: 2 to the first --count requests, then 200
  reject_marker answer 400 to a request whose body holds --marker, 200 to others
  redirect      answer 301 with a Location
  slow          sleep --delay seconds, then answer 200
  close         send half a status line, then close the connection
  huge          answer 200 with a body of --size bytes (never buffered whole)
  echo          answer 400 quoting the request's Authorization header (a hostile echo)
  status        answer --status to every request, quoting the values of the --quote headers
                (comma-separated names) in the body (a 401 that echoes the credentials)
  verify        a receiver that does real work and stores nothing (benchmarks): verifies the
                Standard Webhooks signature (--secret, required; 401 on failure), parses the
                JSON body (400 if it does not parse), answers 200. GET /stats answers what it
                did: requests, seconds with at least one request in a handler ("busy"), and
                the seconds spent at each number of requests in handlers at once, and the
                Unix times of the first request since the last GET /stats and of the last
                answer.

With --secret (whsec_...), every request is verified with the `standardwebhooks` package from
PyPI; a request that fails verification is answered 401 and stored with "verified": false.
"""

import argparse
import gzip
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--mode", default="ok")
parser.add_argument("--secret")
parser.add_argument("--count", type=int, default=1)
parser.add_argument("--marker", default="POISON")
parser.add_argument("--delay", type=float, default=5.0)
parser.add_argument("--size", type=int, default=1 << 30)
parser.add_argument("--status", type=int, default=401)
parser.add_argument("--quote", default="")
parser.add_argument("--no-store", action="store_true", help="count only (benchmarks)")
args = parser.parse_args()

if args.mode == "verify" and not args.secret:
    sys.exit("--mode verify needs --secret")

webhook = None
if args.secret:
    from standardwebhooks.webhooks import Webhook

    webhook = Webhook(args.secret)

lock = threading.Lock()
out = open(args.out, "a", encoding="utf-8")
seen = {"requests": 0}
# verify mode: requests in handlers now, since when, and the seconds spent at each count.
activity = {"inside": 0, "since": time.monotonic(), "at": [0.0] * 257, "first": None, "last": None}


def enter(delta):
    with lock:
        now = time.monotonic()
        if delta > 0 and activity["first"] is None:
            activity["first"] = time.time()
        if delta < 0:
            activity["last"] = time.time()
        activity["at"][min(activity["inside"], 256)] += now - activity["since"]
        activity["since"] = now
        activity["inside"] += delta


def stats():
    enter(0)
    with lock:
        at = activity["at"]
        top = max([i for i, s in enumerate(at) if s > 0] or [0])
        first, activity["first"] = activity["first"], None
        return {
            "first_request_at": first,
            "last_answer_at": activity["last"],
            "requests": seen["requests"],
            "busy_seconds": sum(at[1:]),
            "seconds_at": at[: top + 1],
        }


def store(entry):
    with lock:
        out.write(json.dumps(entry) + "\n")
        out.flush()
        os.fsync(out.fileno())


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def answer(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def do_OPTIONS(self):
        self.answer(204, headers=[("Allow", "POST, PUT, PATCH, OPTIONS")])

    def do_GET(self):
        if self.path == "/stats":
            self.answer(200, json.dumps(stats()).encode())
            return
        self.answer(200, b"ok")

    def do_HEAD(self):
        self.answer(200)

    def do_PUT(self):
        self.do_POST()

    def do_PATCH(self):
        self.do_POST()

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        with lock:
            seen["requests"] += 1
            n = seen["requests"]
        if args.no_store:
            self.answer(200)
            return
        if args.mode == "verify":
            self.verify(raw)
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        body = raw
        if headers.get("content-encoding") == "gzip":
            body = gzip.decompress(raw)
        verified = None
        if webhook is not None:
            # The signature covers the payload as text, after the transfer's gzip is undone.
            try:
                webhook.verify(body, headers)
                verified = True
            except Exception:
                verified = False
        status = 200
        extra = []
        if verified is False:
            status = 401
        elif args.mode == "retry_after" and n <= args.count:
            status = 503
            extra = [("Retry-After", "2")]
        elif args.mode == "reject_marker" and args.marker.encode() in body:
            status = 400
        elif args.mode == "status":
            status = args.status
        elif args.mode == "redirect":
            status = 301
            extra = [("Location", "http://127.0.0.1:1/elsewhere")]
        store(
            {
                "n": n,
                "at": time.time(),
                "method": self.command,
                "path": self.path,
                "headers": headers,
                "body": body.decode("utf-8", "replace"),
                "verified": verified,
                "status": status,
            }
        )
        if args.mode == "slow":
            time.sleep(args.delay)
        if args.mode == "close":
            self.wfile.write(b"HTTP/1.1 20")
            self.wfile.flush()
            self.close_connection = True
            return
        if args.mode == "huge":
            self.send_response(200)
            self.send_header("Content-Length", str(args.size))
            self.end_headers()
            chunk = b"x" * 65536
            sent = 0
            try:
                while sent < args.size:
                    self.wfile.write(chunk)
                    sent += len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
            store({"huge_sent": sent})
            self.close_connection = True
            return
        if args.mode == "echo":
            quoted = ("denied for " + headers.get("authorization", "")).encode()
            self.answer(400, quoted)
            return
        if args.mode == "status":
            names = [n.strip().lower() for n in args.quote.split(",") if n.strip()]
            quoted = "; ".join(n + ": " + headers.get(n, "") for n in names)
            self.answer(status, ("refused, you sent " + quoted).encode(), extra)
            return
        self.answer(status, b"refused: bad record" if status == 400 else b"", extra)

    def verify(self, raw):
        enter(1)
        try:
            body = raw
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(raw)
            headers = {k.lower(): v for k, v in self.headers.items()}
            status = 200
            try:
                webhook.verify(body, headers, json_parse=False)
            except Exception:
                status = 401
            if status == 200:
                try:
                    json.loads(body)
                except ValueError:
                    status = 400
        finally:
            enter(-1)
        self.answer(status)


server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
server.daemon_threads = True
print("ready", flush=True)
sys.stdout.flush()
server.serve_forever()
