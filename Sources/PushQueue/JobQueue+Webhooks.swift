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
    /// Of those, the ones already tried and refused or unanswered at least once.
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
            """
            INSERT INTO push.webhooks (url, events, topic, secret_file)
            VALUES (\(url), \(events)::text[], \(topic), \(secretFile))
            RETURNING id, url, events, topic, secret_file, created_at, disabled_reason
            """,
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

    /// Removes a hook and its outbox; `false` when there was none with this id.
    public func removeWebhook(id: Int64) async throws -> Bool {
        var removed = false
        for try await _ in try await self.client.query(
            "DELETE FROM push.webhooks WHERE id = \(id) RETURNING id",
            logger: self.logger
        ) {
            removed = true
        }
        return removed
    }

    /// Every hook, oldest first, with its deliveries waiting, failing and dead.
    public func webhooks() async throws -> [Webhook] {
        let rows = try await self.client.query(
            """
            SELECT w.id, w.url, w.events, w.topic, w.secret_file, w.created_at, w.disabled_reason,
                   count(*) FILTER (WHERE d.state IN ('pending', 'running')),
                   count(*) FILTER (WHERE d.state IN ('pending', 'running') AND d.attempts > 0),
                   count(*) FILTER (WHERE d.state = 'dead')
              FROM push.webhooks AS w LEFT JOIN push.webhook_deliveries AS d ON d.webhook_id = w.id
             GROUP BY w.id ORDER BY w.id
            """,
            logger: self.logger
        )
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
