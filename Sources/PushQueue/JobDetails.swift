public import Foundation
public import PushCore

/// One row of `push.jobs` with its outcome, for `push-worker jobs show`.
public struct JobDetails: Sendable, Hashable {
    /// The job as the producer enqueued it.
    public var job: PushJob
    /// `pending`, `running`, `delivered` or `superseded`.
    public var state: JobState
    /// HTTP status of the last attempt.
    public var status: Int?
    /// Reason of the last failed attempt.
    public var reason: String?
    /// `apns-unique-id` of the last attempt, where given.
    public var apnsUniqueID: String?
    /// When APNs accepted it.
    public var deliveredAt: Date?
    /// When the last attempt was recorded.
    public var lastAttemptAt: Date?
    /// How long the last request took.
    public var latencyMs: Int?
    /// The worker holding the lease, while running.
    public var lockedBy: String?
    /// When the lease runs out, while running.
    public var lockedUntil: Date?
    /// The newer job with the same `coalesce_key` that replaced it, when `superseded`.
    public var supersededBy: Int64? = nil
    /// FCM's message `name` for a delivered fcm job.
    public var providerMessageID: String? = nil
    /// The attempt history as JSON: one object per attempt.
    public var historyJSON: String
    /// The whole row as a JSON object, every column by its SQL name (for `--json`).
    public var rowJSON: String
    /// A recipient's job that fanned out: its children, one per device, in id order.
    public var children: [Child] = []

    /// One child of a recipient's job.
    public struct Child: Sendable, Hashable {
        public var id: Int64
        /// Its state, `dead` once a dead letter, or `pruned`.
        public var state: String
        /// The device token's fingerprint (never the token).
        public var tokenFingerprint: String
        public var environment: String
        public var reason: String?
    }
}

/// The queue at a glance, for `push-worker stats`.
public struct QueueStats: Sendable, Hashable, Codable {
    /// Jobs by state (`pending`, `running`, `delivered`), zero included.
    public var byState: [String: Int]
    /// Pending jobs due now (the rest wait for a retry time or `run_at`).
    public var pendingDue: Int
    /// Age in seconds of the oldest due pending job; 0 when none.
    public var oldestPendingAgeSeconds: Double
    /// Dead letters in all.
    public var deadLetters: Int
    /// Dead letters by trap id; those without one under `none`.
    public var deadByTrap: [String: Int]
    /// Jobs delivered in the last minute.
    public var deliveredLastMinute: Int
    /// Jobs dead-lettered in the last minute.
    public var deadLastMinute: Int
    /// Rows in `push.invalid_tokens`.
    public var invalidTokens: Int
    /// Jobs by platform (`apns`, `fcm`), then by state; only platforms with jobs.
    public var byPlatform: [String: [String: Int]] = [:]
}
