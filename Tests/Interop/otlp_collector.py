#!/usr/bin/env python3
"""An OTLP/HTTP collector that keeps spans (the tests' span exporter's far end).

Takes POST /v1/traces with OTLP JSON (Content-Type: application/json, as OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=
http/json sends it) and writes each span as one JSON line: trace_id, span_id, parent_span_id (hex; base64
ids are turned into hex), name, kind, start and end (unix nanoseconds), attributes (a flat dict), links
(trace_id, span_id, attributes), status, and the resource's service.name.

Usage: otlp_collector.py --port-file F --log F
"""
import argparse, base64, json, os, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def hex_id(value, length):
    if not value:
        return ""
    if len(value) == length and all(c in "0123456789abcdefABCDEF" for c in value):
        return value.lower()
    return base64.b64decode(value).hex()


def flat(attributes):
    out = {}
    for a in attributes or []:
        v = a.get("value", {})
        for kind in ("stringValue", "intValue", "boolValue", "doubleValue"):
            if kind in v:
                out[a["key"]] = int(v[kind]) if kind == "intValue" else v[kind]
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    lock = threading.Lock()
    log = open(args.log, "a", buffering=1)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            status = 200
            try:
                request = json.loads(body)
                with lock:
                    for resource_spans in request.get("resourceSpans", []):
                        service = flat(resource_spans.get("resource", {}).get("attributes")).get("service.name")
                        for scope in resource_spans.get("scopeSpans", []):
                            for span in scope.get("spans", []):
                                log.write(json.dumps({
                                    "trace_id": hex_id(span.get("traceId"), 32),
                                    "span_id": hex_id(span.get("spanId"), 16),
                                    "parent_span_id": hex_id(span.get("parentSpanId"), 16),
                                    "name": span.get("name"), "kind": span.get("kind"),
                                    "start": int(span.get("startTimeUnixNano", 0)),
                                    "end": int(span.get("endTimeUnixNano", 0)),
                                    "attributes": flat(span.get("attributes")),
                                    "links": [{"trace_id": hex_id(l.get("traceId"), 32),
                                               "span_id": hex_id(l.get("spanId"), 16),
                                               "attributes": flat(l.get("attributes"))}
                                              for l in span.get("links", [])],
                                    "status": span.get("status", {}), "service": service,
                                }) + "\n")
            except (ValueError, KeyError) as error:
                status = 400
                with lock:
                    log.write(json.dumps({"error": str(error), "content_type": self.headers.get("Content-Type")}) + "\n")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(args.port_file + ".tmp", args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
