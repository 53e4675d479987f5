#!/usr/bin/env python3
"""OTLP/HTTP JSON metrics receiver for svc-observe tests.

Accepts POST /v1/metrics with Content-Type application/json and decodes the body with the
OpenTelemetry protobuf definitions (google.protobuf.json_format.Parse into
ExportMetricsServiceRequest: strict on unknown fields, wrong types and one value per oneof).
Every request is appended to --record as one JSON line: path, headers (lower-cased names),
body size, and either the decoded request (MessageToDict) or the decoding error. Answers an
ExportMetricsServiceResponse ({}) on success, 400 on a body that does not decode, 404/405/415
on the wrong path, method or content type, or --status for the first --fail-first requests
(all requests when --fail-first is not given); --echo-headers puts the request headers in
those error answers (a careless receiver, for the secret-scrubbing test).

Prints "LISTENING <port>" on stdout once the socket is bound (--port 0 picks a free port).
"""
import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

LOCK = threading.Lock()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--record", required=True)
    ap.add_argument("--status", type=int, default=200)
    ap.add_argument("--fail-first", type=int, default=-1)
    ap.add_argument("--echo-headers", action="store_true")
    args = ap.parse_args()
    state = {"requests": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def reply(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def record(self, entry):
            with LOCK:
                with open(args.record, "a") as f:
                    f.write(json.dumps(entry) + "\n")

        def do_GET(self):
            self.reply(405, {"message": "method not allowed"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            state["requests"] += 1
            entry = {
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "bytes": len(body),
            }
            failing = args.status != 200 and (
                args.fail_first < 0 or state["requests"] <= args.fail_first
            )
            if self.path != "/v1/metrics":
                entry["error"] = "wrong path"
                self.record(entry)
                return self.reply(404, {"message": "not found"})
            if self.headers.get("Content-Type") != "application/json":
                entry["error"] = "wrong content type"
                self.record(entry)
                return self.reply(415, {"message": "unsupported media type"})
            try:
                msg = json_format.Parse(body.decode("utf-8"), ExportMetricsServiceRequest())
                entry["request"] = json_format.MessageToDict(msg)
            except Exception as e:  # noqa: BLE001 - any decoding failure is a 400
                entry["error"] = "decode: %s" % e
                self.record(entry)
                return self.reply(400, {"message": "invalid body"})
            entry["answered"] = args.status if failing else 200
            self.record(entry)
            if failing:
                if args.echo_headers:
                    # A careless receiver echoing the request headers in its error answer.
                    return self.reply(args.status, {"message": "failed", "headers": entry["headers"]})
                return self.reply(args.status, {"message": "try later"})
            return self.reply(200, {})

    server = HTTPServer(("127.0.0.1", args.port), Handler)
    print("LISTENING %d" % server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
