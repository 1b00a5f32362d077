import APNsSimulator
import Foundation
import PostgresNIO
import PushProcess
import PushQueue
import PushQueueTesting
import Testing

/// Live Activities with a life (CONTRACT 1e), end to end: the real binary, three workers, producers racing
/// each other. The simulator plays the devices as iOS behaves (Apple, "Starting and updating Live Activities
/// with ActivityKit push notifications"): APNs answers 200 to everything, and the device drops silently a start
/// sent to an activity's token, an update or end sent to a push-to-start token, a timestamp not newer than
/// the one it shows, and anything after the end. Those drops are what this test counts.
@Suite("Live Activities end to end: raced updates, a late start, an end, and nothing after it")
struct LiveActivityDaemonTests {
    @Test(
        "one activity raced by 1,000 updates from 4 producers across 3 workers, a late start, an end, then 50 more updates: the activity's token receives strictly increasing timestamps and nothing after the end, the start goes to push-to-start tokens only, the device drops nothing; the invariants"
    )
    func race() async throws {
        let seed =
            ProcessInfo.processInfo.environment["PUSH_ACTIVITY_SEED"].flatMap(UInt64.init)
            ?? UInt64.random(in: 1...999_999)
        print("live activity race seed \(seed) (PUSH_ACTIVITY_SEED=\(seed) replays it)")
        try await DaemonFixture.run { f in
            let tokens = (
                activity: DaemonFixture.token(0xA1), start1: DaemonFixture.token(0xB1),
                start2: DaemonFixture.token(0xB2), device: DaemonFixture.token(0xC1)
            )
            f.simulator.registerLiveActivity(token: tokens.activity, kind: .activity)
            f.simulator.registerLiveActivity(token: tokens.start1, kind: .pushToStart)
            f.simulator.registerLiveActivity(token: tokens.start2, kind: .pushToStart)
            try await f.db.execute(
                """
                INSERT INTO push.devices (recipient, topic, token, kind, activity_id) VALUES
                ('user:1', 'com.example.app', '\(tokens.activity)', 'activity', 'race'),
                ('user:1', 'com.example.app', '\(tokens.start1)', 'push_to_start', NULL),
                ('user:1', 'com.example.app', '\(tokens.start2)', 'push_to_start', NULL),
                ('user:1', 'com.example.app', '\(tokens.device)', 'device', NULL)
                """
            )
            try await f.db.execute(
                "INSERT INTO push.activities (topic, activity_id, recipient) VALUES ('com.example.app', 'race', 'user:1')"
            )
            let workers = try ["a", "b", "c"].map { try f.startWorker($0) }
            let base: Int64 = 1_800_000_000
            // 1,000 updates with the timestamps base+1 … base+1000, dealt at random to 4 producers, each
            // committing its own in its own random order; the start (timestamp base+500) is committed by a
            // producer half-way through its updates.
            var random = SeededGenerator(seed: seed)
            let shuffled = (1...1000).map { base + Int64($0) }.shuffled(using: &random)
            let producers = (0..<4).map { k in Array(shuffled[(k * 250)..<((k + 1) * 250)]) }
            let startAfter = Int.random(in: 100..<150, using: &random)
            func event(_ name: String, _ ts: Int64) -> String {
                """
                INSERT INTO push.jobs (topic, activity_id, push_type, priority, payload)
                VALUES ('com.example.app', 'race', 'liveactivity', 10,
                        '{"aps":{"event":"\(name)","timestamp":\(ts),"content-state":{"n":\(ts - base)}\(name == "start" ? ",\"attributes-type\":\"Order\",\"attributes\":{},\"alert\":{\"title\":\"Order\",\"body\":\"placed\"}" : "")}}')
                """
            }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (k, timestamps) in producers.enumerated() {
                    group.addTask {
                        // Each producer commits its events one statement at a time, beside the others, on the
                        // pool's connections.
                        for (n, ts) in timestamps.enumerated() {
                            if k == 0 && n == startAfter {
                                try await f.db.execute(event("start", base + 500))
                            }
                            try await f.db.execute(event("update", ts))
                        }
                    }
                }
                try await group.waitForAll()
            }
            try await f.db.execute(event("end", base + 2000))
            for n in 1...50 {
                try await f.db.execute(event("update", base + 2000 + Int64(n)))
            }
            try await f.waitUntil(.seconds(120), "every event and child terminal") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state IN ('pending', 'running')") == 0
            }
            for worker in workers {
                worker.signal(SIGTERM)
                #expect(worker.wait() == 0, "\(worker.output.suffix(2000))")
            }

