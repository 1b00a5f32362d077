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
                    WebhooksSQL.claimDeadline.query {
                        $0.bind("timeout", "\(max(statementTimeout.milliseconds, 1))ms")
                    },
                    logger: logger
                )
            }
            var hooks: [Int64] = []
            for try await id in try await connection.query(WebhooksSQL.claimHooks.query(), logger: logger)
                .decode(Int64.self)
            {
                hooks.append(id)
            }
            guard !hooks.isEmpty else { return [] }
            var claimed: [WebhookDelivery] = []
            for try await row in try await connection.query(
                WebhooksSQL.claimDeliveries.query {
                    $0.bind("per_hook", Int64(perHook))
                    $0.bind("hooks", hooks)
                    $0.bind("limit", Int64(limit))
                    $0.bind("worker_id", workerID)
                    $0.bind("lease_seconds", seconds)
                },
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
            WebhooksSQL.recordTries.query {
                $0.bind("ids", ids)
                $0.bind("attempts", attempts)
                $0.bind("kinds", kinds)
                $0.bind("statuses", statuses)
                $0.bind("errors", errors)
                $0.bind("waits", waits)
                $0.bind("window_seconds", window)
                $0.bind("worker_id", workerID)
            },
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
            WebhooksSQL.reclaimPreviousLife.query { $0.bind("worker_id", workerID) },
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
            WebhooksSQL.killDisabled.query { $0.bind("batch_size", Int64(batchSize)) }
        )
        let seconds = Double(retention.components.seconds)
        var total = 0
        for statement in Self.webhookPrunes(retentionSeconds: seconds, batchSize: batchSize) {
            total += try await self.deleteInBatches(of: batchSize, statement)
        }
        return total
    }

    /// The outbox's prunes: delivered deliveries past the retention, dead ones past 31 days. Two statements,
    /// each read through its own partial index (schema 14): only the rows it deletes, whatever the outbox holds.
    static func webhookPrunes(retentionSeconds: Double, batchSize: Int) -> [PostgresQuery] {
        [
            WebhooksSQL.pruneDelivered.query {
                $0.bind("retention_seconds", retentionSeconds)
                $0.bind("batch_size", Int64(batchSize))
            },
            WebhooksSQL.pruneDead.query { $0.bind("batch_size", Int64(batchSize)) },
        ]
    }
}
