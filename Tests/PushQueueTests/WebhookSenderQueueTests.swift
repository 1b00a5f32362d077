import Foundation
import PostgresNIO
import PushCore
import PushQueueTesting
import Testing

@testable import PushQueue

/// The sender's statements against real Postgres: the claim by hook (a slow receiver holds only its own
/// share), the fences on a try, the 24 hours, 410, replay; and the interleavings with a neighbour holding
/// a delivery's or a hook's row, watched in `pg_stat_activity`.
@Suite("Webhooks: the sender's claim, record and replay")
struct WebhookSenderQueueTests {
    /// The sender's claim as `worker`, with a minute's lease.
    static func claim(_ db: TestDatabase, _ worker: String, perHook: Int, limit: Int) async throws -> [WebhookDelivery]
    {
        try await db.queue.claimWebhookDeliveries(workerID: worker, perHook: perHook, limit: limit, lease: .seconds(60))
    }

    static func hooks(_ db: TestDatabase, _ count: Int) async throws -> [Int64] {
        var ids: [Int64] = []
        for n in 0..<count {
            ids.append(
                try await db.queue.operations.addWebhook(
                    url: "https://hooks.example.com/\(n)",
                    events: ["delivered"],
                    topic: nil,
                    secretFile: "/etc/push-worker/\(n).secret"
                ).id
            )
        }
        return ids
    }

    static func deliveries(_ db: TestDatabase, hook: Int64, count: Int) async throws {
        try await db.execute(
            """
            INSERT INTO push.webhook_deliveries (webhook_id, event, job_id, body)
            SELECT \(hook), 'delivered', g, jsonb_build_object('job_id', g) FROM generate_series(1, \(count)) AS g
            """
        )
    }

