import Foundation
import PostgresNIO
import PushCore
import PushQueue
import PushQueueTesting
import Testing

/// The webhook outbox (schema 11) against real Postgres: the statement that writes outcomes inserts a
/// delivery for every hook an outcome matches (event, topic, not disabled), with the JSON to POST, and none
/// for an outcome it does not write.
@Suite("Webhooks: outcomes become deliveries in the statement that writes them")
struct WebhookOutboxTests {
    @Test(
        "delivered, dead and token_invalid outcomes match hooks by event and topic; retries, fenced outcomes and disabled hooks make none"
    )
    func outbox() async throws {
        try await TestPostgres.withDatabase { db in
            let ids = try await enqueue(db, count: 5)
            let batch = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(batch.jobs.count == 5)
            // No hook: outcomes write no delivery.
            _ = try await db.queue.writeOutcomes(
                [JobOutcome(jobID: ids[0], attempt: 1, disposition: .delivered, attemptedAt: .now, status: 200)],
                workerID: "w"
            )
            #expect(try await db.int64("SELECT count(*) FROM push.webhook_deliveries") == 0)
            let all = try await db.queue.operations.addWebhook(
                url: "https://hooks.example.com/all",
                events: ["delivered", "dead"],
                topic: nil,
                secretFile: "/etc/push-worker/a.secret"
            )
            let tokens = try await db.queue.operations.addWebhook(
                url: "https://hooks.example.com/tokens",
                events: ["token_invalid"],
                topic: "com.example.app",
                secretFile: "/etc/push-worker/b.secret"
            )
            let other = try await db.queue.operations.addWebhook(
                url: "https://hooks.example.com/other",
                events: ["delivered", "dead", "token_invalid"],
                topic: "com.example.other",
                secretFile: "/etc/push-worker/c.secret"
            )
            let off = try await db.queue.operations.addWebhook(
                url: "http://hooks.example.com/off",
                events: ["delivered"],
                topic: nil,
                secretFile: "/etc/push-worker/d.secret"
            )
            try await db.execute(
                "UPDATE push.webhooks SET disabled_at = now(), disabled_reason = 'test' WHERE id = \(off.id)"
            )
            _ = try await db.queue.writeOutcomes(
                [
                    JobOutcome(jobID: ids[1], attempt: 1, disposition: .delivered, attemptedAt: .now, status: 200),
                    JobOutcome(
                        jobID: ids[2],
                        attempt: 1,
                        disposition: .dead(sentence: "gone"),
                        attemptedAt: .now,
                        status: 410,
                        reason: "Unregistered",
                        trapIDs: [.tokenUnregistered],
                        invalidatesToken: true,
                        apnsTimestampMs: 1_700_000_000_000
                    ),
                    JobOutcome(
                        jobID: ids[3],
                        attempt: 1,
                        disposition: .dead(sentence: "too big"),
                        attemptedAt: .now,
                        status: 413,
                        reason: "PayloadTooLarge"
                    ),
                    // A retry is no outcome a hook takes.
                    JobOutcome(
                        jobID: ids[4],
                        attempt: 1,
                        disposition: .retry(after: .seconds(60)),
                        attemptedAt: .now,
                        status: 503
                    ),
                    // Fenced (another worker's): not written, no delivery.
                    JobOutcome(jobID: ids[4], attempt: 1, disposition: .delivered, attemptedAt: .now, status: 200),
                ],
                workerID: "w"
            )
            let rows = try await db.client.query(
                "SELECT webhook_id, event, job_id, body::text FROM push.webhook_deliveries ORDER BY webhook_id, job_id, event"
            ).decode((Int64, String, Int64, String).self).collect()
            let summary = rows.map { "\($0.0)/\($0.1)/\($0.2)" }
            #expect(
                summary == [
                    "\(all.id)/delivered/\(ids[1])", "\(all.id)/dead/\(ids[2])", "\(all.id)/dead/\(ids[3])",
                    "\(tokens.id)/token_invalid/\(ids[2])",
                ],
                "\(summary)"
            )
            _ = other
            let body = try #require(
                try JSONSerialization.jsonObject(with: Data(rows[1].3.utf8)) as? [String: Any]
            )
            #expect(body["job_id"] as? Int == Int(ids[2]))
            #expect(body["state"] as? String == "dead" && body["status"] as? Int == 410)
            #expect(body["reason"] as? String == "Unregistered" && body["platform"] as? String == "apns")
            #expect(body["trap_ids"] as? [String] == ["MS020"] && body["topic"] as? String == "com.example.app")
            #expect((body["apns_id"] as? String).flatMap(UUID.init(uuidString:)) != nil && body["at"] != nil)
            // The listing counts the outbox per hook.
            let listed = try await db.queue.operations.webhooks()
            #expect(listed.map(\.waiting) == [3, 1, 0, 0])
            #expect(listed.last?.disabledReason == "test")
            #expect(try await db.queue.operations.removeWebhook(id: all.id))
            #expect(try await db.int64("SELECT count(*) FROM push.webhook_deliveries") == 1)
            #expect(try await !db.queue.operations.removeWebhook(id: all.id))
        }
    }

    @Test("a job retired by latest wins is a superseded delivery, written by the claim that retired it")
    func superseded() async throws {
        try await TestPostgres.withDatabase { db in
            let hook = try await db.queue.operations.addWebhook(
                url: "https://hooks.example.com/s",
                events: ["superseded"],
                topic: nil,
                secretFile: "/etc/push-worker/s.secret"
            )
            let ids = try await db.int64s(
                """
                INSERT INTO push.jobs (topic, device_token, payload, coalesce_key)
                SELECT 'com.example.app', repeat('ab', 32), '{"aps":{}}', 'score' FROM generate_series(1, 3) RETURNING id
                """
            )
            let batch = try await db.queue.claimBatch(limit: 10, workerID: "w", lease: .seconds(60))
            #expect(batch.jobs.map(\.id) == [ids[2]] && batch.superseded == 2)
            let rows = try await db.client.query(
                "SELECT webhook_id, event, job_id, body->>'state' FROM push.webhook_deliveries ORDER BY job_id"
            ).decode((Int64, String, Int64, String).self).collect()
            #expect(rows.map(\.2) == Array(ids.prefix(2)))
            #expect(rows.allSatisfy { $0.0 == hook.id && $0.1 == "superseded" && $0.3 == "superseded" })
        }
    }

    @Test("the schema refuses a hook it could never serve, naming the rule")
    func constraints() async throws {
        try await TestPostgres.withDatabase { db in
            for (url, events, secret, rule) in [
                ("ftp://x", ["delivered"], "/s", "webhook_url_must_be_http_or_https"),
                ("https://x", ["sent"], "/s", "webhook_events_are_delivered_dead_superseded_or_token_invalid"),
                ("https://x", [String](), "/s", "webhook_events_are_delivered_dead_superseded_or_token_invalid"),
                ("https://x", ["dead"], "relative.secret", "webhook_secret_file_must_be_an_absolute_path"),
            ] {
                do {
                    _ = try await db.queue.operations.addWebhook(
                        url: url,
                        events: events,
                        topic: nil,
                        secretFile: secret
                    )
                    Issue.record("\(url) \(events) \(secret) was accepted")
                } catch {
                    #expect(String(reflecting: error).contains(rule), "\(String(reflecting: error).prefix(300))")
                }
            }
        }
    }
}
