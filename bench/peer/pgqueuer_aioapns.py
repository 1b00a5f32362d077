"""The peer for `push-bench e2e --peer`: what a Python team builds from PyPI to send pushes from Postgres.

PGQueuer 1.6 (a Postgres job queue: SKIP LOCKED dequeue, LISTEN/NOTIFY, a log row per finished job) with an
entrypoint that sends each job through aioapns 4.0 (HTTP/2 with h2, ES256 provider tokens). The harness runs
`enqueue` once, then `work` in two processes (one per core), against the same Postgres cluster and the same
nghttpd as push-worker, and reads their CPU from /proc.

aioapns only talks to Apple's hosts: `work` points its production protocol at 127.0.0.1:<port> under the
name `localhost` (the sink's certificate), trusts the sink's certificate and offers ALPN "h2" (Apple's
servers do not need it, nghttpd does); nothing else is changed.

    python pgqueuer_aioapns.py enqueue --dsn DSN --jobs 50000
    python pgqueuer_aioapns.py work --dsn DSN --port PORT --ca CA.pem --key KEY.p8 --key-id ID --team-id TEAM
"""

import argparse
import asyncio
import json
import ssl
import uuid

import asyncpg
from aioapns import APNs, NotificationRequest, PushType
from aioapns import connection as apns_connection
from h2.connection import H2Connection
from h2.events import DataReceived, ResponseReceived
from pgqueuer import AsyncpgDriver, Job, QueueManager, Queries

ENTRYPOINT = "push"
PAYLOAD = {"aps": {"alert": {"title": "Order shipped", "body": "Arrives Tuesday"}}}


async def enqueue(dsn: str, jobs: int) -> None:
    connection = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(connection))
    if not await queries.schema_is_installed():
        await queries.install()
    await connection.execute("TRUNCATE pgqueuer, pgqueuer_log")
    step = 5_000
    for first in range(1, jobs + 1, step):
        numbers = range(first, min(first + step, jobs + 1))
        payloads = [json.dumps({"token": "%064x" % n, "payload": PAYLOAD}).encode() for n in numbers]
        await queries.enqueue([ENTRYPOINT] * len(payloads), payloads, [0] * len(payloads))
    await connection.execute("VACUUM ANALYZE pgqueuer")
    await connection.close()


class StandInConnection(H2Connection):
    """Makes nghttpd's answers look like Apple's to aioapns: Apple echoes the request's apns-id in every response
    (aioapns matches answers by it) and sends no body with a 200 (aioapns parses every DATA frame as JSON).
    nghttpd does neither, so the response gets the apns-id its stream was sent with, and empty DATA is dropped."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent_ids = {}

    def send_headers(self, stream_id, headers, *args, **kwargs):
        for name, value in headers:
            if name in ("apns-id", b"apns-id"):
                self.sent_ids[stream_id] = value.encode() if isinstance(value, str) else value
        return super().send_headers(stream_id, headers, *args, **kwargs)

    def receive_data(self, data):
        events = []
        for event in super().receive_data(data):
            if isinstance(event, ResponseReceived):
                apns_id = self.sent_ids.pop(event.stream_id, None)
                if apns_id is not None and not any(name == b"apns-id" for name, _ in event.headers):
                    event.headers = list(event.headers) + [(b"apns-id", apns_id)]
            elif isinstance(event, DataReceived) and not event.data:
                continue
            events.append(event)
        return events


async def work(arguments: argparse.Namespace) -> None:
    apns_connection.H2Connection = StandInConnection
    # Apple's host name is a class attribute of the protocol: the sink answers for `localhost`.
    apns_connection.APNsProductionClientProtocol.APNS_SERVER = "localhost"
    apns_connection.APNsProductionClientProtocol.APNS_PORT = arguments.port
    context = ssl.create_default_context(cafile=arguments.ca)
    # aioapns offers no ALPN (Apple's servers speak HTTP/2 without it); nghttpd needs "h2" offered.
    context.set_alpn_protocols(["h2"])
    with open(arguments.key) as file:
        key = file.read()
    apns = APNs(
        key=key,
        key_id=arguments.key_id,
        team_id=arguments.team_id,
        topic=arguments.topic,
        use_sandbox=False,
        ssl_context=context,
    )
    connection = await asyncpg.connect(arguments.dsn)
    manager = QueueManager(Queries(AsyncpgDriver(connection)))

    @manager.entrypoint(ENTRYPOINT)
    async def push(job: Job) -> None:
        body = json.loads(job.payload)
        result = await apns.send_notification(
            NotificationRequest(
                device_token=body["token"],
                message=body["payload"],
                notification_id=str(uuid.uuid4()),
                push_type=PushType.ALERT,
                priority=10,
            )
        )
        if not result.is_successful:
            raise RuntimeError(f"APNs answered {result.status} {result.description}")

    await manager.run(batch_size=arguments.batch, max_concurrent_tasks=arguments.concurrency)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    enqueue_parser = commands.add_parser("enqueue")
    enqueue_parser.add_argument("--dsn", required=True)
    enqueue_parser.add_argument("--jobs", type=int, required=True)
    work_parser = commands.add_parser("work")
    work_parser.add_argument("--dsn", required=True)
    work_parser.add_argument("--port", type=int, required=True)
    work_parser.add_argument("--ca", required=True)
    work_parser.add_argument("--key", required=True)
    work_parser.add_argument("--key-id", required=True)
    work_parser.add_argument("--team-id", required=True)
    work_parser.add_argument("--topic", default="com.example.app")
    work_parser.add_argument("--batch", type=int, default=100)
    work_parser.add_argument("--concurrency", type=int, default=500)
    arguments = parser.parse_args()
    if arguments.command == "enqueue":
        asyncio.run(enqueue(arguments.dsn, arguments.jobs))
    else:
        asyncio.run(work(arguments))


if __name__ == "__main__":
    main()