    @Test(
        "the claim takes at most the per-hook share across the fleet (a second worker gets only what is left), a lapsed lease is due again, and a try is recorded only by the holder of that attempt"
    )
    func claimAndFences() async throws {
        try await TestPostgres.withDatabase { db in
            let hooks = try await Self.hooks(db, 2)
            try await Self.deliveries(db, hook: hooks[0], count: 10)
            try await Self.deliveries(db, hook: hooks[1], count: 10)
            let claimed = try await Self.claim(db, "a", perHook: 3, limit: 100)
            #expect(claimed.count == 6, "three per hook")
            let second = try await Self.claim(db, "b", perHook: 3, limit: 100)
            #expect(second.isEmpty, "the share is fleet-wide: worker a holds it all")
            // Hook 0's three, by id.
            let first = claimed.filter { $0.webhookID == hooks[0] }.sorted { $0.id < $1.id }
            let other = try #require(claimed.first { $0.webhookID == hooks[1] })
            // a's tries: one delivered, one retried in 0 s, one gone stale (its lease lapses).
            let result = try await db.queue.recordWebhookTries(
                [
                    WebhookTry(id: first[0].id, attempt: 1, kind: .delivered, status: 204, error: nil),
                    WebhookTry(id: first[1].id, attempt: 1, kind: .retry, status: 500, error: "500", retryAfter: .zero),
                    // A try of an attempt a does not hold (2) is fenced out.
                    WebhookTry(id: first[2].id, attempt: 2, kind: .delivered, status: 204, error: nil),
                ],
                workerID: "a"
            )
            #expect(result.delivered == 1 && result.retried == 1 && result.dead == 0)
            #expect(
                try await db.queue.recordWebhookTries(
                    [WebhookTry(id: other.id, attempt: 1, kind: .delivered, status: 204, error: nil)],
                    workerID: "b"
                ).delivered == 0,
                "another worker's try of a's delivery is fenced out"
            )
            try await db.execute(
                "UPDATE push.webhook_deliveries SET locked_until = now() - interval '1 second' WHERE id = \(first[2].id)"
            )
            let again = try await Self.claim(db, "b", perHook: 10, limit: 100)
            #expect(again.contains { $0.id == first[2].id && $0.attempt == 2 }, "the lapsed delivery is b's, attempt 2")
            #expect(again.contains { $0.id == first[1].id && $0.attempt == 2 }, "the retried delivery is due")
            #expect(again.filter { $0.webhookID == hooks[0] }.count == 9, "hook 0: all but the delivered one")
            #expect(again.filter { $0.webhookID == hooks[1] }.count == 7, "hook 1: the share less a's three")
            #expect(
                try await db.queue.recordWebhookTries(
                    [WebhookTry(id: first[2].id, attempt: 1, kind: .delivered, status: 204, error: nil)],
                    workerID: "a"
                ).delivered == 0,
                "a's late answer for the attempt it lost records nothing"
            )
            // A worker restarted under the same id takes back what its earlier life held.
            #expect(try await db.queue.reclaimWebhookDeliveries(ofPreviousLife: "a") == 3)
            #expect(try await db.queue.reclaimWebhookDeliveries(ofPreviousLife: "b") == 16)
        }
    }

    @Test("a retry past 24 hours is dead with a sentence; 410 disables the hook; replay by id and by hook")
    func windowGoneReplay() async throws {
        try await TestPostgres.withDatabase { db in
            let hooks = try await Self.hooks(db, 2)
            try await Self.deliveries(db, hook: hooks[0], count: 2)
            try await Self.deliveries(db, hook: hooks[1], count: 3)
            try await db.execute(
                "UPDATE push.webhook_deliveries SET created_at = now() - interval '23 hours 59 minutes'"
            )
            let claimed = try await Self.claim(db, "a", perHook: 1, limit: 10)
            #expect(claimed.count == 2)
            #expect(claimed.allSatisfy { $0.age > .seconds(23 * 3_600) }, "the age by the database's clock")
            let first = try #require(claimed.first { $0.webhookID == hooks[0] })
            let second = try #require(claimed.first { $0.webhookID == hooks[1] })
            let result = try await db.queue.recordWebhookTries(
                [
                    WebhookTry(
                        id: first.id,
                        attempt: 1,
                        kind: .retry,
                        status: nil,
                        error: "connection refused",
                        retryAfter: .seconds(120)
                    ),
                    WebhookTry(id: second.id, attempt: 1, kind: .gone, status: 410, error: "gone"),
                ],
                workerID: "a"
            )
            #expect(result.dead == 1 && result.gone == 1 && result.disabledHooks == [hooks[1]])
            // The outbox gauge: a due delivery of an enabled hook, waited 90 s; the disabled hook's do not count.
            try await db.queue.heartbeat(workerID: "a", host: "h", pid: 1, credentials: ["default"])
            try await db.execute(
                "UPDATE push.webhook_deliveries SET run_at = now() - interval '90 seconds' WHERE state = 'pending'"
            )
            let gauges = try #require(try await db.queue.gauges(workerID: "a", staleAfter: .seconds(60)))
            #expect(gauges.webhookOldestDueAgeSeconds >= 89 && gauges.webhookOldestDueAgeSeconds < 200)
            try await db.execute(
                "UPDATE push.webhook_deliveries SET run_at = now() - interval '1 day' WHERE webhook_id = \(hooks[1])"
            )
            let disabledIgnored = try #require(try await db.queue.gauges(workerID: "a", staleAfter: .seconds(60)))
            #expect(disabledIgnored.webhookOldestDueAgeSeconds < 200, "a disabled hook's backlog is not stuck")
            let hooksListed = try await db.queue.operations.webhooks()
            #expect(hooksListed[1].disabledReason?.contains("410 Gone") == true)
            #expect(hooksListed[0].dead == 1 && hooksListed[1].dead == 1 && hooksListed[1].waiting == 2)
            let failing = try await db.queue.operations.failingWebhookDeliveries(hook: hooks[0], limit: 10)
            #expect(failing.first?.lastError == "gave up after 24 hours: connection refused")
            // The disabled hook's other deliveries are not claimed.
            let more = try await Self.claim(db, "a", perHook: 5, limit: 10)
            #expect(more.allSatisfy { $0.webhookID == hooks[0] } && more.count == 1)
            let byID = try await db.queue.operations.replayWebhookDeliveries(
                ids: [first.id, second.id, 999],
                hook: nil
            )
            #expect(
                byID.replayed == [first.id, second.id].sorted() && byID.notDead == [999] && byID.enabledHook == nil
            )
            #expect(byID.disabledHooks == [hooks[1]], "a replayed delivery of a disabled hook is said to wait")
            let waiting = try await Self.claim(db, "a", perHook: 5, limit: 10)
            #expect(!waiting.contains { $0.id == second.id }, "not sent while its hook is disabled")
            let firstAgain = try #require(waiting.first { $0.id == first.id })
            #expect(firstAgain.attempt == 2 && firstAgain.age < .seconds(60), "a replay starts the age again")
            #expect(
                WebhookPolicy.retryWait(attempt: 30, age: firstAgain.age, retryAfter: nil, jitter: 0)
                    <= WebhookPolicy.retryWait(attempt: 30, age: .seconds(60), retryAfter: nil, jitter: 0)
                    && WebhookPolicy.retryWait(attempt: 30, age: .seconds(60), retryAfter: nil, jitter: 0)
                        == .seconds(40),
                "so even after 30 tries its backoff starts again (40 s at a minute old, not an hour)"
            )
            // A row an operator broke by hand (created_at = -infinity) is claimed with the longest age, not an error.
            try await db.execute(
                "UPDATE push.webhook_deliveries SET created_at = '-infinity', state = 'pending', run_at = now() WHERE id = \(firstAgain.id)"
            )
            let broken = try await Self.claim(db, "b", perHook: 5, limit: 10)
            #expect(broken.first { $0.id == firstAgain.id }.map { $0.age >= .seconds(999_999_999) } == true)
            let byHook = try await db.queue.operations.replayWebhookDeliveries(ids: [], hook: hooks[1])
            #expect(byHook.replayed.isEmpty && byHook.enabledHook == hooks[1])
            let replayed = try await Self.claim(db, "a", perHook: 5, limit: 10)
            #expect(
                replayed.contains { $0.id == second.id && $0.attempt == 2 },
                "same id; the count of tries only grows (a stale try can never pass for a new one)"
            )
        }
    }

    @Test(
        "a neighbour holding a delivery's row (an operator's replay) stops neither the claim nor the record; one holding a hook's row (another worker's claim, an operator's edit) makes the claim skip that hook this round, and stops no outcome write: pg_stat_activity shows no wait"
    )
    func interleavings() async throws {
        try await TestPostgres.withDatabase { db in
            let hooks = try await Self.hooks(db, 1)
            try await Self.deliveries(db, hook: hooks[0], count: 6)
            let neighbour = try await FleetInterleavingTests.session(db)
            defer { Task { try? await neighbour.close() } }
            try await neighbour.query("BEGIN", logger: db.logger)
            try await neighbour.query(
                "SELECT id FROM push.webhook_deliveries ORDER BY id LIMIT 2 FOR UPDATE",
                logger: db.logger
            )
            let release: @Sendable () async throws -> Void = {
                _ = try await neighbour.query("COMMIT", logger: db.logger)
            }
            let claim = try await FleetInterleavingTests.watch(db, release: release) {
                try await Self.claim(db, "a", perHook: 10, limit: 10)
            }
            #expect(!claim.waited, "the claim skips the held deliveries")
            #expect(claim.value.count == 4)
            // Another claimer (or an operator's edit) holds the hook's row: this claim skips the hook.
            let claimer = try await FleetInterleavingTests.session(db)
            defer { Task { try? await claimer.close() } }
            try await claimer.query("BEGIN", logger: db.logger)
            try await claimer.query(
                "SELECT id FROM push.webhooks WHERE id = \(hooks[0]) FOR NO KEY UPDATE",
                logger: db.logger
            )
            let releaseClaimer: @Sendable () async throws -> Void = {
                _ = try await claimer.query("COMMIT", logger: db.logger)
            }
            try await neighbour.query("COMMIT", logger: db.logger)
            let skipped = try await FleetInterleavingTests.watch(db, release: releaseClaimer) {
                try await Self.claim(db, "b", perHook: 10, limit: 10)
            }
            #expect(!skipped.waited && skipped.value.isEmpty, "a hook another claim holds is skipped, not waited on")
            // An outcome write that matches the held hook inserts its delivery without waiting (KEY SHARE).
            let ids = try await enqueue(db, count: 1)
            let batch = try await db.queue.claimBatch(limit: 1, workerID: "w", lease: .seconds(60))
            #expect(batch.jobs.count == 1)
            let write = try await FleetInterleavingTests.watch(db, release: releaseClaimer) {
                try await db.queue.writeOutcomes(
                    [JobOutcome(jobID: ids[0], attempt: 1, disposition: .delivered, attemptedAt: .now, status: 200)],
                    workerID: "w"
                )
            }
            #expect(!write.waited && write.value.recorded == ids, "the outcome write does not wait on the claim")
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.webhook_deliveries WHERE job_id = \(ids[0]) AND body ? 'apns_id'"
                ) == 1
            )
            // Recording while the hook's row is held: no wait either.
            let tries = claim.value.map { WebhookTry(id: $0.id, attempt: 1, kind: .delivered, status: 200, error: nil) }
            let record = try await FleetInterleavingTests.watch(db, release: releaseClaimer) {
                try await db.queue.recordWebhookTries(tries, workerID: "a")
            }
            #expect(!record.waited, "recording does not wait on the hook's row")
            #expect(record.value.delivered == 4)
            try await releaseClaimer()
        }
    }
}

