#!/usr/bin/env python3
"""A strict local HTTP Event Collector (HEC) receiver for svc-observe tests.

No HEC implementation can run here, so this checks each request against the collector's
documented format:
- POST to /services/collector/event (other paths 404, other methods 405);
- Authorization: "Splunk <token>" with the token from the environment variable named by
  --token-env (missing header: 401 code 2; other scheme: 401 code 3; wrong token: 403 code 4);
- Content-Type application/json;
- body: one JSON object (a metric event in the multiple-metric format): only the keys time,
  host, source, sourcetype, index, event, fields; "event" == "metric"; time a number (epoch
  seconds); host/source/sourcetype/index strings; fields an object whose "metric_name:<name>"
  keys carry numbers (at least one) and whose other keys (dimensions) carry strings; metric
  names of letters, digits, "_", "." and ":" not starting with a digit or "_".
  A violation answers 400 code 6 "Invalid data format" naming the rule.
Success answers 200 {"text":"Success","code":0}. --status makes every well-formed request
answer that status instead (503 {"text":"Server is busy","code":9}); with --echo-headers
that answer also carries the request headers (a careless collector, for the secret-scrubbing
test).

Every request is appended to --record as one JSON line (path, headers lower-cased, the event
or the rule that failed). Prints "LISTENING <port>" once bound. With --tls-cert/--tls-key the
socket speaks TLS.
"""
import argparse
import json
import os
import re
import ssl
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

ALLOWED = {"time", "host", "source", "sourcetype", "index", "event", "fields"}
NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.:]*$")


def check_event(ev):
    if not isinstance(ev, dict):
        return "body is not a JSON object"
    extra = set(ev) - ALLOWED
    if extra:
        return "unknown keys %s" % sorted(extra)
    if ev.get("event") != "metric":
        return 'event must be "metric"'
    t = ev.get("time")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or t <= 0:
        return "time must be epoch seconds"
    for k in ("host", "source", "sourcetype", "index"):
        if k in ev and not isinstance(ev[k], str):
            return "%s must be a string" % k
    fields = ev.get("fields")
    if not isinstance(fields, dict):
        return "fields must be an object"
    metrics = 0
    for k, v in fields.items():
        if k.startswith("metric_name:"):
            name = k[len("metric_name:"):]
            if not NAME.match(name):
                return "bad metric name %r" % name
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                return "metric %s must be a number" % name
            metrics += 1
        elif not isinstance(v, str):
            return "dimension %s must be a string" % k
    if metrics == 0:
        return "no metric_name: field"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--record", required=True)
    ap.add_argument("--token-env", required=True)
    ap.add_argument("--status", type=int, default=200)
    ap.add_argument("--echo-headers", action="store_true")
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    args = ap.parse_args()
    token = os.environ[args.token_env]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def reply(self, status, text, code, entry, echo=False):
            entry["answer"] = [status, code, text]
            with open(args.record, "a") as f:
                f.write(json.dumps(entry) + "\n")
            answer = {"text": text, "code": code}
            if echo:
                answer["headers"] = entry["headers"]
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.reply(405, "Method not allowed", 15, {"path": self.path})

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            entry = {
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
            }
            if self.path != "/services/collector/event":
                return self.reply(404, "The requested URL was not found", 404, entry)
            auth = self.headers.get("Authorization")
            if auth is None:
                return self.reply(401, "Token is required", 2, entry)
            if not auth.startswith("Splunk "):
                return self.reply(401, "Invalid authorization", 3, entry)
            if auth[len("Splunk "):] != token:
                return self.reply(403, "Invalid token", 4, entry)
            if self.headers.get("Content-Type") != "application/json":
                entry["rule"] = "content type"
                return self.reply(400, "Invalid data format", 6, entry)
            try:
                ev = json.loads(body)
            except ValueError:
                entry["rule"] = "not JSON"
                return self.reply(400, "Invalid data format", 6, entry)
            why = check_event(ev)
            if why:
                entry["rule"] = why
                return self.reply(400, "Invalid data format", 6, entry)
            entry["event"] = ev
            if args.status != 200:
                return self.reply(args.status, "Server is busy", 9, entry, args.echo_headers)
            return self.reply(200, "Success", 0, entry)

    server = HTTPServer(("127.0.0.1", args.port), Handler)
    if args.tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print("LISTENING %d" % server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
