import APNsSimulator
import Foundation
import PushProcess
import PushQueue
import Testing

/// APNs features end to end with the real binary: what the simulator recorded, and each job's final row.
@Suite("APNs features: deliver-once, broadcasts, describe of dead letters", .serialized)
struct APNsFeatureTests {
    static let update = #"{"aps":{"timestamp":1700000000,"event":"update","content-state":{"score":1}}}"#

    @Test(
        "deliver_once and broadcasts: apns-expiration 0; a no-storage channel refuses any other; describe shows it"
    )
    func deliverOnceAndBroadcasts() async throws {
        try await DaemonFixture.run { f in
            let endpoint = ["--apns-endpoint", "https://localhost:\(f.simulator.port)", "--apns-ca-file", f.caFile]
            let noStorage = try f.cli(["channels", "create", "--bundle-id", "com.example.app"] + endpoint)
            let stored = try f.cli(
                ["channels", "create", "--bundle-id", "com.example.app", "--storage", "most-recent"] + endpoint
            )
            #expect(noStorage.status == 0 && stored.status == 0, "\(noStorage.output) \(stored.output)")
            let plain = noStorage.output.trimmingCharacters(in: .whitespacesAndNewlines)
            let keeping = stored.output.trimmingCharacters(in: .whitespacesAndNewlines)
            let listed = try f.cli(["channels", "list", "--bundle-id", "com.example.app"] + endpoint)
            #expect(listed.output.contains(plain) && listed.output.contains(keeping))

            let ids = try await f.db.int64s(
                """
                INSERT INTO push.jobs (topic, device_token, channel_id, payload, push_type, deliver_once, expires_at)
                VALUES ('com.example.app', '\(unescaped: DaemonFixture.token(1))', NULL, '{"aps":{"alert":"now"}}', 'alert', true, NULL),
                       ('com.example.app', '\(unescaped: DaemonFixture.token(2))', NULL, '{"aps":{"alert":"later"}}', 'alert', false, NULL),
                       ('com.example.app', NULL, '\(unescaped: plain)', '\(unescaped: Self.update)', 'liveactivity', false, NULL),
                       ('com.example.app', NULL, '\(unescaped: plain)', '\(unescaped: Self.update)', 'liveactivity', false, now() + interval '1 hour'),
                       ('com.example.app', NULL, '\(unescaped: keeping)', '\(unescaped: Self.update)', 'liveactivity', false, now() + interval '1 hour')
                RETURNING id
                """
            )
            let described = try f.cli(["describe", "\(ids[0])"])
            #expect(described.output.contains("apns-expiration: 0"), "\(described.output)")

            let worker = try f.startWorker()
            defer {
                worker.signal(SIGTERM)
                _ = worker.wait()
            }
            try await f.waitUntil(.seconds(30), "every job terminal") { try await f.unfinished() == 0 }

            func expiration(_ match: (RecordedRequest) -> Bool) -> [String] {
                f.simulator.requests.filter(match).compactMap { $0.headers["apns-expiration"] }
            }
            #expect(expiration { $0.path.hasSuffix(DaemonFixture.token(1)) } == ["0"], "deliver_once")
            #expect(expiration { $0.path.hasSuffix(DaemonFixture.token(2)) }.allSatisfy { $0 != "0" }, "default")
            let broadcasts = f.simulator.requests.filter { $0.path.hasPrefix("/4/broadcasts/") }
            #expect(
                broadcasts.filter { $0.headers["apns-channel-id"] == plain }.map { $0.headers["apns-expiration"] }
                    .contains("0")
            )

            let delivered = try await f.db.int64s(
                "SELECT id FROM push.jobs WHERE state = 'delivered' ORDER BY id"
            )
            #expect(
                delivered == [ids[0], ids[1], ids[2], ids[4]],
                "the no-storage broadcast with expires_at is refused"
            )
            let refused = try await f.db.client.query(
                "SELECT reason, error FROM push.dead_jobs WHERE id = \(ids[3])"
            ).decode((String, String).self).collect()
            #expect(refused.first?.0 == "BadExpirationDate", "\(refused)")
        }
    }

    @Test("describe of a dead letter shows the request a replay would send, or how to make the replay live")
    func describeDeadLetter() async throws {
        try await DaemonFixture.run { f in
            for (id, expires) in [(1, "NULL"), (2, "now() - interval '1 minute'")] {
                try await f.db.execute(
                    """
                    INSERT INTO push.dead_jobs (id, topic, device_token, payload, push_type, environment, credential,
                                                run_at, apns_id, attempts, reason, created_at, error, expires_at,
                                                first_attempt_at)
                    VALUES (\(id), 'com.example.app', '\(DaemonFixture.token(id))', '{"aps":{"alert":"x"}}', 'alert',
                            'production', 'default', now() - interval '2 hours', gen_random_uuid(), 3,
                            'ServiceUnavailable', now() - interval '2 hours', 'gave up', \(expires),
                            now() - interval '2 hours')
                    """
                )
            }
            let old = try f.cli(["describe", "1"])
            #expect(old.status == 0 && old.output.contains("a replay would send"), "\(old.output)")
            let expired = try f.cli(["describe", "2"])
            #expect(expired.status == 2 && expired.output.contains("--expires-in"), "\(expired.output)")
        }
    }
}
