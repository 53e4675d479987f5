#!/usr/bin/env python3
"""Header amplification: peak RSS of `svc run` on messages of thousands of tiny header lines.

Starts its own nats-server (JetStream, free loopback ports, a temp store), publishes COUNT
messages of LINES one-line headers (distinct names, `a0b:1`, 56 KB of headers each) through the raw protocol,
creates a DLQ stream, runs the release `svc` with default delivery settings and a DLQ under
`/usr/bin/time -v`, waits until every message is settled (acknowledged, nothing pending: over
256 lines dead-lettered, within them stored), stops
it with SIGTERM and prints peak RSS against the documented bound (2 x max_in_flight_bytes +
32 MiB = 160 MiB). Exits 0 when every message was settled and the peak is within the bound.

    scripts/header_amplification.py [--svc target/release/svc] [--count 3000] [--lines 8000]

Environment: SVC_NATS_SERVER (default /usr/sbin/nats-server). Python standard library only.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

BOUND_MIB = 2 * 64 + 32


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Conn:
    """A raw NATS connection: enough protocol for publishing and JetStream API requests."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buf = b""
        self.line()  # INFO
        self.sock.sendall(b'CONNECT {"verbose":false,"headers":true,"no_responders":true}\r\n')
        self.sock.sendall(b"SUB _R.* 1\r\n")
        self.sid = 0

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("server closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exact(self, n):
        while len(self.buf) < n:
            self.buf += self.sock.recv(65536)
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def request(self, subject, body):
        self.sid += 1
        reply = f"_R.{self.sid}"
        payload = json.dumps(body).encode()
        self.sock.sendall(f"PUB {subject} {reply} {len(payload)}\r\n".encode() + payload + b"\r\n")
        while True:
            line = self.line()
            if line.startswith(b"PING"):
                self.sock.sendall(b"PONG\r\n")
            elif line.startswith(b"MSG ") or line.startswith(b"HMSG "):
                parts = line.split()
                size = int(parts[-1])
                data = self.exact(size + 2)[:-2]
                if parts[1].decode() == reply:
                    if line.startswith(b"HMSG "):
                        data = data[int(parts[-2]):]
                    return json.loads(data)
            elif line.startswith(b"-ERR"):
                raise RuntimeError(line.decode())

    def publish_all(self, subject, head, payload, count):
        frame = (
            f"HPUB {subject} {len(head)} {len(head) + len(payload)}\r\n".encode()
            + head
            + payload
            + b"\r\n"
        )
        for _ in range(count):
            self.sock.sendall(frame)
        self.sock.sendall(b"PING\r\n")
        while self.line() != b"PONG":
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--svc", default="target/release/svc")
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--lines", type=int, default=8000)
    ap.add_argument("--batch-size", type=int, help="delivery.batch_size (default: svc's)")
    ap.add_argument("--max-ack-pending", type=int, default=4096)
    args = ap.parse_args()
    server_bin = os.environ.get("SVC_NATS_SERVER", "/usr/sbin/nats-server")
    tmp = tempfile.mkdtemp(prefix="svc-hdr-amp-")
    port, mon = free_port(), free_port()
    server = subprocess.Popen(
        [server_bin, "-a", "127.0.0.1", "-p", str(port), "-m", str(mon), "-js", "-sd", tmp + "/js"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    svc = None
    try:
        deadline = time.time() + 10
        while True:
            try:
                conn = Conn(port)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
        conn.request("$JS.API.STREAM.CREATE.ORDERS", {"name": "ORDERS", "subjects": ["orders.>"]})
        conn.request("$JS.API.STREAM.CREATE.DLQ", {"name": "DLQ", "subjects": ["dlq.orders"]})
        conn.request(
            "$JS.API.CONSUMER.DURABLE.CREATE.ORDERS.svc",
            {
                "stream_name": "ORDERS",
                "config": {
                    "durable_name": "svc",
                    "ack_policy": "explicit",
                    "deliver_policy": "all",
                    "filter_subject": "orders.>",
                    "ack_wait": 30_000_000_000,
                    "max_ack_pending": args.max_ack_pending,
                },
            },
        )
        # Distinct three-character names (a map keeps each one): `a0b:1`, 7 bytes a line.
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"
        name = lambda i: digits[i // 1296 % 36] + digits[i // 36 % 36] + digits[i % 36]
        head = b"NATS/1.0\r\n" + b"".join(
            f"{name(i)}:1\r\n".encode() for i in range(args.lines)
        ) + b"\r\n"
        conn.publish_all("orders.tiny", head, b'{"n":1}', args.count)
        stored = conn.request("$JS.API.STREAM.INFO.ORDERS", {})["state"]["messages"]
        print(f"published {stored} messages of {args.lines} header lines ({len(head)} bytes)")
        out = os.path.join(tmp, "out")
        cfg = {
            "nats": {
                "url": f"nats://127.0.0.1:{port}",
                "stream": "ORDERS",
                "consumer": "svc",
                "subject": "orders.>",
            },
            "sink": {"type": "file", "directory": out},
            "dead_letter": {"enabled": True, "subject": "dlq.orders", "expected_stream": "DLQ"},
            "logging": {"level": "warn"},
        }
        if args.batch_size:
            cfg["delivery"] = {"batch_size": args.batch_size}
        with open(os.path.join(tmp, "c.json"), "w") as f:
            json.dump(cfg, f)
        log = open(os.path.join(tmp, "svc.log"), "w")
        start = time.time()
        svc = subprocess.Popen(
            ["/usr/bin/time", "-v", args.svc, "run", os.path.join(tmp, "c.json")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        settled = False
        deadline = time.time() + 600
        while time.time() < deadline and svc.poll() is None:
            info = conn.request("$JS.API.CONSUMER.INFO.ORDERS.svc", {})
            if info["num_pending"] == 0 and info["num_ack_pending"] == 0:
                settled = True
                break
            time.sleep(1)
        elapsed = time.time() - start
        dlq = conn.request("$JS.API.STREAM.INFO.DLQ", {})["state"]["messages"]
        if svc.poll() is None:
            # /usr/bin/time forwards nothing: signal svc itself, its only child.
            child = subprocess.run(
                ["pgrep", "-P", str(svc.pid)], capture_output=True, text=True
            ).stdout.split()
            for pid in child:
                os.kill(int(pid), signal.SIGTERM)
        svc.wait(timeout=60)
        log.close()
        text = open(os.path.join(tmp, "svc.log")).read()
        peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
        peak_mib = int(peak.group(1)) / 1024 if peak else float("nan")
        print(
            f"settled={settled} in {elapsed:.1f} s, dead-lettered {dlq} of {stored}, "
            f"peak RSS {peak_mib:.1f} MiB, bound {BOUND_MIB} MiB ({peak_mib / BOUND_MIB:.2f})"
        )
        # Over the 256-line input limit every message is dead-lettered; within it, stored.
        expected_dlq = stored if args.lines > 256 else 0
        ok = settled and dlq == expected_dlq and peak_mib <= BOUND_MIB
        print("WITHIN THE BOUND" if ok else "OVER THE BOUND OR UNSETTLED")
        return 0 if ok else 1
    finally:
        if svc is not None and svc.poll() is None:
            svc.kill()
        server.terminate()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
