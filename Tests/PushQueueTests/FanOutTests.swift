import Foundation
import PostgresNIO
import PushCore
import PushQueueTesting
import Testing

@testable import PushQueue

/// Jobs addressed to a person (schema 18, CONTRACT 1d): a recipient's job fans out when claimed, one child per
/// live device, each with a derived apns_id; no live device is NoDevice; a fan-out happens once.
@Suite("Fan-out: a recipient's job becomes one child job per live device")
struct FanOutTests {
    static let tokens = ["aa", "bb", "cc", "dd"].map { String(repeating: $0, count: 32) }

    static func parent(_ db: TestDatabase, recipient: String = "user:1", key: String? = nil) async throws -> Int64 {
        let key = key.map { "'\($0)'" } ?? "NULL"
        return try await db.int64(
            "INSERT INTO push.jobs (topic, recipient, payload, coalesce_key) VALUES ('com.example.app', '\(unescaped: recipient)', '{\"aps\":{\"alert\":\"hi\"}}', \(unescaped: key)) RETURNING id"
        )
    }

    @Test(
        "three devices (one invalidated, one another app's): two children with derived apns_ids, the parent fanned_out with their ids; again after a crash: no second child"
    )
    func fansOutToLiveDevices() async throws {
        try await TestPostgres.withDatabase { db in
            for token in Self.tokens.prefix(3) {
                try await DevicesTests.upsert(db, recipient: "user:1", token: token)
            }
            try await DevicesTests.upsert(db, recipient: "user:1", token: Self.tokens[3], topic: "com.example.other")
            try await DevicesTests.invalid(db, token: Self.tokens[2])
            let parent = try await Self.parent(db)
            let claimed = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(claimed.map(\.id) == [parent] && claimed.first?.recipient == "user:1")
            let results = try await db.queue.fanOut(claimed, workerID: "w")
            #expect(results.count == 1 && results[0].state == "fanned_out" && results[0].children.count == 2)
            let rows = try await db.client.query(
                """
                SELECT c.device_token, c.apns_id = push.child_apns_id(p.apns_id, c.device_token), c.state,
                       c.payload = p.payload, p.state, p.children = (SELECT array_agg(id ORDER BY id) FROM push.jobs WHERE parent_id = p.id)
                  FROM push.jobs AS c JOIN push.jobs AS p ON p.id = c.parent_id ORDER BY c.device_token
                """
            ).decode((String, Bool, String, Bool, String, Bool).self).collect()
            #expect(rows.map(\.0) == Array(Self.tokens.prefix(2)))
            #expect(rows.allSatisfy { $0.1 && $0.2 == "pending" && $0.3 && $0.4 == "fanned_out" && $0.5 })
            // A second fan-out of the same claim (a retry after a lost answer) does nothing: the parent is no
            // longer running, and the unique index would refuse a second child anyway.
            #expect(try await db.queue.fanOut(claimed, workerID: "w").isEmpty)
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE parent_id IS NOT NULL") == 2)
            // The children are claimed and sent as any job.
            let children = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(Set(children.compactMap(\.deviceToken)) == Set(Self.tokens.prefix(2)))
        }
    }

