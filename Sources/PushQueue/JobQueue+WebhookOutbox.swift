public import Foundation
import PostgresNIO
import PushCore

/// One delivery claimed for sending: the POST to make and what signs it.
public struct WebhookDelivery: Sendable, Hashable {
    /// The delivery's id: stable across retries, crashes and replays, sent as `Push-Delivery-Id` so that a
    /// receiver can drop a duplicate.
    public var id: Int64
    public var webhookID: Int64
    public var url: String
    public var secretFile: String
    /// `delivered`, `dead`, `superseded` or `token_invalid`.
    public var event: String
    public var jobID: Int64
    /// The JSON body, exactly as POSTed and signed.
    public var body: String
    /// Tries so far, this one included.
    public var attempt: Int
    public var createdAt: Date
    /// Time since `createdAt` (the outcome, or the last `webhooks replay`) by the database's clock, at the claim.
    public var age: Duration
}

/// What became of one try of a delivery, to record.
public struct WebhookTry: Sendable, Hashable {
    public enum Kind: String, Sendable {
        /// A 2xx.
        case delivered
        /// Try again after `retryAfter` (dead once that is past the 24 hours).
        case retry
        /// The receiver answered 410 Gone: the hook is disabled, the delivery dead.
        case gone
    }

    public var id: Int64
    public var attempt: Int
    public var kind: Kind
    /// The receiver's status, `nil` when it did not answer.
    public var status: Int?
    /// What went wrong, for `webhooks` and the runbook (never a secret: the URL's query is not included).
    public var error: String?
    /// For ``Kind/retry``: the wait before the next try.
    public var retryAfter: Duration

    public init(id: Int64, attempt: Int, kind: Kind, status: Int?, error: String?, retryAfter: Duration = .zero) {
        self.id = id
        self.attempt = attempt
        self.kind = kind
        self.status = status
        self.error = error
        self.retryAfter = retryAfter
    }
}

/// How many of a hook's deliveries ended each way, from one ``JobQueue/recordWebhookTries(_:workerID:retryWindow:)``.
public struct WebhookRecordResult: Sendable, Hashable {
    public var delivered = 0
    public var retried = 0
    /// Given up on after the retry window.
    public var dead = 0
    /// Answered 410 Gone (dead too, with their hook disabled).
    public var gone = 0
    /// Hooks disabled by a 410.
    public var disabledHooks: [Int64] = []
}

extension JobQueue {
    /// Claims due deliveries (SKIP LOCKED, like jobs): at most `perHook` in flight per hook across the fleet,
    /// at most `limit` in all, oldest due first across hooks. A delivery whose holder's lease lapsed (a worker
    /// killed mid-POST) is due again: it is sent again with the same id.
    ///
    /// Two statements in one transaction. The first locks the enabled hooks that have due deliveries
    /// (`FOR NO KEY UPDATE SKIP LOCKED`: outcome writes' foreign-key checks are not blocked, and a hook another
    /// worker is claiming for is skipped this round); an idle poll locks nothing. The second, with a snapshot
    /// taken after those locks, counts each hook's deliveries in flight (so another worker's claim that just
    /// committed is counted) and claims the rest of its share.
    public func claimWebhookDeliveries(
        workerID: String,
        perHook: Int,
        limit: Int,
        lease: Duration,
        statementTimeout: Duration? = nil
    ) async throws -> [WebhookDelivery] {
        let seconds = lease.seconds
        let logger = self.logger
        return try await self.client.withTransaction(logger: logger) { connection in
            // The caller's deadline, on the server too: a claim it stopped waiting for stops running.
            if let statementTimeout {
                try await connection.query(
                    PostgresQuery(
                        unsafeSQL: "SET LOCAL statement_timeout = '\(max(statementTimeout.milliseconds, 1))ms'"
                    ),
                    logger: logger
                )
            }
            var hooks: [Int64] = []
            for try await id in try await connection.query(
                """
                SELECT w.id FROM push.webhooks AS w
                 WHERE w.disabled_at IS NULL
                   AND EXISTS (SELECT 1 FROM push.webhook_deliveries AS d
                                WHERE d.webhook_id = w.id AND d.state IN ('pending', 'running') AND d.run_at <= now()
                                  AND (d.state = 'pending' OR d.locked_until < now()))
                 ORDER BY w.id
                 FOR NO KEY UPDATE OF w SKIP LOCKED
                """,
                logger: logger
            ).decode(Int64.self) {
                hooks.append(id)
            }
            guard !hooks.isEmpty else { return [] }
            var claimed: [WebhookDelivery] = []
            for try await row in try await connection.query(
                """
                WITH hooks AS MATERIALIZED (
                    SELECT h.id,
                           \(perHook) - (SELECT count(*) FROM push.webhook_deliveries AS r
                                          WHERE r.webhook_id = h.id AND r.state = 'running' AND r.locked_until >= now())
                           AS room
                      FROM unnest(\(hooks)::bigint[]) AS h (id)
                ), picked AS (
                    SELECT p.id FROM hooks AS h CROSS JOIN LATERAL (
                        SELECT d.id, d.run_at FROM push.webhook_deliveries AS d
                         WHERE d.webhook_id = h.id AND d.state IN ('pending', 'running') AND d.run_at <= now()
                           AND (d.state = 'pending' OR d.locked_until < now())
                         ORDER BY d.run_at LIMIT greatest(h.room, 0)
                         FOR NO KEY UPDATE SKIP LOCKED
                    ) AS p
                    ORDER BY p.run_at
                    LIMIT \(limit)
                )
                UPDATE push.webhook_deliveries AS d
                   SET state = 'running', attempts = d.attempts + 1, locked_by = \(workerID),
                       locked_until = now() + make_interval(secs => \(seconds))
                  FROM push.webhooks AS w
                 WHERE d.id IN (SELECT id FROM picked) AND w.id = d.webhook_id
                RETURNING d.id, d.webhook_id, w.url, w.secret_file, d.event, d.job_id, d.body::text, d.attempts,
                          d.created_at,
                          CASE WHEN isfinite(d.created_at)
                               THEN least(extract(epoch FROM now() - d.created_at), 1e9) ELSE 1e9 END::float8
                """,
                logger: logger
            ).decode((Int64, Int64, String, String, String, Int64, String, Int32, Date, Double).self) {
                claimed.append(
                    WebhookDelivery(
                        id: row.0,
                        webhookID: row.1,
                        url: row.2,
                        secretFile: row.3,
                        event: row.4,
                        jobID: row.5,
                        body: row.6,
                        attempt: Int(row.7),
                        createdAt: row.8,
                        // Finite and at most 1e9 s by the statement.
                        age: .milliseconds(Int64(max(row.9, 0) * 1_000))
                    )
                )
            }
            return claimed
        }
    }

