public import Foundation
import PostgresNIO

/// A receiver of outcomes (`push.webhooks`, CONTRACT.md 1c), with its outbox's counts.
public struct Webhook: Sendable, Hashable, Codable {
    public var id: Int64
    public var url: String
    /// `delivered`, `dead`, `superseded`, `token_invalid`.
    public var events: [String]
    /// Only outcomes of this topic; `nil`: any.
    public var topic: String?
    /// The file holding the HMAC secret (read by the worker when it signs).
    public var secretFile: String
    public var createdAt: Date
    /// Why no more deliveries are made for it (a 410 from the receiver, an operator), if so.
    public var disabledReason: String?
    /// Deliveries waiting to be POSTed (pending or being sent).
    public var waiting: Int = 0
    /// Of those, the ones whose last try was refused or unanswered.
    public var failing: Int = 0
    /// Deliveries given up on after 24 hours.
    public var dead: Int = 0
}

extension QueueOperations {
    /// The events a hook may take.
    public static let webhookEvents: Set<String> = ["delivered", "dead", "superseded", "token_invalid"]

    /// Adds a hook; the schema's constraints name what is wrong with a bad one.
    public func addWebhook(url: String, events: [String], topic: String?, secretFile: String) async throws -> Webhook {
        let rows = try await self.client.query(
            WebhooksSQL.add.query {
                $0.bind("url", url)
                $0.bind("events", events)
                $0.bind("topic", topic)
                $0.bind("secret_file", secretFile)
            },
            logger: self.logger
        )
        for try await row in rows.decode((Int64, String, [String], String?, String, Date, String?).self) {
            return Webhook(
                id: row.0,
                url: row.1,
                events: row.2,
                topic: row.3,
                secretFile: row.4,
                createdAt: row.5,
                disabledReason: row.6
            )
        }
        throw QueueError(code: .invalidArgument, message: "the webhook was not recorded")
    }

    /// Removes a hook and its outbox; `false` when there was none with this id. In three steps, so that no
    /// outcome write waits on (or fails against) a hook being removed: the hook is disabled first (outcome
    /// writes stop matching it, claims stop taking its deliveries), its deliveries are deleted in batches,
    /// then the row itself.
    public func removeWebhook(id: Int64) async throws -> Bool {
        var found = false
        for try await _ in try await self.client.query(
            WebhooksSQL.disableForRemoval.query { $0.bind("id", id) },
            logger: self.logger
        ) {
            found = true
        }
        guard found else { return false }
        _ = try await self.queue.deleteInBatches(
            of: 5_000,
            WebhooksSQL.deleteDeliveries.query {
                $0.bind("id", id)
                $0.bind("batch_size", Int64(5_000))
            }
        )
        var removed = false
        for try await _ in try await self.client.query(
            WebhooksSQL.remove.query { $0.bind("id", id) },
            logger: self.logger
        ) {
            removed = true
        }
        return removed
    }

    /// Every hook, oldest first, with its deliveries waiting, failing and dead.
    public func webhooks() async throws -> [Webhook] {
        let rows = try await self.client.query(WebhooksSQL.list.query(), logger: self.logger)
        var hooks: [Webhook] = []
        for try await row in rows.decode(
            (Int64, String, [String], String?, String, Date, String?, Int64, Int64, Int64).self
        ) {
            hooks.append(
                Webhook(
                    id: row.0,
                    url: row.1,
                    events: row.2,
                    topic: row.3,
                    secretFile: row.4,
                    createdAt: row.5,
                    disabledReason: row.6,
                    waiting: Int(row.7),
                    failing: Int(row.8),
                    dead: Int(row.9)
                )
            )
        }
        return hooks
    }
}

/// What ``QueueOperations/replayWebhookDeliveries(ids:hook:)`` did.
public struct WebhookReplayResult: Sendable, Hashable, Codable {
    /// Deliveries queued again: pending, due now, with their id (receivers dedupe on it) and body kept.
    public var replayed: [Int64]
    /// Asked-for ids that are not dead deliveries (pending, running, delivered, or unknown).
    public var notDead: [Int64]
    /// The hook enabled again (it had been disabled by a 410), when replaying by hook.
    public var enabledHook: Int64?
    /// Hooks of replayed deliveries that are still disabled: those deliveries wait until `replay --hook`
    /// enables them.
    public var disabledHooks: [Int64] = []
}

