import Foundation
public import PushCore

/// What one attempt of a claimed job came to, as the worker hands it to ``JobQueue/writeOutcomes(_:workerID:)``.
public struct JobOutcome: Sendable, Hashable {
    /// Where the job goes next: PushCore's ``Decision``, the one interpretation of a send.
    public typealias Disposition = Decision

    /// The job's id.
    public var jobID: Int64
    /// The job's `attempts` as the claim returned it: the fence against a newer attempt.
    public var attempt: Int
    /// Where the job goes next.
    public var disposition: Decision
    /// The HTTP status, or `nil` for a transport failure or a job never sent.
    public var status: Int?
    /// APNs' reason, the transport error (`Timeout`, …) or a pre-send verdict (`Expired`, …).
    public var reason: String?
    /// The trap ids this attempt met, merged into the job's `trap_ids` in first-seen order.
    public var trapIDs: [TrapID]
    /// APNs' `apns-unique-id` header, where given.
    public var apnsUniqueID: String?
    /// How long the request took, if one was made.
    public var latencyMs: Int?
    /// When the attempt was made, on this process's monotonic clock: the write turns it into an age and
    /// subtracts that from Postgres's `now()`, so every time in the queue is the database's.
    public var attemptedAt: ContinuousClock.Instant
    /// Whether a request reached the network; `false` for pre-send rejections and requests never written.
    public var sent: Bool
    /// Whether the token must be recorded in `push.invalid_tokens` (dead letters only).
    public var invalidatesToken: Bool
    /// APNs' 410 `timestamp` in milliseconds since the epoch, stored exactly (when in a sane range).
    public var apnsTimestampMs: Int64?
    /// For a traced job's first attempt, its span id (16 hex digits): kept in `trace_first_span` for the
    /// retries' spans to link to.
    public var traceSpan: String? = nil
    /// An `environment = 'auto'` job production answered BadDeviceToken: back to pending, uncounted, for
    /// development (its `environment` becomes development; its history says `switch_environment`).
    public var switchesEnvironment: Bool

    /// Creates an outcome; only the job, attempt, disposition and when the attempt started are required.
    public init(
        jobID: Int64,
        attempt: Int,
        disposition: Decision,
        attemptedAt: ContinuousClock.Instant,
        status: Int? = nil,
        reason: String? = nil,
        trapIDs: [TrapID] = [],
        apnsUniqueID: String? = nil,
        latencyMs: Int? = nil,
        sent: Bool = true,
        invalidatesToken: Bool = false,
        apnsTimestampMs: Int64? = nil,
        switchesEnvironment: Bool = false
    ) {
        self.switchesEnvironment = switchesEnvironment
        self.jobID = jobID
        self.attempt = attempt
        self.disposition = disposition
        self.status = status
        self.reason = reason
        self.trapIDs = trapIDs
        self.apnsUniqueID = apnsUniqueID
        self.latencyMs = latencyMs
        self.attemptedAt = attemptedAt
        self.sent = sent
        self.invalidatesToken = invalidatesToken
        self.apnsTimestampMs = apnsTimestampMs
    }
}

/// What a batch of outcome writes did.
public struct OutcomeWriteResult: Sendable, Hashable {
    /// Jobs whose outcome was written.
    public var recorded: [Int64]
    /// Jobs whose write was refused by the fence: the attempt is no longer this worker's (re-claimed by
    /// another worker after this one was taken for gone). Their newer state stands.
    public var fenced: [Int64]
}
