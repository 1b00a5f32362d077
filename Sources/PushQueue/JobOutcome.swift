public import Foundation

/// What one attempt of a claimed job came to, as the worker hands it to ``JobQueue/record(_:workerID:)``.
public struct JobOutcome: Sendable, Hashable {
    /// Where the job goes next.
    public enum Disposition: Sendable, Hashable {
        /// APNs answered 200: the job is `delivered`.
        case delivered
        /// Try again at this instant: the job returns to `pending` with `run_at` set to it.
        case retry(at: Date)
        /// Never again: the job moves to `push.dead_jobs` with this sentence as its `error`.
        case dead(error: String)
        /// Not this job's fault (its credential is paused): back to `pending` at this instant with the
        /// attempt not counted.
        case requeue(at: Date)
    }

    /// The job's id.
    public var jobID: Int64
    /// The job's `attempts` as the claim returned it: the fence against a newer attempt.
    public var attempt: Int
    /// Where the job goes next.
    public var disposition: Disposition
    /// The HTTP status, or `nil` for a transport failure or a job never sent.
    public var status: Int?
    /// APNs' reason, the transport error (`Timeout`, …) or a pre-send verdict (`Expired`, …).
    public var reason: String?
    /// The trap ids this attempt met, merged into the job's `trap_ids` in first-seen order.
    public var trapIDs: [String]
    /// APNs' `apns-unique-id` header, where given.
    public var apnsUniqueID: String?
    /// How long the request took, if one was made.
    public var latencyMs: Int?
    /// When the attempt was made (or judged, if no request was made).
    public var attemptedAt: Date
    /// Whether a request reached the network; `false` for pre-send rejections.
    public var sent: Bool
    /// Whether the token must be recorded in `push.invalid_tokens` (dead letters only).
    public var invalidatesToken: Bool
    /// APNs' 410 `timestamp` in milliseconds since the epoch, stored exactly.
    public var apnsTimestampMs: Int64?

    /// Creates an outcome; only the job, attempt and disposition are required.
    public init(
        jobID: Int64, attempt: Int, disposition: Disposition, status: Int? = nil, reason: String? = nil,
        trapIDs: [String] = [], apnsUniqueID: String? = nil, latencyMs: Int? = nil, attemptedAt: Date = Date(),
        sent: Bool = true, invalidatesToken: Bool = false, apnsTimestampMs: Int64? = nil
    ) {
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
public struct RecordResult: Sendable, Hashable {
    /// Jobs whose outcome was written.
    public var recorded: [Int64]
    /// Jobs whose write was refused by the fence: the attempt is no longer this worker's (lease lost,
    /// reclaimed, released). Their newer state stands.
    public var fenced: [Int64]
}