extension QueueOperations {
    /// Queues dead deliveries again (by id, or every dead one of `hook`): pending, due now, a fresh 24 hours
    /// to be delivered in; the id and body are kept, and so is the count of tries (it only grows: a try a
    /// worker still holds from before can never be taken for a new one). Replaying by hook also enables the hook
    /// again when a 410 (or an operator) had disabled it.
    public func replayWebhookDeliveries(ids: [Int64], hook: Int64?) async throws -> WebhookReplayResult {
        var result = WebhookReplayResult(replayed: [], notDead: [], enabledHook: nil, disabledHooks: [])
        try await self.client.withTransaction(logger: self.logger) { connection in
            if let hook {
                for try await id in try await connection.query(
                    WebhooksSQL.enable.query { $0.bind("id", hook) },
                    logger: self.logger
                ).decode(Int64.self) {
                    result.enabledHook = id
                }
            }
            for try await id in try await connection.query(
                WebhooksSQL.replay.query {
                    $0.bind("ids", ids)
                    $0.bind("hook", hook)
                },
                logger: self.logger
            ).decode(Int64.self) {
                result.replayed.append(id)
            }
        }
        result.replayed.sort()
        let replayed = Set(result.replayed)
        result.notDead = ids.filter { !replayed.contains($0) }
        // Replayed deliveries of a hook that stays disabled wait until it is enabled (replay --hook).
        for try await hook in try await self.client.query(
            WebhooksSQL.disabledHooksOf.query { $0.bind("ids", result.replayed) },
            logger: self.logger
        ).decode(Int64.self) {
            result.disabledHooks.append(hook)
        }
        return result
    }

    /// The hook's most recent failed deliveries (dead or still retrying), newest first: what the runbook
    /// starts from.
    public func failingWebhookDeliveries(hook: Int64, limit: Int) async throws -> [FailingWebhookDelivery] {
        var rows: [FailingWebhookDelivery] = []
        for try await row in try await self.client.query(
            WebhooksSQL.failing.query {
                $0.bind("hook", hook)
                $0.bind("limit", Int64(limit))
            },
            logger: self.logger
        ).decode((Int64, String, Int64, String, Int32, Int32?, String?, Date, Date).self) {
            rows.append(
                FailingWebhookDelivery(
                    id: row.0,
                    event: row.1,
                    jobID: row.2,
                    state: row.3,
                    attempts: Int(row.4),
                    lastStatus: row.5.map(Int.init),
                    lastError: row.6,
                    nextTry: row.3 == "dead" ? nil : row.7,
                    createdAt: row.8
                )
            )
        }
        return rows
    }
}

/// A delivery that failed at least once (`webhooks show`).
public struct FailingWebhookDelivery: Sendable, Hashable, Codable {
    public var id: Int64
    public var event: String
    public var jobID: Int64
    public var state: String
    public var attempts: Int
    public var lastStatus: Int?
    public var lastError: String?
    /// When it is tried again (`nil` for a dead one).
    public var nextTry: Date?
    public var createdAt: Date
}

/// The statements of `Statements/webhooks.sql`, with their binds in order.
enum WebhooksSQL: StatementFile {
    static let file = "webhooks"

    static let add = named("add", "url", "events", "topic", "secret_file")
    static let disableForRemoval = named("disable_for_removal", "id")
    static let deleteDeliveries = named("delete_deliveries", "id", "batch_size")
    static let remove = named("remove", "id")
    static let list = named("list")
    static let enable = named("enable", "id")
    static let replay = named("replay", "ids", "hook")
    static let disabledHooksOf = named("disabled_hooks_of", "ids")
    static let failing = named("failing", "hook", "limit")
    static let claimDeadline = named("claim_deadline", "timeout")
    static let claimHooks = named("claim_hooks")
    static let claimDeliveries = named("claim_deliveries", "per_hook", "hooks", "limit", "worker_id", "lease_seconds")
    static let recordTries = named(
        "record_tries",
        "ids",
        "attempts",
        "kinds",
        "statuses",
        "errors",
        "waits",
        "window_seconds",
        "worker_id"
    )
    static let reclaimPreviousLife = named("reclaim_previous_life", "worker_id")
    static let killDisabled = named("kill_disabled", "batch_size")
    static let pruneDelivered = named("prune_delivered", "retention_seconds", "batch_size")
    static let pruneDead = named("prune_dead", "batch_size")

    static let all = [
        add, disableForRemoval, deleteDeliveries, remove, list, enable, replay, disabledHooksOf, failing,
        claimDeadline, claimHooks, claimDeliveries, recordTries, reclaimPreviousLife, killDisabled, pruneDelivered,
        pruneDead,
    ]
}
