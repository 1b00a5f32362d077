import APNsSimulator
import Foundation
import PushProcess
import PushQueue
import Testing

/// APNs features end to end with the real binary: what the simulator recorded, and each job's final row.
@Suite("APNs features: deliver-once, broadcasts, describe of dead letters")
struct APNsFeatureTests {
    static let update = #"{"aps":{"timestamp":1700000000,"event":"update","content-state":{"score":1}}}"#

    @Test(
        "deliver_once and broadcasts: apns-expiration 0; a no-storage channel refuses any other; describe shows it"
    )
    func deliverOnceAndBroadcasts() async throws {
        try await DaemonFixture.run(expected: .seconds(30)) { f in
            let endpoint = ["--apns-endpoint", "https://localhost:\(f.simulator.port)", "--apns-ca-file", f.caFile]
            let noStorage = try await f.cli(["channels", "create", "--bundle-id", "com.example.app"] + endpoint)
            let stored = try await f.cli(
                ["channels", "create", "--bundle-id", "com.example.app", "--storage", "most-recent"] + endpoint
            )
            #expect(noStorage.status == 0 && stored.status == 0, "\(noStorage.output) \(stored.output)")
            let plain = noStorage.output.trimmingCharacters(in: .whitespacesAndNewlines)
            let keeping = stored.output.trimmingCharacters(in: .whitespacesAndNewlines)
            let listed = try await f.cli(["channels", "list", "--bundle-id", "com.example.app"] + endpoint)
            #expect(listed.output.contains(plain) && listed.output.contains(keeping))

            let ids = try await f.db.int64s(
                """
                INSERT INTO push.jobs (topic, device_token, channel_id, payload, push_type, deliver_once, expires_at)
                VALUES ('com.example.app', '\(unescaped: DaemonFixture.token(1))', NULL, '{"aps":{"alert":"now"}}', 'alert', true, NULL),
                       ('com.example.app', '\(unescaped: DaemonFixture.token(2))', NULL, '{"aps":{"alert":"later"}}', 'alert', false, NULL),
                       ('com.example.app', NULL, '\(unescaped: plain)', '\(unescaped: Self.update)', 'liveactivity', false, NULL),
                       ('com.example.app', NULL, '\(unescaped: plain)', '\(unescaped: Self.update)', 'liveactivity', false, now() + interval '1 hour'),
                       ('com.example.app', NULL, '\(unescaped: keeping)', '\(unescaped: Self.update)', 'liveactivity', false, now() + interval '1 hour'),
                       ('com.example.app', '\(unescaped: DaemonFixture.token(3))', NULL, '{"aps":{"content-available":1,"mutable-content":1,"interruption-level":"loud"}}', 'background', false, NULL)
                RETURNING id
                """
            )
            let described = try await f.cli(["describe", "\(ids[0])"])
            #expect(described.output.contains("apns-expiration: 0"), "\(described.output)")

            let worker = try f.startWorker()
            defer {
                worker.signal(SIGTERM)
                worker.reap()
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
                delivered == [ids[0], ids[1], ids[2], ids[4], ids[5]],
                "the no-storage broadcast with expires_at is refused; a payload with warnings is still sent"
            )
            // Broadcasts carry the job's id as apns-request-id (no apns-id); the echoed id is stored.
            let broadcastRows = try await f.db.client.query(
                "SELECT apns_id::text, coalesce(apns_unique_id, '') FROM push.jobs WHERE id IN (\(ids[2]), \(ids[4])) ORDER BY id"
            ).decode((String, String).self).collect()
            for (apnsID, stored) in broadcastRows {
                let sent = broadcasts.filter { $0.headers["apns-request-id"] == apnsID }
                #expect(!sent.isEmpty && sent.allSatisfy { $0.headers["apns-id"] == nil }, "\(apnsID)")
                #expect(stored == apnsID, "the echoed apns-request-id is kept in apns_unique_id")
            }
            // Warnings: the background push with mutable-content and an unknown interruption level was sent,
            // and its row names both codes.
            let traps = try await f.db.client.query(
                "SELECT array_to_string(trap_ids, ',') FROM push.jobs WHERE id = \(ids[5])"
            ).decode(String.self).collect()
            #expect(traps == ["PW101,PW102"], "\(traps)")
            let warned = try await f.cli(["describe", "\(ids[5])"])
            #expect(
                warned.output.contains("warning PW101") && warned.output.contains("warning PW102"),
                "\(warned.output)"
            )
            let refused = try await f.db.client.query(
                "SELECT reason, error FROM push.dead_jobs WHERE id = \(ids[3])"
            ).decode((String, String).self).collect()
            #expect(refused.first?.0 == "BadExpirationDate", "\(refused)")
        }
    }

    @Test(
        "describe --row: a producer row before INSERT, one warning of each kind, the refusals with their fix, --apns-port 2197"
    )
    func describeRow() async throws {
        try await DaemonFixture.run { f in
            let token = DaemonFixture.token(7)
            let timestamp = Int(Date().timeIntervalSince1970)
            let start = #""event":"start","content-state":{},"attributes-type":"A","attributes":{}"#
            let cases: [(row: String, exit: Int32, expect: [String])] = [
                (
                    #"{"topic":"com.example.app","device_token":"\#(token)","payload":{"aps":{"alert":"hi"}}}"#, 0,
                    ["POST https://api.push.apple.com:2197/3/device/<token fp"]
                ),
                (
                    #"{"topic":"com.example.app","device_token":"\#(token)","push_type":"background","priority":5,"payload":{"aps":{"content-available":1,"badge":1}}}"#,
                    0, ["warning PW104"]
                ),
                (
                    #"{"topic":"com.example.app","device_token":"\#(token)","push_type":"liveactivity","payload":{"aps":{"timestamp":\#(timestamp),\#(start)}}}"#,
                    0, ["warning PW105"]
                ),
                (
                    #"{"topic":"com.example.app","device_token":"\#(token)","push_type":"liveactivity","payload":{"aps":{"timestamp":\#(timestamp + 40_000),"event":"update","content-state":{}}}}"#,
                    0, ["warning PW106"]
                ),
                (
                    #"{"topic":"com.example.app","device_token":"\#(token)","payload":{"aps":{"alert":"hi","sound":{"critical":1,"name":"default","volume":3}}}}"#,
                    0, ["warning PW107"]
                ),
                (
                    #"{"topic":"com.example.app","device_token":"\#(token)","payload":{"aps":{"alert":"","mutable-content":1,"interruption-level":"loud","relevance-score":7}}}"#,
                    0, ["warning PW101", "warning PW102", "warning PW103"]
                ),
                (
                    #"{"topic":"com.example.app","channel_id":"dGVzdA==","push_type":"liveactivity","payload":{"aps":{"timestamp":\#(timestamp),\#(start),"alert":"hi"}}}"#,
                    2, ["would not be sent: BroadcastStart [MS031]", "update and end"]
                ),
                (
                    #"{"topic":"com.example.app","device_token":"dQw4w9WgXcQ:APA91b\#(String(repeating: "x", count: 140))","payload":{"aps":{}}}"#,
                    2, ["FCM registration token", "platform = 'fcm'"]
                ),
                (
                    #"{"topic":"com.example.app","device_tokn":"ab","payload":{}}"#, 1,
                    ["device_tokn is not a producer column"]
                ),
            ]
            for (n, testCase) in cases.enumerated() {
                let file = f.directory + "/row-\(n).json"
                try testCase.row.write(toFile: file, atomically: true, encoding: .utf8)
                let described = try await f.cli(["describe", "--row", file, "--apns-port", "2197"])
                #expect(described.status == testCase.exit, "row \(n): \(described.output)")
                for fragment in testCase.expect {
                    #expect(described.output.contains(fragment), "row \(n): \(described.output)")
                }
                #expect(!described.output.contains(token), "row \(n): the device token is masked")
                print("describe --row \(n):\n\(described.output)")
            }
            let port = try await f.cli(["describe", "--row", f.directory + "/row-0.json", "--apns-port", "8443"])
            #expect(port.status != 0 && port.output.contains("443 and 2197"))
            let run = try await f.cli(["run", "--apns-port", "80", "--worker-id", "x"])
            #expect(run.status != 0 && run.output.contains("443 and 2197"), "\(run.output)")
        }
    }

    @Test("APNs' Date header 10 minutes ahead of the host: the worker warns with the skew and publishes it")
    func clockSkew() async throws {
        try await DaemonFixture.run(simulator: { $0.now = { Date().addingTimeInterval(600) } }) { f in
            try await f.insertAlerts(3)
            let worker = try f.startWorker("skewed", ["--log-level", "warning"])
            try await f.waitUntil(.seconds(30), "delivered") { try await f.unfinished() == 0 }
            try await f.waitUntil(.seconds(10), "the skew on /metrics") {
                let body = try await f.get(worker, "/metrics").1
                return body.split(separator: "\n").contains { line in
                    line.hasPrefix("push_clock_skew_seconds ")
                        && (Double(line.split(separator: " ").last ?? "") ?? 0) > 590
                }
            }
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0)
            #expect(worker.output.contains("s behind APNs': provider tokens will be refused"), "\(worker.output)")
        }
        // A host in step: no warning.
        try await DaemonFixture.run { f in
            try await f.insertAlerts(3)
            let worker = try f.startWorker("in-step", ["--log-level", "warning"])
            try await f.waitUntil(.seconds(30), "delivered") { try await f.unfinished() == 0 }
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0)
            #expect(!worker.output.contains("host clock"))
        }
    }

    @Test(
        "check-keys --online: one request per credential to a token no device has; BadDeviceToken says the key works, a refused key is named with its fix"
    )
    func checkKeysOnline() async throws {
        let untrusted = try SimulatorCredentials.generate(
            in: FileManager.default.temporaryDirectory.appendingPathComponent("cred-u-\(UUID().uuidString)").path,
            teamID: "TEAMUUUUUU",
            keyID: "KEYUUUUUUU"
        )
        try await DaemonFixture.run { f in
            let probe = "5f9d2c0e8a7b4c31" + String(repeating: "0", count: 32) + "70757368776f726b"
            f.simulator.script(probe, .respond(status: 400, reason: "BadDeviceToken"))
            let endpoint = ["--apns-endpoint", "https://localhost:\(f.simulator.port)", "--apns-ca-file", f.caFile]
            let good = try await f.cli(["check-keys", "--online", "--topic", "com.example.app"] + endpoint)
            #expect(good.status == 0, "\(good.output)")
            #expect(good.output.contains("online: credential default (production, topic com.example.app): ok"))
            #expect(f.simulator.requests.count == 1 && f.simulator.requests[0].deviceToken == probe)

            let config = f.directory + "/two.json"
            try """
            {"credentials": {
              "default": {"team_id": "\(f.credentials.teamID)", "key_id": "\(f.credentials.keyID)", "key_path": "\(f.keyPath)"},
              "stranger": {"team_id": "\(untrusted.teamID)", "key_id": "\(untrusted.keyID)", "key_path": "\(untrusted.keyPath)"}
            }}
            """.write(toFile: config, atomically: true, encoding: .utf8)
            let mixed = try await f.cli(
                ["check-keys", "--online", "--topic", "com.example.app", "--config", config] + endpoint
            )
            #expect(mixed.status == 1, "\(mixed.output)")
            #expect(mixed.output.contains("credential default (production, topic com.example.app): ok"))
            #expect(mixed.output.contains("credential stranger (production, topic com.example.app): refused: 403"))
            #expect(mixed.output.contains("[MS030]"), "\(mixed.output)")
            let noTopic = try await f.cli(["check-keys", "--online"] + endpoint)
            #expect(noTopic.status != 0 && noTopic.output.contains("--topic"))
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
            let old = try await f.cli(["describe", "1"])
            #expect(old.status == 0 && old.output.contains("a replay would send"), "\(old.output)")
            let expired = try await f.cli(["describe", "2"])
            #expect(expired.status == 2 && expired.output.contains("--expires-in"), "\(expired.output)")
        }
    }

    @Test("text output never passes a control character from the database to the terminal")
    func controlCharactersAreEscaped() async throws {
        try await DaemonFixture.run { f in
            // push.dead_jobs has no constraint on its text: anyone with INSERT there writes what an operator reads.
            try await f.db.execute(
                """
                INSERT INTO push.dead_jobs (id, topic, device_token, payload, push_type, environment, credential,
                                            run_at, apns_id, attempts, reason, created_at, error, first_attempt_at)
                VALUES (3, 'com.example.app' || chr(27) || ']0;owned' || chr(7), '\(DaemonFixture.token(3))',
                        '{"aps":{"alert":"x"}}', 'alert', 'production', 'default', now(), gen_random_uuid(), 3,
                        'Bad' || chr(27) || '[2J', now(), 'gave up ' || chr(8238) || 'txt.exe' || chr(155) || 'H',
                        now())
                """
            )
            for arguments in [["describe", "3"], ["dead", "list"], ["dead", "show", "3"]] {
                let result = try await f.cli(arguments)
                let scalars = result.output.unicodeScalars.map(\.value)
                #expect(
                    !scalars.contains(where: { [0x1B, 0x07, 0x9B, 0x202E].contains($0) }),
                    "\(arguments): a raw control character reached the output: \(result.output.debugDescription)"
                )
                #expect(result.output.contains("\\u{1B}"), "\(arguments): \(result.output)")
            }
        }
    }

    @Test(
        "a key APNs refuses: its claimed jobs are held unsent and uncounted, other credentials keep sending, one log line per pause, sending resumes once the key is accepted"
    )
    func refusedKeyIsHeld() async throws {
        let second = try SimulatorCredentials.generate(
            in: FileManager.default.temporaryDirectory.appendingPathComponent("cred-b-\(UUID().uuidString)").path,
            teamID: "TEAMBBBBBB",
            keyID: "KEYBBBBBBB"
        )
        try await DaemonFixture.run(simulator: { $0.keys[second.keyID] = second.trustedKey }) { f in
            let config = f.directory + "/config.json"
            try """
            {"credentials": {
              "default": {"team_id": "\(f.credentials.teamID)", "key_id": "\(f.credentials.keyID)", "key_path": "\(f.keyPath)"},
              "brand-b": {"team_id": "\(second.teamID)", "key_id": "\(second.keyID)", "key_path": "\(second.keyPath)"}
            }}
            """.write(toFile: config, atomically: true, encoding: .utf8)
            f.simulator.refuseKey(f.credentials.keyID, reason: "InvalidProviderToken")
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, credential)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{}}', 'default' FROM generate_series(1, 60) g
                """
            )
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, credential)
                SELECT 'com.example.app', lpad(to_hex(g), 64, 'b'), '{"aps":{}}', 'brand-b' FROM generate_series(1, 20) g
                """
            )
            let worker = try ChildProcess.start(
                DaemonFixture.binary,
                [
                    "run", "--worker-id", "keys", "--config", config, "--apns-endpoint",
                    "https://localhost:\(f.simulator.port)", "--apns-ca-file", f.caFile, "--poll-interval-ms", "200",
                    "--no-metrics", "--log-level", "info", "--credential-pause", "3s",
                ],
                environment: ["DATABASE_URL": f.db.url.connectionString],
                outputPath: f.directory + "/keys.log"
            )
            f.children.add(worker)
            defer {
                worker.signal(SIGTERM)
                worker.reap()
            }
            try await f.waitUntil(.seconds(30), "the other credential's jobs delivered") {
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE credential = 'brand-b' AND state = 'delivered'"
                )
                    == 20
            }
            // (Under load, brand-b's jobs may all be answered before the refused key's first answer is read.)
            try await f.waitUntil(.seconds(30), "the refused key paused") {
                worker.output.contains("APNs refused credential 'default'")
            }
            func refused() -> Int {
                // Only the refused key is answered 403 (its tokens never verify, so no key id is recorded).
                f.simulator.requests.filter { $0.status == 403 && $0.reason == "InvalidProviderToken" }.count
            }
            let pauses = worker.output.components(separatedBy: "APNs refused credential 'default'").count - 1
            #expect(
                pauses >= 1 && refused() <= 2 * pauses + 2,
                "\(refused()) refusals for \(pauses) pauses, not one per job"
            )
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE credential = 'default' AND (state = 'delivered' OR attempts > 1)"
                ) == 0,
                "held, not sent, no attempt burnt"
            )
            // The key is fixed: the held jobs go out by themselves within a pause or two.
            f.simulator.refuseKey(f.credentials.keyID, reason: nil)
            try await f.waitUntil(.seconds(30), "the held jobs delivered once the key is accepted") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == 80
            }
            let finalPauses = worker.output.components(separatedBy: "APNs refused credential 'default'").count - 1
            #expect(
                refused() <= 2 * finalPauses + 2,
                "\(refused()) refusals in all for \(finalPauses) pauses: \(worker.output.suffix(1500))"
            )
            #expect(
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE credential = 'default' AND attempts > 2")
                    == 0
            )
            try await FaultTests.assertInvariants(f, jobs: 80, diedWorkers: [])
        }
    }

    @Test("channels: create, list, show and delete with --credential, through the CLI, signed by the right key")
    func channelsCLI() async throws {
        let second = try SimulatorCredentials.generate(
            in: FileManager.default.temporaryDirectory.appendingPathComponent("cred-c-\(UUID().uuidString)").path,
            teamID: "TEAMCCCCCC",
            keyID: "KEYCCCCCCC"
        )
        try await DaemonFixture.run(simulator: { $0.keys[second.keyID] = second.trustedKey }) { f in
            let config = f.directory + "/config.json"
            try """
            {"credentials": {"brand-c": {"team_id": "\(second.teamID)", "key_id": "\(second.keyID)", "key_path": "\(second.keyPath)"}}}
            """.write(toFile: config, atomically: true, encoding: .utf8)
            let common = [
                "--bundle-id", "com.example.app", "--apns-endpoint", "https://localhost:\(f.simulator.port)",
                "--apns-ca-file", f.caFile, "--config", config, "--credential", "brand-c",
            ]
            let created = try await f.cli(["channels", "create", "--storage", "most-recent"] + common)
            #expect(created.status == 0, "\(created.output)")
            let id = created.output.trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(f.simulator.requests.last?.tokenKeyID == second.keyID, "signed by brand-c's key")
            #expect(try await f.cli(["channels", "list"] + common).output.contains(id))
            let shown = try await f.cli(["channels", "show", id, "--json"] + common)
            #expect(shown.status == 0 && shown.output.contains("most-recent"), "\(shown.output)")
            let deleted = try await f.cli(["channels", "delete", id] + common)
            #expect(deleted.status == 0 && deleted.output.contains("deleted"), "\(deleted.output)")
            let gone = try await f.cli(["channels", "show", id] + common)
            #expect(gone.status != 0 && gone.output.contains("ChannelNotRegistered"), "\(gone.output)")
            let unknown = try await f.cli(["channels", "list", "--credential", "nobody"] + Array(common.dropLast(2)))
            #expect(unknown.status != 0 && unknown.output.contains("nobody"), "\(unknown.output)")
        }
    }
}
