#!/usr/bin/env python3
"""A webhook receiver that trusts nothing and misbehaves on purpose (the tests' loopback receiver).

Written from CONTRACT.md 1c alone: every request's Push-Signature is checked (t=<unix>,v1=<hex HMAC-SHA256
of "<t>.<body>"> keyed with the secret file's content, surrounding whitespace removed), and each request is
logged as one JSON line: delivery id, event, job id, whether the signature held, and what the receiver did.

Paths choose the behaviour:
  /ok       answers 204
  /flaky    the first request of a delivery id, per a seeded plan: 204, 500, 503 with Retry-After 1, drop (close
            without answering), or delay (answer 204 after --delay seconds, past the worker's deadline);
            later tries: 204
  /slow     answers 204 after --delay seconds
  /gone     answers 410
  /redirect answers 302 to /ok (must never be followed)

Usage: webhook_receiver.py --port-file F --log F --secret-file F [--seed N] [--delay S]
Prints nothing; writes the bound port to --port-file once listening.
"""
import argparse, hashlib, hmac, json, random, socket, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--delay", type=float, default=3.0)
    parser.add_argument("--ok-share", type=float, default=0.5)
    parser.add_argument("--tls-cert", help="serve https with this PEM certificate (and --tls-key)")
    parser.add_argument("--tls-key")
    args = parser.parse_args()
    secret = open(args.secret_file, "rb").read().strip()
    rng = random.Random(args.seed)
    lock = threading.Lock()
    log = open(args.log, "a", buffering=1)
    seen = set()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            header = self.headers.get("Push-Signature", "")
            parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
            t = parts.get("t", "")
            expected = hmac.new(secret, t.encode() + b"." + body, hashlib.sha256).hexdigest()
            fresh = t.isdigit() and abs(time.time() - int(t)) < 300
            signed = fresh and hmac.compare_digest(expected, parts.get("v1", ""))
            try:
                doc = json.loads(body)
            except ValueError:
                doc = {}
            path = self.path.split("?")[0]
            with lock:
                delivery = self.headers.get("Push-Delivery-Id")
                first_sight = delivery not in seen
                seen.add(delivery)
                if path == "/flaky" and not first_sight:
                    action = "ok"
                elif path == "/slow":
                    action = "delay"
                elif path == "/flaky":
                    roll = rng.random()
                    rest = (1 - args.ok_share) / 4
                    action = ("ok" if roll < args.ok_share else "500" if roll < args.ok_share + rest
                              else "500-retry-after" if roll < args.ok_share + 2 * rest
                              else "drop" if roll < args.ok_share + 3 * rest else "delay")
                else:
                    action = {"/ok": "ok", "/gone": "410", "/redirect": "302"}.get(path, "404")
                log.write(json.dumps({
                    "delivery": self.headers.get("Push-Delivery-Id"), "event": self.headers.get("Push-Event"),
                    "attempt": self.headers.get("Push-Attempt"), "job_id": doc.get("job_id"),
                    "body_event": doc.get("event"), "state": doc.get("state"), "signed": signed, "path": path,
                    "action": action, "at": time.time(), "keys": sorted(doc.keys()), "first": first_sight,
                }) + "\n")
            if action == "drop":
                # Close without a word: the worker cannot know whether it was taken.
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            if action == "delay":
                time.sleep(args.delay)
                action = "ok"
            status, extra = {"ok": (204, {}), "500": (500, {}), "500-retry-after": (503, {"Retry-After": "1"}),
                             "410": (410, {}), "302": (302, {"Location": "/ok"}), "404": (404, {})}[action]
            self.send_response(status)
            for k, v in extra.items():
                self.send_header(k, v)
            self.send_header("Content-Length", "0")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if args.tls_cert:
        import ssl
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    import os
    os.rename(args.port_file + ".tmp", args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
