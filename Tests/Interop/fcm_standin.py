"""An independent FCM stand-in (h2 over TLS, RS256 checked with `cryptography`), written from Google's
documentation, not from PushWorker's code: the OAuth 2.0 token endpoint (JWT bearer grant, RFC 7523) and
FCM's HTTP v1 send endpoint. PushWorker's own simulator is checked against the same documents; this one
keeps the worker honest if both readings drifted the same way.

    python3 fcm_standin.py --port PORT --cert cert.pem --key key.pem --service-account sa.json --log requests.jsonl

Error bodies follow Google's "REST error codes for the HTTP v1 API" page
(firebase.google.com/docs/cloud-messaging/error-codes): an invalid value is INVALID_ARGUMENT with a
google.rpc.BadRequest field violation naming the field and no FcmError (its example 1); an invalid
registration token is INVALID_ARGUMENT, "The registration token is not a valid FCM registration token", with
only the FcmError detail (its example 2). QUOTA_EXCEEDED carries a google.rpc.QuotaFailure (the ErrorCode
reference), whose violations have a subject and a description.

Registration tokens starting with "unregistered" get 404 UNREGISTERED; "quota" gets 429 QUOTA_EXCEEDED (a
device over its rate, Retry-After: 1) on its first send; "invalid" gets the invalid-token answer;
"thirdparty" gets 401 THIRD_PARTY_AUTH_ERROR (an iOS token of a project without an APNs key). Every other
well-formed message is accepted. One JSON line per request goes to --log. Prints "READY" when listening.
"""
import argparse
import asyncio
import base64
import json
import re
import secrets
import ssl
import time
import urllib.parse

import h2.config
import h2.connection
import h2.events
import h2.settings
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding

SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
MESSAGE_FIELDS = {"name", "data", "notification", "android", "webpush", "apns", "fcm_options", "token", "topic", "condition"}
TTL = re.compile(r"^\d+(\.\d{1,9})?s$")


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class StandIn:
    def __init__(self, args):
        with open(args.service_account) as handle:
            account = json.load(handle)
        key = serialization.load_pem_private_key(account["private_key"].encode(), password=None)
        self.public_key = key.public_key()
        self.client_email = account["client_email"]
        self.project = account["project_id"]
        self.token_uri = account["token_uri"]
        self.tokens = {}
        self.quota_seen = set()
        self.messages = 0
        self.log = open(args.log, "a", buffering=1)

    def record(self, **fields):
        self.log.write(json.dumps(fields) + "\n")

    def error(self, status, code, message, extra_details=()):
        words = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}
        details = [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": code}]
        details += list(extra_details)
        body = {"error": {"code": status, "message": message, "status": words.get(status, "INTERNAL"),
                          "details": details}}
        return status, {}, body

    def invalid_value(self, field, message):
        """Google's example 1: a field's value refused, the field named in a BadRequest, no FcmError."""
        return 400, {}, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT",
                                   "details": [{"@type": "type.googleapis.com/google.rpc.BadRequest",
                                                "fieldViolations": [{"field": field, "description": message}]}]}}

    def grant(self, body: bytes):
        form = urllib.parse.parse_qs(body.decode())
        if form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"]:
            return 400, {}, {"error": "unsupported_grant_type"}
        assertion = (form.get("assertion") or [""])[0]
        parts = assertion.split(".")
        if len(parts) != 3:
            return 400, {}, {"error": "invalid_grant", "error_description": "Invalid JWT"}
        header = json.loads(b64url_decode(parts[0]))
        claims = json.loads(b64url_decode(parts[1]))
        if header.get("alg") != "RS256":
            return 400, {}, {"error": "invalid_grant", "error_description": "alg"}
        try:
            self.public_key.verify(b64url_decode(parts[2]), f"{parts[0]}.{parts[1]}".encode(),
                                   padding.PKCS1v15(), hashes.SHA256())
        except Exception:
            return 400, {}, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
        now = time.time()
        if (claims.get("iss") != self.client_email or claims.get("aud") != self.token_uri
                or SCOPE not in str(claims.get("scope", "")).split()
                or not (abs(claims.get("iat", 0) - now) < 300 and claims.get("exp", 0) > now
                        and claims["exp"] - claims["iat"] <= 3600)):
            return 400, {}, {"error": "invalid_grant", "error_description": "claims"}
        token = "ya29.standin-" + secrets.token_urlsafe(24)
        self.tokens[token] = now + 3600
        return 200, {}, {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}

    def send(self, path: str, headers: dict, body: bytes):
        match = re.fullmatch(r"/v1/projects/([^/]+)/messages:send", path)
        if not match:
            return 404, {}, {"error": {"code": 404, "message": "not found", "status": "NOT_FOUND"}}
        authorization = headers.get("authorization", "")
        token = authorization[len("Bearer "):] if authorization.startswith("Bearer ") else ""
        if self.tokens.get(token, 0) < time.time():
            return self.error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials.")
        if match.group(1) != self.project:
            return self.error(403, "PERMISSION_DENIED", "Permission denied")
        try:
            message = json.loads(body)["message"]
        except Exception:
            return self.error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        unknown = set(message) - MESSAGE_FIELDS
        if unknown:
            return self.error(400, "INVALID_ARGUMENT", f"Unknown name {sorted(unknown)[0]}")
        if sum(1 for target in ("token", "topic", "condition") if target in message) != 1:
            return self.error(400, "INVALID_ARGUMENT", "exactly one of token, topic or condition")
        data = message.get("data", {})
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            return self.invalid_value("message.data", "Invalid value at 'message.data'")
        android = message.get("android", {})
        if android.get("priority", "NORMAL") not in ("NORMAL", "HIGH"):
            return self.invalid_value("message.android.priority", "Invalid value at 'message.android.priority'")
        if "ttl" in android and not TTL.match(android["ttl"]):
            return self.invalid_value("message.android.ttl", "Invalid value at 'message.android.ttl'")
        registration = message["token"]
        self.record(path=path, token=registration, push_id=data.get("push_id"), ttl=android.get("ttl"),
                    priority=android.get("priority"), collapse_key=android.get("collapse_key"),
                    tag=(android.get("notification") or {}).get("tag"))
        if registration.startswith("unregistered"):
            return self.error(404, "UNREGISTERED", "Requested entity was not found.")
        if registration.startswith("invalid"):
            return self.error(400, "INVALID_ARGUMENT", "The registration token is not a valid FCM registration token")
        if registration.startswith("thirdparty"):
            return self.error(401, "THIRD_PARTY_AUTH_ERROR", "Auth error from APNS or Web Push Service")
        if registration.startswith("quota") and registration not in self.quota_seen:
            self.quota_seen.add(registration)
            status, extra, body = self.error(
                429, "QUOTA_EXCEEDED", "Quota exceeded.",
                [{"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                  "violations": [{"subject": "device", "description": "Device message rate exceeded."}]}])
            return status, {"retry-after": "1"}, body
        self.messages += 1
        return 200, {}, {"name": f"projects/{self.project}/messages/0:{self.messages}%standin"}


class Protocol(asyncio.Protocol):
    def __init__(self, standin):
        self.standin = standin
        self.conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=False))
        self.streams = {}

    def connection_made(self, transport):
        self.transport = transport
        self.conn.initiate_connection()
        self.conn.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 100})
        self.transport.write(self.conn.data_to_send())

    def data_received(self, data):
        try:
            events = self.conn.receive_data(data)
        except Exception:
            self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self.streams[event.stream_id] = ({k.decode(): v.decode() for k, v in event.headers}, bytearray())
            elif isinstance(event, h2.events.DataReceived):
                self.streams[event.stream_id][1].extend(event.data)
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                headers, body = self.streams.pop(event.stream_id)
                self.answer(event.stream_id, headers, bytes(body))
        self.transport.write(self.conn.data_to_send())

    def answer(self, stream_id, headers, body):
        path = headers.get(":path", "")
        if headers.get(":method") != "POST":
            status, extra, payload = 405, {}, {"error": "method"}
        elif path == "/token":
            status, extra, payload = self.standin.grant(body)
        else:
            status, extra, payload = self.standin.send(path, headers, body)
        data = json.dumps(payload).encode()
        response = [(":status", str(status)), ("content-type", "application/json; charset=UTF-8"),
                    ("content-length", str(len(data)))] + list(extra.items())
        self.conn.send_headers(stream_id, response)
        self.conn.send_data(stream_id, data, end_stream=True)


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--service-account", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    standin = StandIn(args)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.cert, args.key)
    context.set_alpn_protocols(["h2"])
    server = await asyncio.get_running_loop().create_server(lambda: Protocol(standin), "127.0.0.1", args.port,
                                                            ssl=context)
    print("READY", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