    @Test("a recipient with no live device: the parent is a dead letter, NoDevice, with a sentence naming the fix")
    func noDevice() async throws {
        try await TestPostgres.withDatabase { db in
            try await DevicesTests.upsert(db, recipient: "user:2", token: Self.tokens[0])
            try await DevicesTests.invalid(db, token: Self.tokens[0])
            let parent = try await Self.parent(db, recipient: "user:2")
            let claimed = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60))
            let results = try await db.queue.fanOut(claimed, workerID: "w")
            #expect(results == [FanOut(parentID: parent, state: "dead", children: [])])
            let dead = try await db.client.query(
                "SELECT reason, error, recipient FROM push.dead_jobs WHERE id = \(unescaped: String(parent))"
            ).decode((String, String, String).self).collect()
            #expect(dead.count == 1 && dead[0].0 == "NoDevice" && dead[0].2 == "user:2")
            #expect(
                dead.first?.1.contains("recipient 'user:2' has no live device for topic 'com.example.app' on apns")
                    == true
            )
        }
    }

    @Test("fenced: a parent cancelled, or taken back by another worker's claim, after this claim is not fanned out")
    func fenced() async throws {
        try await TestPostgres.withDatabase { db in
            try await DevicesTests.upsert(db, recipient: "user:3", token: Self.tokens[0])
            let parent = try await Self.parent(db, recipient: "user:3")
            let claimed = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(try await db.queue.fanOut(claimed, workerID: "other").isEmpty, "another worker's name")
            _ = try await db.queue.cancel(ids: [parent])
            #expect(try await db.queue.fanOut(claimed, workerID: "w").isEmpty, "cancelled meanwhile")
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE parent_id IS NOT NULL") == 0)
        }
    }

    @Test("latest wins across recipients' jobs: an older keyed parent fanned out after a newer one is superseded by it")
    func latestWins() async throws {
        try await TestPostgres.withDatabase { db in
            try await DevicesTests.upsert(db, recipient: "user:4", token: Self.tokens[0])
            let older = try await Self.parent(db, recipient: "user:4", key: "score:4")
            let olderClaim = try await db.queue.claim(limit: 1, workerID: "w", lease: .seconds(60))
            #expect(olderClaim.map(\.id) == [older])
            let newer = try await Self.parent(db, recipient: "user:4", key: "score:4")
            let results = try await db.queue.fanOut(olderClaim, workerID: "w")
            #expect(results == [FanOut(parentID: older, state: "superseded", children: [])])
            #expect(
                try await db.int64("SELECT superseded_by FROM push.jobs WHERE id = \(unescaped: String(older))")
                    == newer
            )
            let newerClaim = try await db.queue.claim(limit: 1, workerID: "w", lease: .seconds(60))
            let fanned = try await db.queue.fanOut(newerClaim, workerID: "w")
            #expect(fanned.map(\.state) == ["fanned_out"])
            // The child's key is the parent's and the token's: latest wins per device.
            let key = try await db.client.query(
                "SELECT coalesce_key FROM push.jobs WHERE parent_id = \(unescaped: String(newer))"
            ).decode(String.self).collect()
            #expect(key.count == 1 && key[0].hasPrefix("score:4@") && key[0].count == "score:4@".count + 16)
        }
    }

    @Test("jobs cancel --coalesce-key reaches the children of recipients' jobs of the key")
    func cancelChildrenByKey() async throws {
        try await TestPostgres.withDatabase { db in
            for token in Self.tokens.prefix(2) {
                try await DevicesTests.upsert(db, recipient: "user:6", token: token)
            }
            let parent = try await Self.parent(db, recipient: "user:6", key: "score:6")
            let claimed = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60))
            _ = try await db.queue.fanOut(claimed, workerID: "w")
            let result = try await db.queue.cancel(ids: [], coalesceKey: "score:6", topic: "com.example.app")
            #expect(result.cancelled.count == 2)
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.jobs WHERE parent_id = \(unescaped: String(parent)) AND state = 'cancelled'"
                ) == 2
            )
        }
    }

    @Test("jobs cancel of a parent cancels its children not yet sent")
    func cancelChildren() async throws {
        try await TestPostgres.withDatabase { db in
            for token in Self.tokens.prefix(2) {
                try await DevicesTests.upsert(db, recipient: "user:5", token: token)
            }
            let parent = try await Self.parent(db, recipient: "user:5")
            let claimed = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60))
            _ = try await db.queue.fanOut(claimed, workerID: "w")
            _ = try await db.queue.cancel(ids: [parent])
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.jobs WHERE parent_id = \(unescaped: String(parent)) AND state = 'cancelled'"
                )
                    == 2
            )
        }
    }

    @Test(
        "constraints: a job names exactly one of device_token, channel_id and recipient; a producer cannot set parent_id"
    )
    func constraints() async throws {
        try await TestPostgres.withDatabase { db in
            await #expect(throws: (any Error).self) {
                try await db.execute(
                    "INSERT INTO push.jobs (topic, recipient, device_token, payload) VALUES ('com.example.app', 'user:1', '\(Self.tokens[0])', '{}')"
                )
            }
            await #expect(throws: (any Error).self) {
                try await db.execute(
                    "INSERT INTO push.jobs (topic, recipient, payload) VALUES ('com.example.app', E'user\\n1', '{}')"
                )
            }
            let id: Int64
            do {
                id = try await db.int64(
                    "INSERT INTO push.jobs (topic, device_token, payload, parent_id) VALUES ('com.example.app', '\(unescaped: Self.tokens[0])', '{}', 42) RETURNING id"
                )
            } catch {
                Issue.record("\(String(reflecting: error))")
                return
            }
            let kept = try await db.int64s(
                "SELECT parent_id FROM push.jobs WHERE id = \(unescaped: String(id)) AND parent_id IS NOT NULL"
            )
            #expect(kept.isEmpty)
        }
    }

    @Test(
        "a token rotated by an upsert held open in a producer transaction: the fan-out does not wait for it (pg_stat_activity) and goes by what is committed; once committed, the next fan-out goes to the new token's recipient"
    )
    func rotationInFlight() async throws {
        try await TestPostgres.withDatabase { db in
            let (old, moved) = (Self.tokens[0], Self.tokens[1])
            try await DevicesTests.upsert(db, recipient: "user:7", token: old)
            try await DevicesTests.upsert(db, recipient: "user:7", token: moved)
            _ = try await Self.parent(db, recipient: "user:7")
            let claimed = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60))
            // The app reinstalled under another account: its token moves to user:8, in a transaction left open.
            let producer = try await FleetInterleavingTests.session(db)
            defer { Task { try? await producer.close() } }
            try await producer.query("BEGIN", logger: db.logger)
            try await producer.query(
                """
                INSERT INTO push.devices (recipient, topic, token) VALUES ('user:8', 'com.example.app', \(moved))
                ON CONFLICT (platform, topic, token) DO UPDATE SET recipient = excluded.recipient
                """,
                logger: db.logger
            )
            let release: @Sendable () async throws -> Void = {
                _ = try await producer.query("COMMIT", logger: db.logger)
            }
            let fanned = try await FleetInterleavingTests.watch(db, release: release) {
                try await db.queue.fanOut(claimed, workerID: "w")
            }
            #expect(!fanned.waited, "the fan-out waited for the producer's upsert")
            #expect(fanned.value.first?.children.count == 2, "what was committed: both tokens user:7's")
            try await release()
            // After the commit, user:7 has one device and user:8 the moved one.
            _ = try await Self.parent(db, recipient: "user:7")
            _ = try await Self.parent(db, recipient: "user:8")
            let next = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60))
            let results = try await db.queue.fanOut(next.filter { $0.recipient != nil }, workerID: "w")
            #expect(results.map(\.children.count) == [1, 1])
            let targets = try await db.client.query(
                """
                SELECT p.recipient, c.device_token FROM push.jobs AS c JOIN push.jobs AS p ON p.id = c.parent_id
                 WHERE p.id > (SELECT min(id) FROM push.jobs WHERE recipient IS NOT NULL) ORDER BY 1
                """
            ).decode((String, String).self).collect()
            #expect(targets.map(\.0) == ["user:7", "user:8"] && targets.map(\.1) == [old, moved], "\(targets)")
        }
    }

    @Test(
        "children claimed at once: up to the limit, running for the worker as attempt 1 and read as a claim reads them; a keyed parent's, a paused or limited topic's stay pending"
    )
    func claimedAtOnce() async throws {
        try await TestPostgres.withDatabase { db in
            for (index, token) in Self.tokens.enumerated() {
                try await DevicesTests.upsert(db, recipient: "user:\(index % 2)", token: token)
            }
            let first = try await Self.parent(db, recipient: "user:0")
            let second = try await Self.parent(db, recipient: "user:1")
            var claimed = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(claimed.map(\.id) == [first, second])
            // Room for three of the four children.
            let batch = try await db.queue.fanOut(claimed, workerID: "w", claimingUpTo: 3, lease: .seconds(60))
            #expect(batch.parents.map(\.state) == ["fanned_out", "fanned_out"])
            #expect(batch.claimed.count == 3 && batch.claimed.allSatisfy { $0.attempts == 1 && $0.recipient == nil })
            #expect(Set(batch.claimed.map(\.id)).isSubset(of: Set(batch.parents.flatMap(\.children))))
            let rows = try await db.client.query(
                "SELECT state, attempts, locked_by, locked_until > now() FROM push.jobs WHERE parent_id IS NOT NULL ORDER BY id"
            ).decode((String, Int16, String?, Bool?).self).collect()
            #expect(rows.filter { $0.0 == "running" }.allSatisfy { $0.1 == 1 && $0.2 == "w" && $0.3 == true })
            #expect(rows.map(\.0).sorted() == ["pending", "running", "running", "running"])
            #expect(rows.filter { $0.0 == "pending" }.allSatisfy { $0.1 == 0 && $0.2 == nil })
            // The claim never returns a held child; the pending one is claimed as any job.
            let rest = try await db.queue.claim(limit: 10, workerID: "v", lease: .seconds(60))
            #expect(rest.count == 1 && !batch.claimed.map(\.id).contains(rest[0].id))

            // Nothing claimed at once for a keyed parent, nor under a pause or a rate limit of the topic.
            try await db.execute(
                "INSERT INTO push.rate_limits (topic, per_second, burst) VALUES ('com.example.app', 100, 10)"
            )
            _ = try await Self.parent(db, recipient: "user:0")
            claimed = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60))
            let limited = try await db.queue.fanOut(claimed, workerID: "w", claimingUpTo: 100, lease: .seconds(60))
            #expect(limited.claimed.isEmpty && limited.parents.first?.children.count == 2)
            try await db.execute("DELETE FROM push.rate_limits")
            try await db.execute("INSERT INTO push.pauses (credential, reason) VALUES ('default', 'maintenance')")
            _ = try await Self.parent(db, recipient: "user:1")
            try await db.execute("DELETE FROM push.pauses")
            claimed = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60))
            try await db.execute("INSERT INTO push.pauses (credential, reason) VALUES ('default', 'maintenance')")
            let paused = try await db.queue.fanOut(claimed, workerID: "w", claimingUpTo: 100, lease: .seconds(60))
            #expect(paused.claimed.isEmpty && paused.parents.first?.children.count == 2, "paused after the claim")
            try await db.execute("DELETE FROM push.pauses")
            _ = try await Self.parent(db, recipient: "user:0", key: "score")
            claimed = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60)).filter {
                $0.recipient != nil
            }
            let keyed = try await db.queue.fanOut(claimed, workerID: "w", claimingUpTo: 100, lease: .seconds(60))
            #expect(keyed.claimed.isEmpty && keyed.parents.first?.children.count == 2)
            // Nor a child of an environment the worker avoids now (APNs production down), as its claim would.
            _ = try await Self.parent(db, recipient: "user:1")
            claimed = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60)).filter {
                $0.recipient != nil
            }
            let avoided = try await db.queue.fanOut(
                claimed,
                workerID: "w",
                claimingUpTo: 100,
                lease: .seconds(60),
                excluding: ClaimExclusions(environments: ["production"])
            )
            #expect(avoided.claimed.isEmpty && avoided.parents.first?.children.count == 2)
        }
    }
}