/// The trace columns through the queue: the first attempt's span is kept by the outcome write (a retry's
/// and a dead letter's), survives a replay (the worker's own insert), and a producer cannot set it.
@Suite("Traces: trace_first_span through outcomes, dead letters and replay")
struct TraceColumnTests {
    @Test(
        "the first sent attempt's span id is kept, then carried by the dead letter and its replay; a producer's value is reset"
    )
    func firstSpanKept() async throws {
        try await TestPostgres.withDatabase { db in
            let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            try await db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, traceparent, trace_first_span)
                VALUES ('com.example.app', repeat('ab', 32), '{"aps":{"alert":"a"}}', '\(traceparent)', 'ffffffffffffffff'),
                       ('com.example.app', repeat('cd', 32), '{"aps":{"alert":"b"}}', '\(traceparent)', NULL)
                """
            )
            #expect(
                try await db.int64("SELECT count(*) FROM push.jobs WHERE trace_first_span IS NOT NULL") == 0,
                "a producer cannot set the worker's column"
            )
            let first = try await db.queue.claimBatch(limit: 2, workerID: "w", lease: .seconds(60)).jobs
            #expect(first.count == 2 && first.allSatisfy { $0.traceparent == traceparent && $0.traceFirstSpan == nil })
            var retry = JobOutcome(
                jobID: first[0].id,
                attempt: 1,
                disposition: .retry(after: .zero),
                attemptedAt: .now,
                status: 500
            )
            retry.traceSpan = "1111111111111111"
            var dead = JobOutcome(
                jobID: first[1].id,
                attempt: 1,
                disposition: .dead(sentence: "gone"),
                attemptedAt: .now,
                status: 400
            )
            dead.traceSpan = "2222222222222222"
            _ = try await db.queue.writeOutcomes([retry, dead], workerID: "w")
            let again = try await db.queue.claimBatch(limit: 2, workerID: "w", lease: .seconds(60)).jobs
            #expect(again.first?.traceFirstSpan == "1111111111111111", "the retry reads its first attempt's span")
            var later = JobOutcome(
                jobID: first[0].id,
                attempt: 2,
                disposition: .delivered,
                attemptedAt: .now,
                status: 200
            )
            later.traceSpan = "3333333333333333"
            _ = try await db.queue.writeOutcomes([later], workerID: "w")
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.jobs WHERE id = \(first[0].id) AND trace_first_span = '1111111111111111'"
                ) == 1,
                "only the first is kept"
            )
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM push.dead_jobs WHERE id = \(first[1].id) AND trace_first_span = '2222222222222222' AND traceparent = \(traceparent)"
                ) == 1,
                "a job dead at its first attempt keeps that attempt's span"
            )
            _ = try await db.queue.operations.replay(matching: .init(ids: [first[1].id]))
            let replayed = try await db.queue.claimBatch(limit: 2, workerID: "w", lease: .seconds(60)).jobs
            #expect(
                replayed.first?.traceFirstSpan == "2222222222222222" && replayed.first?.traceparent == traceparent,
                "the replay stays in its trace, linked to the first attempt"
            )
        }
    }
}

extension WebhookSenderQueueTests {
    @Test(
        "a hook deleted under an outcome write: the write waits on the delete (pg_stat_activity), fails on the foreign key, is not taken for a poison row, and succeeds written again"
    )
    func hookDeletedUnderAnOutcomeWrite() async throws {
        try await TestPostgres.withDatabase { db in
            let hook = try await Self.hooks(db, 1)[0]
            let ids = try await enqueue(db, count: 1)
            #expect(try await db.queue.claimBatch(limit: 1, workerID: "w", lease: .seconds(60)).jobs.count == 1)
            let remover = try await FleetInterleavingTests.session(db)
            defer { Task { try? await remover.close() } }
            try await remover.query("BEGIN", logger: db.logger)
            try await remover.query("DELETE FROM push.webhooks WHERE id = \(hook)", logger: db.logger)
            let release: @Sendable () async throws -> Void = {
                _ = try await remover.query("COMMIT", logger: db.logger)
            }
            let outcome = JobOutcome(jobID: ids[0], attempt: 1, disposition: .delivered, attemptedAt: .now, status: 200)
            let write = try await FleetInterleavingTests.watch(db, release: release) {
                do {
                    _ = try await db.queue.writeOutcomes([outcome], workerID: "w")
                    return "written"
                } catch {
                    return QueueError.isRefusedByServer(error) ? "poison: \(String(reflecting: error))" : "transient"
                }
            }
            #expect(write.waited, "the insert's foreign-key check waits on the delete")
            #expect(write.value == "transient", "\(write.value.prefix(300))")
            let again = try await db.queue.writeOutcomes([outcome], workerID: "w")
            #expect(again.recorded == ids, "written again, the statement no longer sees the hook")
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == 1)
        }
    }
}
