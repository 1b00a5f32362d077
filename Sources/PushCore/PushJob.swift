public import Foundation

/// A rate limit's id and its interval in seconds (``PushJob/sendSpacing``).
public struct SendSpacing: Sendable, Hashable {
    public var scope: Int64
    public var interval: Double

    public init(scope: Int64, interval: Double) {
        self.scope = scope
        self.interval = interval
    }
}

/// One push job as a producer enqueued it, plus the worker-maintained fields a send needs.
///
/// This is the value that travels from the queue to the transport. It carries no secrets: the device
/// token is in it, so never log it whole; use ``tokenFingerprint``.
public struct PushJob: Sendable, Hashable {
    /// The job's row id in `push.jobs`.
    public var id: Int64
    /// The request's `apns-id`, the same on every attempt.
    public var apnsID: UUID
    /// The app's bundle id, bare (no push-type suffix).
    public var topic: String
    /// Hex device, push-to-start or per-activity token; `nil` for a broadcast.
    public var deviceToken: String?
    /// iOS 18 broadcast channel id (base64); `nil` for a device send.
    public var channelID: String?
    /// The complete APNs JSON body.
    public var payload: String
    /// Apple's `apns-push-type` as the producer wrote it.
    public var pushType: String
    /// The producer's priority, or `nil` for the push type's default.
    public var priority: Int?
    /// `production` or `development`.
    public var environment: String
    /// Which configured signing key sends it.
    public var credential: String
    /// `apns-collapse-id`, if any.
    public var collapseID: String?
    /// Send `apns-expiration: 0`: one delivery attempt, nothing stored for an offline device.
    public var deliverOnce: Bool
    /// Not sent after this instant; `nil` for the worker's default.
    public var expiresAt: Date?
    /// Not before this instant.
    public var runAt: Date
    /// The producer's narrowing of the retry budget, if any.
    public var maxAttempts: Int?
    /// Attempts made so far, counting the one now in progress for a claimed job.
    public var attempts: Int
    /// Every distinct trap id met so far, first seen first.
    public var trapIDs: [TrapID]
    /// When the producer inserted it.
    public var createdAt: Date
    /// When the first request was sent (`nil` until one was): the default expiry counts from here.
    public var firstAttemptAt: Date?
    /// Unknown outcomes so far (connection lost mid-request, stream reset, deadline): the transport budget.
    public var transportRetries: Int
    /// The database's clock when the job was claimed: every expiry check compares queue times with
    /// this clock, never the worker's own.
    public var claimedAt: Date?
    /// The worker's monotonic instant of ``claimedAt`` (the middle of the claim's round trip): a database time
    /// of the job maps to the worker's clock from here, not from when its request was written (which a busy
    /// worker or a rate limit may delay by seconds).
    public var claimedLocally: ContinuousClock.Instant?
    /// The producer's `coalesce_key`: of the due pending jobs sharing it, only the newest is sent.
    public var coalesceKey: String?
    /// When `push.invalid_tokens` says the device token died, if that was after this job was enqueued (set
    /// by the claim): the job is never sent.
    public var tokenInvalidatedAt: Date?
    /// For a rate-limited job, the send time the claim gave it from the limit's fleet-wide schedule (on the
    /// database's clock): the worker sends it no earlier.
    public var sendAt: Date?
    /// The rate limit that gave ``sendAt`` (its `push.rate_limits` id) and its interval in seconds: a worker
    /// whose sends of one limit wake late (a busy machine) spaces them again instead of sending them at once.
    public var sendSpacing: SendSpacing?
    /// Which provider sends it (`apns` unless the producer set `platform`).
    public var platform: Platform
    /// The producer's W3C `traceparent` (schema 12), if any: each attempt is a span in that trace.
    public var traceparent: String?
    /// The span id of this job's first attempt whose outcome was written (traced jobs only): a retry's span
    /// links to it.
    public var traceFirstSpan: String?
    /// When its last request was written (`nil` before the first): a retry's 5xx is the job's own failure only
    /// if a request written after that was answered ("Provider outages burn nothing").
    public var lastAttemptAt: Date?
    /// How its last attempt that did not deliver ended, as its history says (`retry`, `requeue`, …; `nil`
    /// before any): a job sent back uncounted while its provider may have been down is not doubted twice.
    public var lastOutcome: String?
    /// The person or account a job without a token goes to: it fans out to the recipient's live devices
    /// (`push.devices`) when claimed, one child job per token, and is never sent itself.
    public var recipient: String?
    /// The producer did not know the build (`environment = 'auto'`): production first, then once to
    /// development on BadDeviceToken (``DecidedOutcome/repairingEnvironment(of:)``).
    public var autoEnvironment: Bool
    /// The Live Activity (`push.activities`, with `topic`) an event job belongs to: routed when claimed to the
    /// activity's tokens or channel as child jobs (``ActivityRouting``), never sent itself.
    public var activityID: String?

    /// Whether the job is never sent itself: a recipient's (fanned out) or a Live Activity's event (routed).
    public var isParent: Bool { self.recipient != nil || self.activityID != nil }

    /// Creates a job value; every field is as stored in `push.jobs`.
    public init(
        id: Int64,
        apnsID: UUID,
        topic: String,
        deviceToken: String? = nil,
        channelID: String? = nil,
        payload: String,
        pushType: String = "alert",
        priority: Int? = nil,
        environment: String = "production",
        credential: String = "default",
        collapseID: String? = nil,
        deliverOnce: Bool = false,
        expiresAt: Date? = nil,
        runAt: Date,
        maxAttempts: Int? = nil,
        attempts: Int = 0,
        trapIDs: [TrapID] = [],
        createdAt: Date,
        firstAttemptAt: Date? = nil,
        transportRetries: Int = 0,
        claimedAt: Date? = nil,
        coalesceKey: String? = nil,
        tokenInvalidatedAt: Date? = nil,
        platform: Platform = .apns,
        traceparent: String? = nil,
        traceFirstSpan: String? = nil,
        lastAttemptAt: Date? = nil,
        lastOutcome: String? = nil,
        recipient: String? = nil,
        autoEnvironment: Bool = false,
        activityID: String? = nil
    ) {
        self.autoEnvironment = autoEnvironment
        self.activityID = activityID
        self.lastOutcome = lastOutcome
        self.recipient = recipient
        self.traceFirstSpan = traceFirstSpan
        self.lastAttemptAt = lastAttemptAt
        self.platform = platform
        self.traceparent = traceparent
        self.transportRetries = transportRetries
        self.claimedAt = claimedAt
        self.coalesceKey = coalesceKey
        self.tokenInvalidatedAt = tokenInvalidatedAt
        self.id = id
        self.apnsID = apnsID
        self.topic = topic
        self.deviceToken = deviceToken
        self.channelID = channelID
        self.payload = payload
        self.pushType = pushType
        self.priority = priority
        self.environment = environment
        self.credential = credential
        self.collapseID = collapseID
        self.deliverOnce = deliverOnce
        self.expiresAt = expiresAt
        self.runAt = runAt
        self.maxAttempts = maxAttempts
        self.attempts = attempts
        self.trapIDs = trapIDs
        self.createdAt = createdAt
        self.firstAttemptAt = firstAttemptAt
    }
}

extension PushJob {
    /// The priority the send carries: the job's own, or Apple's default for its push type (10 for a
    /// type this build does not know). The one place this is worked out in Swift; SQL's
    /// `send_priority` column states the same rule for the claim's order.
    public var sendPriority: Int {
        self.priority ?? PushType(rawValue: self.pushType)?.defaultPriority ?? 10
    }
}
