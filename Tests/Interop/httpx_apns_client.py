"""An independent APNs client (httpx over HTTP/2, JWT signed with `cryptography`) used to check that
the PushWorker simulator answers like APNs. Prints one JSON line: status, reason, timestamp, headers.

    python3 httpx_apns_client.py --url https://localhost:PORT --ca ca.pem --key key.p8 \
        --team TEAM123456 --key-id KEY1234567 --token <hex>
"""
import argparse
import base64
import json
import sys
import time
import uuid

import httpx
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def provider_token(key_path: str, team: str, key_id: str) -> str:
    with open(key_path, "rb") as handle:
        key = serialization.load_pem_private_key(handle.read(), password=None)
    header = b64url(json.dumps({"alg": "ES256", "kid": key_id}, separators=(",", ":")).encode())
    claims = b64url(json.dumps({"iss": team, "iat": int(time.time())}, separators=(",", ":")).encode())
    signing_input = f"{header}.{claims}".encode()
    r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
    return f"{header}.{claims}.{b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--team", required=True)
    parser.add_argument("--key-id", required=True)
    parser.add_argument("--token", required=True, action="append", help="repeat for several sends with one JWT")
    args = parser.parse_args()

    # One provider token for every send, as APNs requires (a new one per request is TooManyProviderTokenUpdates).
    jwt = provider_token(args.key, args.team, args.key_id)
    with httpx.Client(http2=True, verify=args.ca, timeout=10) as client:
        for token in args.token:
            send(client, args.url, jwt, token)
    return 0


def send(client: httpx.Client, url: str, jwt: str, token: str) -> None:
    apns_id = str(uuid.uuid4())
    response = client.post(
        f"{url}/3/device/{token}",
        headers={
            "authorization": f"bearer {jwt}",
            "apns-topic": "com.example.app",
            "apns-push-type": "alert",
            "apns-priority": "10",
            "apns-id": apns_id,
        },
        content=json.dumps({"aps": {"alert": "hello from httpx"}}).encode(),
    )
    body = response.json() if response.content else {}
    print(json.dumps({
        "http_version": response.http_version,
        "status": response.status_code,
        "reason": body.get("reason"),
        "timestamp": body.get("timestamp"),
        "apns_id_echoed": response.headers.get("apns-id") == apns_id,
    }))


if __name__ == "__main__":
    sys.exit(main())