    /// Records tries of deliveries this worker holds (fenced by holder and attempt: a try whose lease lapsed
    /// and was claimed again records nothing). A retry whose next try would fall past `retryWindow` after the
    /// outcome is dead instead; a 410 disables its hook.
    @discardableResult
    public func recordWebhookTries(
        _ tries: [WebhookTry],
        workerID: String,
        retryWindow: Duration = .seconds(24 * 3_600)
    ) async throws -> WebhookRecordResult {
        guard !tries.isEmpty else { return WebhookRecordResult() }
        let ids = tries.map(\.id)
        let attempts = tries.map { Int32(clamping: $0.attempt) }
        let kinds = tries.map(\.kind.rawValue)
        // Arrays of optionals do not bind: 0 and '' stand for none.
        let statuses = tries.map { Int32(clamping: $0.status ?? 0) }
        let errors = tries.map { String(($0.error ?? "").prefix(500)) }
        let waits = tries.map(\.retryAfter.seconds)
        let window = Double(retryWindow.components.seconds)
        var result = WebhookRecordResult()
        for try await row in try await self.client.query(
            """
            WITH input AS (
                SELECT u.id, u.attempt, u.kind, NULLIF(u.status, 0) AS status, NULLIF(u.error, '') AS error, u.wait
                  FROM unnest(\(ids)::bigint[], \(attempts)::int[], \(kinds)::text[], \(statuses)::int[],
                              \(errors)::text[], \(waits)::float8[]) AS u (id, attempt, kind, status, error, wait)
            ), updated AS (
                UPDATE push.webhook_deliveries AS d
                   SET state = CASE WHEN i.kind = 'delivered' THEN 'delivered'
                                    WHEN i.kind = 'retry'
                                         AND now() + make_interval(secs => i.wait)
                                             <= d.created_at + make_interval(secs => \(window))
                                    THEN 'pending'
                                    ELSE 'dead' END,
                       run_at = CASE WHEN i.kind = 'retry' THEN now() + make_interval(secs => i.wait) ELSE d.run_at END,
                       delivered_at = CASE WHEN i.kind = 'delivered' THEN now() END,
                       last_status = i.status,
                       last_error = CASE WHEN i.kind = 'delivered' THEN NULL
                                         WHEN i.kind = 'retry'
                                              AND now() + make_interval(secs => i.wait)
                                                  > d.created_at + make_interval(secs => \(window))
                                         THEN 'gave up after 24 hours: ' || coalesce(i.error, 'no answer')
                                         ELSE i.error END,
                       locked_by = NULL, locked_until = NULL
                  FROM input AS i
                 WHERE d.id = i.id AND d.attempts = i.attempt AND d.state = 'running' AND d.locked_by = \(workerID)
                RETURNING d.id, d.state, d.webhook_id, i.kind, i.status
            ), disabled AS (
                UPDATE push.webhooks AS w
                   SET disabled_at = now(),
                       disabled_reason = 'the receiver answered 410 Gone at '
                                         || to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || 'Z'
                 WHERE w.id IN (SELECT webhook_id FROM updated WHERE kind = 'gone') AND w.disabled_at IS NULL
                RETURNING w.id
            )
            SELECT CASE WHEN u.kind = 'gone' THEN 'gone' ELSE u.state END, NULL::bigint FROM updated AS u
            UNION ALL
            SELECT 'disabled', id FROM disabled
            """,
            logger: self.logger
        ).decode((String, Int64?).self) {
            switch row.0 {
            case "delivered": result.delivered += 1
            case "pending": result.retried += 1
            case "dead": result.dead += 1
            case "gone": result.gone += 1
            case "disabled": if let hook = row.1 { result.disabledHooks.append(hook) }
            default: break
            }
        }
        return result
    }

