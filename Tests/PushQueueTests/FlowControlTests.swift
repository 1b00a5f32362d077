import Foundation
import PostgresNIO
import PushCore
import PushQueue
import PushQueueTesting
import Testing

/// The fleet-wide controls, in the claim statement: coalescing, dead-token suppression, pauses and rate
/// limits, against a real Postgres.
@Suite("Flow control in the claim")
struct FlowControlTests {
    static func insert(_ db: TestDatabase, _ values: String) async throws -> [Int64] {
        try await db.int64s(
            """
            INSERT INTO push.jobs (topic, device_token, payload, coalesce_key, credential)
            VALUES \(unescaped: values) RETURNING id
            """
        )
    }

    /// One VALUES row for ``insert(_:_:)``: an alert of token `n` with `key` as its coalesce_key.
    static func keyedRow(_ n: Int, _ key: String) -> String {
        "('com.example.app', lpad(to_hex(\(n)), 64, '0'), '{\"aps\":{}}', '\(key)', 'default')"
    }

    @Test("latest wins: of each key's due jobs only the newest is claimed; the older end superseded by it")
    func coalescing() async throws {
        try await TestPostgres.withDatabase { db in
            var values: [String] = []
            for n in 1...10 {
                let key = n <= 5 ? "'a'" : n <= 8 ? "'b'" : "NULL"
                values.append("('com.example.app', lpad(to_hex(\(n)), 64, '0'), '{\"aps\":{}}', \(key), 'default')")
            }
            let ids = try await Self.insert(db, values.joined(separator: ","))
            let batch = try await db.queue.claimBatch(limit: 100, workerID: "w", lease: .seconds(60))
            #expect(Set(batch.jobs.map(\.id)) == [ids[4], ids[7], ids[8], ids[9]])
            #expect(batch.superseded == 6)
            let superseded = try await db.client.query(
                "SELECT id, superseded_by FROM push.jobs WHERE state = 'superseded' ORDER BY id"
            ).decode((Int64, Int64).self).collect()
            #expect(superseded.map(\.0) == Array(ids[0..<4]) + Array(ids[5..<7]))
            #expect(superseded.allSatisfy { $0.1 == ($0.0 < ids[5] ? ids[4] : ids[7]) })
            // A job already running is never touched: a newer one with its key is claimed next to it.
            let newer = try await Self.insert(
                db,
                "('com.example.app', lpad(to_hex(99), 64, '0'), '{\"aps\":{}}', 'a', 'default')"
            )
            let next = try await db.queue.claimBatch(limit: 100, workerID: "w", lease: .seconds(60))
            #expect(next.jobs.map(\.id) == newer && next.superseded == 0)
            #expect(
                try await db.int64("SELECT count(*) FROM push.jobs WHERE id = \(ids[4]) AND state = 'running'") == 1
            )
        }
    }

    @Test(
        "a superseded job whose superseder died unsent is revived above the mark; one with a newer job pending or delivered is refused"
    )
    func reviveSuperseded() async throws {
        try await TestPostgres.withDatabase { db in
            // Key a: the older job is superseded by the newer one's claim; the newer one dies unsent.
            let row = Self.keyedRow
            let a = try await Self.insert(db, [row(1, "a"), row(2, "a")].joined(separator: ","))
            // Key b: the same, and then a third job of the key is delivered.
            let b = try await Self.insert(db, [row(3, "b"), row(4, "b")].joined(separator: ","))
            let first = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(Set(first.jobs.map(\.id)) == [a[1], b[1]] && first.superseded == 2)
            _ = try await db.queue.writeOutcomes(
                first.jobs.map {
                    JobOutcome(
                        jobID: $0.id,
                        attempt: 1,
                        disposition: .dead(sentence: "too big"),
                        attemptedAt: .now,
                        status: nil,
                        reason: "PayloadTooLarge"
                    )
                },
                workerID: "w"
            )
            let b3 = try await Self.insert(db, row(5, "b"))
            let third = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(third.jobs.map(\.id) == b3)
            // While b's newest is running, and after it is delivered: refused.
            let whileRunning = try await db.queue.operations.reviveSuperseded(ids: [b[0]], dryRun: false)
            #expect(whileRunning.revived.isEmpty && whileRunning.refused.map(\.id) == [b[0]])
            #expect(whileRunning.refused.first?.why.contains("is running") == true)
            _ = try await db.queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: b3[0],
                        attempt: 1,
                        disposition: .delivered,
                        attemptedAt: .now,
                        status: 200,
                        reason: nil
                    )
                ],
                workerID: "w"
            )
            // A dry run changes nothing; then a is revived under a new id above the mark, b is refused, a job that
            // is not superseded and one that does not exist are named.
            let dry = try await db.queue.operations.reviveSuperseded(ids: [a[0]], dryRun: true)
            #expect(dry.revived.map(\.id) == [a[0]] && dry.revived.first?.newID == nil)
            #expect(
                try await db.int64("SELECT count(*) FROM push.jobs WHERE id = \(a[0]) AND state = 'superseded'") == 1
            )
            let result = try await db.queue.operations.reviveSuperseded(
                ids: [a[0], b[0], b3[0], 999_999],
                dryRun: false
            )
            let revived = try #require(result.revived.first)
            #expect(result.revived.count == 1 && revived.id == a[0] && revived.deadSuperseder == a[1])
            let newID = try #require(revived.newID)
            #expect(newID > b3[0])
            #expect(result.refused.map(\.id) == [b[0], b3[0], 999_999])
            #expect(result.refused[0].why.contains("is delivered"))
            #expect(result.refused[1].why.contains("not superseded"))
            // The revived job keeps its apns_id and history, is claimed and sent; nothing else of the keys is.
            let next = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(next.jobs.map(\.id) == [newID])
            #expect(next.jobs.first?.apnsID == revived.apnsID)
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.jobs WHERE id = \(unescaped: String(newID)) AND history @> '[{\"outcome\": \"revived\", \"previous_id\": \(unescaped: String(a[0]))}]'"
                ) == 1
            )
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE id = \(a[0])") == 0)
        }
    }

    @Test(
        "revive, then dead replay of the newer job: the replayed job goes out under a new id above the revived one and supersedes it; a replay with a truly newer job of its key keeps its id and is superseded"
    )
    func replayAfterRevive() async throws {
        try await TestPostgres.withDatabase { db in
            let row = Self.keyedRow
            // Key a: a1 superseded by a2, a2 dies unsent, a1 revived (new id above a2). Key c: the same, and then
            // a truly newer c3 is delivered.
            let a = try await Self.insert(db, [row(1, "a"), row(2, "a")].joined(separator: ","))
            let first = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(first.jobs.map(\.id) == [a[1]])
            let c = try await Self.insert(db, [row(3, "c"), row(4, "c")].joined(separator: ","))
            let second = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(second.jobs.map(\.id) == [c[1]])
            _ = try await db.queue.writeOutcomes(
                (first.jobs + second.jobs).map {
                    JobOutcome(
                        jobID: $0.id,
                        attempt: 1,
                        disposition: .dead(sentence: "x"),
                        attemptedAt: .now,
                        status: nil,
                        reason: "X"
                    )
                },
                workerID: "w"
            )
            let revived = try await db.queue.operations.reviveSuperseded(ids: [a[0]], dryRun: false)
            let a1 = try #require(revived.revived.first?.newID)
            let c3 = try await Self.insert(db, row(5, "c"))
            let third = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(Set(third.jobs.map(\.id)) == [a1, c3[0]])
            _ = try await db.queue.writeOutcomes(
                third.jobs.map {
                    JobOutcome(jobID: $0.id, attempt: 1, disposition: .delivered, attemptedAt: .now, status: 200)
                },
                workerID: "w"
            )
            // The revived a1 (the older state) was delivered; a2 (the newer) is replayed: it must go out after it.
            let a2APNsID = try #require(first.jobs.first?.apnsID)
            let dry = try await db.queue.operations.replay(matching: .init(ids: [a[1], c[1]]), dryRun: true)
            #expect(dry.moved.map(\.renumbered) == [true, false])
            let replayed = try await db.queue.operations.replay(matching: .init(ids: [a[1], c[1]]))
            #expect(replayed.moved.map(\.id) == [a[1], c[1]])
            let a2 = try #require(replayed.moved.first?.queuedAs)
            #expect(a2 > c3[0] && replayed.moved.first?.apnsID == a2APNsID)
            #expect(replayed.moved.last?.queuedAs == c[1])
            let next = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(next.jobs.map(\.id) == [a2] && next.jobs.first?.apnsID == a2APNsID)
            #expect(
                try await db.int64("SELECT count(*) FROM push.jobs WHERE id = \(c[1]) AND state = 'superseded'") == 1
            )
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.jobs WHERE id = \(unescaped: String(a2)) AND history @> '[{\"outcome\": \"replayed\", \"previous_id\": \(unescaped: String(a[1]))}]'"
                ) == 1
            )
            _ = try await db.queue.writeOutcomes(
                next.jobs.map {
                    JobOutcome(jobID: $0.id, attempt: 1, disposition: .delivered, attemptedAt: .now, status: 200)
                },
                workerID: "w"
            )
            // Key b: b2 dies, b1 is revived and delivered, then a newer b3 dies too; both dead letters replayed in
            // one batch: b3, the newest state, must go out last (b2 renumbered, so b3 is too, above it).
            let b = try await Self.insert(db, [row(6, "b"), row(7, "b")].joined(separator: ","))
            let b2Claim = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(b2Claim.jobs.map(\.id) == [b[1]])
            _ = try await db.queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: b[1],
                        attempt: 1,
                        disposition: .dead(sentence: "x"),
                        attemptedAt: .now,
                        status: nil,
                        reason: "X"
                    )
                ],
                workerID: "w"
            )
            let b1 = try #require(
                try await db.queue.operations.reviveSuperseded(ids: [b[0]], dryRun: false).revived.first?.newID
            )
            let b1Claim = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(b1Claim.jobs.map(\.id) == [b1])
            _ = try await db.queue.writeOutcomes(
                [JobOutcome(jobID: b1, attempt: 1, disposition: .delivered, attemptedAt: .now, status: 200)],
                workerID: "w"
            )
            let b3 = try await Self.insert(db, row(8, "b"))
            let b3Claim = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(b3Claim.jobs.map(\.id) == b3)
            let b3APNsID = try #require(b3Claim.jobs.first?.apnsID)
            _ = try await db.queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: b3[0],
                        attempt: 1,
                        disposition: .dead(sentence: "x"),
                        attemptedAt: .now,
                        status: nil,
                        reason: "X"
                    )
                ],
                workerID: "w"
            )
            let both = try await db.queue.operations.replay(matching: .init(ids: [b[1], b3[0]]))
            #expect(both.moved.map(\.renumbered) == [true, true], "\(both.moved)")
            let last = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(last.jobs.map(\.apnsID) == [b3APNsID], "the newest state, b3, goes out; b2's copy is superseded")
        }
    }

    @Test(
        "cancel: a waiting job ends cancelled and is never claimed; a held one keeps an in-flight outcome, loses an unsent one; by key"
    )
    func cancel() async throws {
        try await TestPostgres.withDatabase { db in
            let row = Self.keyedRow
            let ids = try await Self.insert(db, (1...4).map { row($0, "k\($0)") }.joined(separator: ","))
            let held = try await db.queue.claimBatch(limit: 2, workerID: "w", lease: .seconds(60))
            let heldIDs = held.jobs.map(\.id).sorted()
            #expect(heldIDs == [ids[0], ids[1]])
            let keyed = try await Self.insert(db, [row(5, "order-9"), row(6, "order-9")].joined(separator: ","))
            let result = try await db.queue.cancel(ids: [ids[0], ids[1], ids[2], 999_999])
            #expect(result.cancelled == [ids[2]] && result.heldByWorkers == heldIDs && result.missing == [999_999])
            // The held jobs: one's request was in flight (its 200 is recorded), the other's was withdrawn unsent
            // (fenced: it stays cancelled).
            let written = try await db.queue.writeOutcomes(
                [
                    JobOutcome(jobID: ids[0], attempt: 1, disposition: .delivered, attemptedAt: .now, status: 200),
                    JobOutcome(
                        jobID: ids[1],
                        attempt: 1,
                        disposition: .requeue(after: .zero),
                        attemptedAt: .now,
                        sent: false
                    ),
                ],
                workerID: "w"
            )
            #expect(written.recorded == [ids[0]] && written.fenced == [ids[1]])
            let states = try await db.client.query(
                "SELECT id, state FROM push.jobs WHERE id = ANY ('{\(unescaped: ids.map(String.init).joined(separator: ","))}') ORDER BY id"
            ).decode((Int64, String).self).collect()
            #expect(states.map(\.1) == ["delivered", "cancelled", "cancelled", "pending"])
            // By key: both queued jobs of the key; then nothing of it is claimable, the other job is.
            let byKey = try await db.queue.cancel(ids: [], coalesceKey: "order-9", topic: "com.example.app")
            #expect(byKey.cancelled == keyed.sorted())
            let next = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(next.jobs.map(\.id) == [ids[3]])
            // Cancelling again names the ended ones.
            let again = try await db.queue.cancel(ids: [ids[0], ids[2]])
            #expect(again.ended == [String(ids[0]): "delivered", String(ids[2]): "cancelled"])
        }
    }

    @Test("two claimers racing over 50 keys × 20 jobs claim exactly one job per key")
    func coalescingRace() async throws {
        try await TestPostgres.withDatabase(maxConnections: 6) { db in
            try await db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, coalesce_key)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{}}', 'key-' || (g % 50)
                  FROM generate_series(1, 1000) g
                """
            )
            let queue = db.queue
            let claimed = try await withThrowingTaskGroup(of: [PushJob].self) { group in
                for claimer in 0..<2 {
                    group.addTask {
                        var mine: [PushJob] = []
                        while true {
                            let jobs = try await queue.claim(limit: 7, workerID: "c\(claimer)", lease: .seconds(60))
                            if jobs.isEmpty { return mine }
                            mine += jobs
                        }
                    }
                }
                var all: [PushJob] = []
                for try await jobs in group { all += jobs }
                return all
            }
            #expect(claimed.count == 50, "one per key, not \(claimed.count)")
            #expect(Set(claimed.compactMap(\.coalesceKey)).count == 50)
            let newest = try await db.int64s("SELECT max(id) FROM push.jobs GROUP BY coalesce_key ORDER BY 1")
            #expect(claimed.map(\.id).sorted() == newest, "the newest of each key")
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'superseded'") == 950)
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'pending'") == 0)
        }
    }

    @Test("a token invalidated after the job was enqueued is flagged; one invalidated before is not")
    func deadTokens() async throws {
        try await TestPostgres.withDatabase { db in
            let (late, early) = (String(repeating: "1", count: 64), String(repeating: "2", count: 64))
            try await db.execute(
                """
                INSERT INTO push.invalid_tokens (device_token, topic, environment, reason, invalidated_at, job_id)
                VALUES ('\(early)', 'com.example.app', 'production', 'Unregistered', now() - interval '1 hour', 0)
                """
            )
            let ids = try await Self.insert(
                db,
                "('com.example.app', '\(late)', '{\"aps\":{}}', NULL, 'default'), ('com.example.app', '\(early)', '{\"aps\":{}}', NULL, 'default')"
            )
            try await db.execute(
                """
                INSERT INTO push.invalid_tokens (device_token, topic, environment, reason, invalidated_at, job_id)
                VALUES ('\(late)', 'com.example.app', 'production', 'Unregistered', now() + interval '1 second', 0)
                """
            )
            let jobs = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(jobs.first { $0.id == ids[0] }?.tokenInvalidatedAt != nil)
            #expect(jobs.first { $0.id == ids[1] }?.tokenInvalidatedAt == nil)
            // PushCore's rule: never sent, MS020, a sentence.
            let flagged = try #require(jobs.first { $0.id == ids[0] })
            #expect {
                try RequestBuilder.describe(flagged, now: Date())
            } throws: { error in
                guard let rejection = error as? PreSendRejection else { return false }
                return rejection.reason == "TokenInvalidated" && rejection.trapID == .tokenUnregistered
                    && rejection.message.contains("after the job was enqueued")
            }
        }
    }

    @Test("pauses by topic and by credential hold jobs unclaimed with no attempt; resume releases them")
    func pauses() async throws {
        try await TestPostgres.withDatabase { db in
            _ = try await Self.insert(
                db,
                """
                ('com.example.app', lpad('1', 64, '0'), '{"aps":{}}', NULL, 'default'),
                ('com.example.other', lpad('2', 64, '0'), '{"aps":{}}', NULL, 'default'),
                ('com.example.app', lpad('3', 64, '0'), '{"aps":{}}', NULL, 'brand-b')
                """
            )
            try await db.queue.operations.pause(
                credential: nil,
                topic: "com.example.app",
                reason: "bad copy in the campaign"
            )
            try await db.queue.operations.pause(credential: "brand-b", topic: nil, reason: "key rotation")
            let pauses = try await db.queue.pauses(countingJobs: true)
            #expect(pauses.map(\.scope) == ["credential=* topic=com.example.app", "credential=brand-b topic=*"])
            #expect(pauses.map(\.pendingJobs) == [2, 1])
            let first = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(first.map(\.topic) == ["com.example.other"])
            #expect(try await db.int64("SELECT sum(attempts) FROM push.jobs WHERE state = 'pending'") == 0)
            // The same scope again replaces the reason; resuming a scope that is not paused says so.
            try await db.queue.operations.pause(credential: nil, topic: "com.example.app", reason: "still bad")
            #expect(try await db.queue.pauses().count == 2)
            #expect(try await db.queue.operations.resume(credential: "default", topic: "com.example.app") == false)
            #expect(try await db.queue.operations.resume(credential: nil, topic: "com.example.app"))
            let second = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(second.map(\.credential) == ["default"])
            #expect(try await db.queue.operations.resume(credential: "brand-b", topic: nil))
            #expect(try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60)).count == 1)
        }
    }

    @Test(
        "a rate limit's schedule: burst claimed ahead, send times one interval apart, then its rate; others unaffected"
    )
    func rateLimits() async throws {
        try await TestPostgres.withDatabase { db in
            try await db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT CASE WHEN g <= 40 THEN 'com.example.limited' ELSE 'com.example.free' END,
                       lpad(to_hex(g), 64, '0'), '{"aps":{}}'
                  FROM generate_series(1, 60) g
                """
            )
            try await db.queue.operations.setRateLimit(
                credential: nil,
                topic: "com.example.limited",
                perSecond: 10,
                burst: 5
            )
            let started = ContinuousClock.now
            let first = try await db.queue.claimBatch(limit: 100, workerID: "w", lease: .seconds(60))
            #expect(first.jobs.filter { $0.topic == "com.example.limited" }.count == 5)
            #expect(first.jobs.filter { $0.topic == "com.example.free" }.count == 20)
            // The limit's schedule: send times one interval (100 ms) apart; unlimited jobs have none.
            let sendTimes = first.jobs.compactMap(\.sendAt).sorted()
            #expect(sendTimes.count == 5)
            for (a, b) in zip(sendTimes, sendTimes.dropFirst()) { #expect(abs(b.timeIntervalSince(a) - 0.1) < 0.001) }
            let refill = try #require(first.rateLimitedFor)
            #expect(refill > .zero && refill <= .milliseconds(101))
            let second = try await db.queue.claimBatch(limit: 100, workerID: "w", lease: .seconds(60))
            // Right after the burst the bucket holds only what refilled since (10 per second).
            let elapsed = (ContinuousClock.now - started) / .milliseconds(1)
            #expect(Double(second.jobs.count) <= (elapsed / 100).rounded(.up), "\(second.jobs.count) in \(elapsed) ms")
            try await Task.sleep(for: .milliseconds(550))
            let third = try await db.queue.claimBatch(limit: 100, workerID: "w", lease: .seconds(60))
            #expect((4...6).contains(third.jobs.count), "about 10/s over half a second, capped by the burst of 5")
            let limits = try await db.queue.operations.rateLimits()
            #expect(limits.count == 1 && limits[0].perSecond == 10 && limits[0].burst == 5)
            #expect(try await db.queue.operations.clearRateLimit(credential: nil, topic: "com.example.limited"))
            let rest = try await db.queue.claimBatch(limit: 100, workerID: "w", lease: .seconds(60))
            #expect(rest.jobs.count == 40 - 5 - second.jobs.count - third.jobs.count && rest.rateLimitedFor == nil)
        }
    }
}
