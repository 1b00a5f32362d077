public import Foundation
public import PushCore

/// A job that will not be sent again unless replayed, as stored in `push.dead_jobs`.
public struct DeadLetter: Sendable, Hashable {
    /// The job as the producer enqueued it (same id and `apns_id`).
    public var job: PushJob
    /// HTTP status of the last attempt; `nil` for a transport failure or a job never sent.
    public var status: Int?
    /// APNs' reason, the transport error, or the pre-send verdict (`Expired`, `PayloadTooLarge`, …).
    public var reason: String
    /// `apns-unique-id` of the last attempt, where given.
    public var apnsUniqueID: String?
    /// When it was moved here.
    public var deadAt: Date
    /// A sentence saying what went wrong and what to fix.
    public var error: String
    /// The attempt history as JSON: one object per attempt.
    public var historyJSON: String
    /// The whole row as a JSON object, every column by its SQL name (for `--json`).
    public var rowJSON: String
}

/// Which dead letters a listing, replay or purge means. Empty fields match everything.
public struct DeadLetterFilter: Sendable, Hashable {
    /// Only these ids.
    public var ids: [Int64]
    /// Only dead letters that met this trap id (e.g. `MS020`).
    public var trapID: String?
    /// Only those whose last trap id (the one they died with, as the console groups them) is this one;
    /// `.some(nil)`: only those with no trap id at all.
    public var lastTrap: String?? = nil
    /// Only this reason (e.g. `Unregistered`, `Expired`).
    public var reason: String?
    /// Only this topic.
    public var topic: String?
    /// Only those dead at or after this instant.
    public var since: Date?
    /// Only those dead before this instant.
    public var before: Date?
    /// At most this many, newest first for listings, oldest first for replay.
    public var limit: Int

    /// A filter; with no arguments it matches every dead letter, up to 100.
    public init(
        ids: [Int64] = [],
        trapID: String? = nil,
        reason: String? = nil,
        topic: String? = nil,
        since: Date? = nil,
        before: Date? = nil,
        limit: Int = 100
    ) {
        self.ids = ids
        self.trapID = trapID
        self.reason = reason
        self.topic = topic
        self.since = since
        self.before = before
        self.limit = limit
    }

    /// Whether the filter names anything at all (replay refuses an empty selection unless told `--all`).
    public var isUnrestricted: Bool {
        ids.isEmpty && trapID == nil && lastTrap == nil && reason == nil && topic == nil && since == nil
            && before == nil
    }
}

/// What a replay moved, or with a dry run would move.
public struct ReplayResult: Sendable, Hashable {
    /// One job moved back to `push.jobs`.
    public struct Moved: Sendable, Hashable {
        /// The dead letter's id.
        public var id: Int64
        /// The `apns_id` it will be sent with: the original, or a fresh one with `--new-apns-id`.
        public var apnsID: UUID
        /// The reason it had died with.
        public var reason: String
        /// Its `expires_at` has passed (and no new one was given): it will die `Expired` again at once.
        public var expired: Bool = false
        /// The id it is queued under in `push.jobs` (`nil` for a dry run): its own, unless ``renumbered``.
        public var queuedAs: Int64? = nil
        /// A keyed job whose key has a *revived* job above its id (`jobs revive` of an older state after this
        /// one died): it is queued under a new id above it, so that latest-wins sends this newer state last.
        /// A truly newer job of its key keeps it at its id, where the claim supersedes it.
        public var renumbered: Bool = false
    }

    /// A dead letter left where it is because it breaks a rule the schema checks at INSERT.
    public struct Invalid: Sendable, Hashable {
        /// The dead letter's id.
        public var id: Int64
        /// The rule, by its constraint's name.
        public var rule: String
    }

    /// The jobs moved (or, for a dry run, that would move).
    public var moved: [Moved]
    /// Matching dead letters that break a rule of the schema (from before it checked them): fix the row, or
    /// purge it; they stay dead letters.
    public var skippedInvalid: [Invalid] = []
    /// Matching dead letters left where they are because `push.jobs` already holds their id or `apns_id`
    /// (a producer re-enqueued it); replay with `--new-apns-id` to send them anyway.
    public var skippedConflicts: [Int64]
    /// Whether this was a dry run.
    public var dryRun: Bool
}