    /// Returns to pending the deliveries an earlier process of this worker id left running (it died
    /// mid-POST): they are sent again with the same delivery id. Called at start, with the jobs' own.
    @discardableResult
    public func reclaimWebhookDeliveries(ofPreviousLife workerID: String) async throws -> Int {
        var count = 0
        for try await _ in try await self.client.query(
            """
            UPDATE push.webhook_deliveries SET state = 'pending', locked_by = NULL, locked_until = NULL, run_at = now()
             WHERE state = 'running' AND locked_by = \(workerID)
            RETURNING id
            """,
            logger: self.logger
        ) {
            count += 1
        }
        return count
    }

    /// Deletes delivered deliveries older than `retention` (dead ones stay, for `webhooks replay`, until
    /// their hook is removed or they are a month old), in batches. First, the pending deliveries of a disabled
    /// hook (a 410 from its receiver, or an operator) become dead, saying why: nobody claims them, and they would
    /// wait for ever; `webhooks replay` enables the hook and sends them again.
    @discardableResult
    public func pruneWebhookDeliveries(olderThan retention: Duration, batchSize: Int = 5_000) async throws -> Int {
        // In batches; a lapsed `running` one too. Its month before the dead prune starts now.
        _ = try await self.deleteInBatches(
            of: batchSize,
            """
            UPDATE push.webhook_deliveries AS d
               SET state = 'dead', locked_by = NULL, locked_until = NULL, created_at = now(),
                   last_error = 'its hook is disabled (' || coalesce(w.disabled_reason, 'no reason given')
                                || '): webhooks replay enables it and sends this again'
              FROM push.webhooks AS w
             WHERE d.webhook_id = w.id AND w.disabled_at IS NOT NULL
               AND d.id IN (SELECT r.id FROM push.webhook_deliveries AS r JOIN push.webhooks AS h ON h.id = r.webhook_id
                             WHERE h.disabled_at IS NOT NULL
                               AND (r.state = 'pending' OR (r.state = 'running' AND r.locked_until < now()))
                             LIMIT \(batchSize) FOR UPDATE OF r SKIP LOCKED)
            RETURNING d.id
            """
        )
        let seconds = Double(retention.components.seconds)
        var total = 0
        for statement in Self.webhookPruneSQL(retentionSeconds: seconds, batchSize: batchSize) {
            total += try await self.deleteInBatches(of: batchSize, PostgresQuery(unsafeSQL: statement))
        }
        return total
    }

    /// The outbox's prunes: delivered deliveries past the retention, dead ones past 31 days. Two statements,
    /// each read through its own partial index (schema 14): only the rows it deletes, whatever the outbox holds.
    static func webhookPruneSQL(retentionSeconds: Double, batchSize: Int) -> [String] {
        [
            """
            DELETE FROM push.webhook_deliveries WHERE id IN (
                SELECT id FROM push.webhook_deliveries
                 WHERE state = 'delivered' AND delivered_at < now() - make_interval(secs => \(retentionSeconds))
                 LIMIT \(batchSize) FOR UPDATE SKIP LOCKED)
            RETURNING id
            """,
            """
            DELETE FROM push.webhook_deliveries WHERE id IN (
                SELECT id FROM push.webhook_deliveries
                 WHERE state = 'dead' AND created_at < now() - interval '31 days'
                 LIMIT \(batchSize) FOR UPDATE SKIP LOCKED)
            RETURNING id
            """,
        ]
    }
}