            // At the stand-in.
            func aps(_ request: RecordedRequest) -> (event: String, ts: Int64)? {
                guard let object = try? JSONSerialization.jsonObject(with: Data(request.body)) as? [String: Any],
                    let aps = object["aps"] as? [String: Any], let name = aps["event"] as? String,
                    let ts = (aps["timestamp"] as? NSNumber)?.int64Value
                else { return nil }
                return (name, ts)
            }
            let requests = f.simulator.requests.filter { $0.status == 200 }
            let toActivity = requests.filter { $0.deviceToken == tokens.activity }.compactMap(aps)
            let toStart = requests.filter { [tokens.start1, tokens.start2].contains($0.deviceToken) }.compactMap(aps)
            let increasing = zip(toActivity, toActivity.dropFirst()).allSatisfy { $0.ts < $1.ts }
            #expect(increasing, "the activity's token received strictly increasing timestamps: \(toActivity.map(\.ts))")
            #expect(toActivity.last?.event == "end", "the end came last: \(toActivity.suffix(3))")
            #expect(toActivity.filter { $0.event == "start" }.isEmpty, "no start to the activity's token")
            #expect(
                toStart.count == 2 && toStart.allSatisfy { $0.event == "start" },
                "the start to both push-to-start tokens"
            )
            #expect(requests.filter { $0.deviceToken == tokens.device }.isEmpty, "nothing to the plain device token")
            #expect(
                f.simulator.droppedByDevice.isEmpty,
                "dropped by the device: \(f.simulator.droppedByDevice.prefix(5))"
            )

            // In the table: every event routed, superseded or dead with a named reason.
            let outcomes = try await f.db.client.query(
                """
                SELECT coalesce(reason, state), count(*) FROM push.jobs WHERE activity_id = 'race' GROUP BY 1 ORDER BY 1
                """
            ).decode((String, Int64).self).collect()
            print("live activity race seed \(seed): outcomes \(outcomes)")
            let byOutcome = Dictionary(uniqueKeysWithValues: outcomes)
            #expect(
                byOutcome.keys.allSatisfy { ["fanned_out", "StaleTimestamp", "ActivityEnded"].contains($0) },
                "\(outcomes)"
            )
            #expect(byOutcome.values.reduce(0, +) == 1052, "1,000 updates, the start, the end, 50 after: \(outcomes)")
            #expect((byOutcome["ActivityEnded"] ?? 0) >= 50, "the 50 after the end: \(outcomes)")
            #expect(try await f.db.int64("SELECT count(*) FROM push.dead_jobs") == 0)
            let activity = try await f.db.client.query(
                "SELECT state, last_timestamp FROM push.activities WHERE activity_id = 'race'"
            ).decode((String, Int64).self).collect()
            #expect(activity.first?.0 == "ended" && activity.first?.1 == base + 2000)
            let demoted = try await f.db.int64(
                "SELECT count(*) FROM push.jobs WHERE parent_id IS NOT NULL AND 'MS015' = ANY (trap_ids)"
            )
            let children = try await f.db.int64("SELECT count(*) FROM push.jobs WHERE parent_id IS NOT NULL")
            let summary = try await Invariants.assert(
                simulator: f.simulator,
                jobs: Int(try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state <> 'fanned_out'")),
                diedWorkers: [],
                oneJobPerToken: false,
                context: "live activity seed \(seed)",
                count: { try await f.db.int64(PostgresQuery(unsafeSQL: $0)) },
                texts: { try await f.db.client.query(PostgresQuery(unsafeSQL: $0)).decode(String.self).collect() }
            )
            // What an operator sees.
            let listed = try await f.cli(["activities"])
            print("activities:\n\(listed.output)")
            #expect(listed.status == 0 && listed.output.contains("race") && listed.output.contains("ended"))
            let shown = try await f.cli(["activities", "show", "race", "--topic", "com.example.app"])
            print(
                "activities show race (first and last lines):\n\(shown.output.split(separator: "\n").prefix(12).joined(separator: "\n"))\n…\n\(shown.output.split(separator: "\n").suffix(3).joined(separator: "\n"))"
            )
            #expect(shown.status == 0 && shown.output.contains("events 1052") && shown.output.contains("ActivityEnded"))
            let afterEnd = try await f.db.int64(
                "SELECT max(id) FROM push.jobs WHERE activity_id = 'race' AND reason = 'ActivityEnded'"
            )
            let described = try await f.cli(["describe", "\(afterEnd)"])
            print("describe \(afterEnd) (an update after the end):\n\(described.output)")
            #expect(described.output.contains("not sent, superseded ActivityEnded"))
            let ended = try await f.cli(["activities", "end", "1"])
            #expect(ended.status != 0 && ended.output.contains("already ended"), "\(ended.output)")
            print(
                "live activity race seed \(seed): events \(outcomes.map { "\($0.0) \($0.1)" }.joined(separator: ", ")); the activity's token received \(toActivity.count) (\(toActivity.filter { $0.event == "update" }.count) updates, then the end), the push-to-start tokens \(toStart.count) starts; children \(children), \(demoted) at priority 5 past the budget (MS015); dropped by the device \(f.simulator.droppedByDevice.count); \(summary)"
            )
        }
    }

    @Test(
        "500 activities with broadcast channels (250 given, 250 asked of the worker), ended: the asked channels created, each end goes to its channel, and every channel is deleted once the end's dismissal date passes; stats counts them"
    )
    func channelsDeletedAfterDismissal() async throws {
        try await DaemonFixture.run(expected: .seconds(20)) { f in
            let bundle = "com.example.app"
            var values: [String] = []
            for n in 1...250 {
                let channel = try #require(f.simulator.addChannel(bundle: bundle))
                values.append("('\(bundle)', 'match-\(n)', '\(channel)', false)")
            }
            for n in 251...500 { values.append("('\(bundle)', 'match-\(n)', NULL, true)") }
            try await f.db.execute(
                "INSERT INTO push.activities (topic, activity_id, channel_id, wants_channel) VALUES \(values.joined(separator: ", "))"
            )
            let stats = try await f.cli(["stats"])
            #expect(stats.output.contains("activity channels  production 250 of 10,000"), "\(stats.output)")
            let now = Int64(Date().timeIntervalSince1970)
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, activity_id, push_type, payload)
                SELECT '\(bundle)', 'match-' || n, 'liveactivity',
                       jsonb_build_object('aps', jsonb_build_object('event', 'end', 'timestamp', \(now),
                                          'dismissal-date', \(now + 3), 'content-state', jsonb_build_object('score', n)))
                  FROM generate_series(1, 500) AS n
                """
            )
            let worker = try f.startWorker("w1")
            try await f.waitUntil(.seconds(90), "the asked channels created") {
                try await f.db.int64("SELECT count(*) FROM push.activities WHERE channel_id IS NULL") == 0
            }
            try await f.waitUntil(.seconds(90), "every channel of an ended activity deleted") {
                try await f.db.int64(
                    "SELECT count(*) FROM push.activities WHERE channel_deleted_at IS NULL"
                ) == 0
            }
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0, "\(worker.output.suffix(2000))")
            let after = f.simulator.channelCount(bundle: bundle)
            let ends = f.simulator.requests.filter { $0.path.hasPrefix("/4/broadcasts/apps/") && $0.status == 200 }
            let channels = Set(ends.compactMap { $0.headers["apns-channel-id"] })
            let named = Set(
                try await f.db.client.query("SELECT channel_id FROM push.activities").decode(String.self).collect()
            )
            let created = f.simulator.requests.filter { $0.method == "POST" && $0.path.hasSuffix("/channels") }
            #expect(
                created.filter { $0.status == 201 }.count == 250 && after == 0,
                "created \(created.count), after \(after)"
            )
            #expect(ends.count == 500 && channels == named, "each end to its own channel: \(ends.count)")
            #expect(try await f.db.int64("SELECT count(*) FROM push.activities WHERE state = 'ended'") == 500)
            let statsAfter = try await f.cli(["stats"])
            #expect(!statsAfter.output.contains("activity channels"), "\(statsAfter.output)")
            print(
                "channels of 500 activities (250 given, 250 asked for): 250 before, \(created.count) created by the worker, \(after) left after their dismissal; \(ends.count) ends sent, each to its own channel"
            )
        }
    }
}
