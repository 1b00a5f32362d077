/// A Mobile Surfaces trap id: the name of a known APNs mistake, as recorded in `push.jobs.trap_ids`.
public struct TrapID: RawRepresentable, Sendable, Hashable, Codable, CustomStringConvertible {
    /// The wire form, e.g. `MS015`.
    public var rawValue: String

    /// Wraps a trap id as stored.
    public init(rawValue: String) { self.rawValue = rawValue }

    public var description: String { self.rawValue }

    /// Payload size ceiling (4 KB, 5 KB for VoIP and broadcast).
    public static let payloadTooLarge = TrapID(rawValue: "MS011")
    /// The token's environment must match the build's (BadDeviceToken).
    public static let tokenEnvironment = TrapID(rawValue: "MS014")
    /// Priority 5 vs 10 budget rules (429 TooManyRequests).
    public static let priorityBudget = TrapID(rawValue: "MS015")
    /// The bundle id must not carry the push-type suffix.
    public static let topicSuffix = TrapID(rawValue: "MS018")
    /// Tokens rotate: drop a token after 410.
    public static let tokenUnregistered = TrapID(rawValue: "MS020")
    /// APNs credentials must be configured before sending.
    public static let credentialsMissing = TrapID(rawValue: "MS028")
    /// The provider token must be valid and current.
    public static let providerToken = TrapID(rawValue: "MS030")
    /// Channel id missing, malformed or unregistered.
    public static let channel = TrapID(rawValue: "MS031")
    /// Timestamps must be unix-seconds integers.
    public static let timestamps = TrapID(rawValue: "MS032")
    /// The broadcast capability must be enabled on the key.
    public static let broadcastNotEnabled = TrapID(rawValue: "MS034")
    /// apns-topic missing.
    public static let topicMissing = TrapID(rawValue: "MS035")

    /// PushWorker's own warnings (APNs accepts the request; the device ignores or clamps the field). They are
    /// recorded in `trap_ids` like traps, but the job is still sent.
    ///
    /// `mutable-content: 1` with no visible alert: the notification service extension never runs.
    public static let mutableContentWithoutAlert = TrapID(rawValue: "PW101")
    /// `interruption-level` outside passive, active, time-sensitive, critical: the device uses `active`.
    public static let interruptionLevel = TrapID(rawValue: "PW102")
    /// `relevance-score` outside 0–1 on a notification other than a Live Activity: the device clamps it.
    public static let relevanceScore = TrapID(rawValue: "PW103")

    /// A background push (`content-available`) that carries `alert`, `sound` or `badge`: iOS drops or
    /// throttles it.
    public static let backgroundWithAlert = TrapID(rawValue: "PW104")
    /// A Live Activity `start` without `alert`: the activity starts but is not shown on the lock screen.
    public static let liveActivityStartWithoutAlert = TrapID(rawValue: "PW105")
    /// A Live Activity `timestamp` more than 8 hours ahead: iOS drops the update.
    public static let liveActivityTimestampAhead = TrapID(rawValue: "PW106")
    /// A critical alert's `sound` dictionary outside Apple's shape (`critical` 0 or 1, `volume` 0–1, `name`).
    public static let criticalSound = TrapID(rawValue: "PW107")

    /// FCM's traps (CONTRACT.md 1b), `FC` + number, each with a runbook entry.
    ///
    /// The payload is not an FCM message's fields without its target, or sets a field the worker sets.
    public static let fcmPayload = TrapID(rawValue: "FC001")
    /// FCM takes `data` values as strings only.
    public static let fcmDataStrings = TrapID(rawValue: "FC002")
    /// FCM's 4,096-byte payload ceiling.
    public static let fcmPayloadTooLarge = TrapID(rawValue: "FC003")
    /// The registration token is dead (UNREGISTERED, or INVALID_ARGUMENT naming the token).
    public static let fcmTokenUnregistered = TrapID(rawValue: "FC010")
    /// The token belongs to another Firebase project (SENDER_ID_MISMATCH).
    public static let fcmSenderMismatch = TrapID(rawValue: "FC011")
    /// A sending quota is spent (QUOTA_EXCEEDED): the message's target's (a device, a topic), or the project's.
    public static let fcmQuota = TrapID(rawValue: "FC020")
    /// The service account or its access token is refused (401, PERMISSION_DENIED, NOT_FOUND for the project).
    public static let fcmCredential = TrapID(rawValue: "FC030")
    /// FCM has no APNs (or web push) key for the token's iOS (or web) app (THIRD_PARTY_AUTH_ERROR).
    public static let fcmThirdPartyAuth = TrapID(rawValue: "FC031")
    /// FCM refused the message as written (INVALID_ARGUMENT not about the token).
    public static let fcmInvalidArgument = TrapID(rawValue: "FC040")

    /// The FCM trap ids, in catalog order.
    public static let fcm: [TrapID] = [
        .fcmPayload, .fcmDataStrings, .fcmPayloadTooLarge, .fcmTokenUnregistered, .fcmSenderMismatch, .fcmQuota,
        .fcmCredential, .fcmThirdPartyAuth, .fcmInvalidArgument,
    ]

    /// The warning codes, in order.
    public static let warnings: [TrapID] = [
        .mutableContentWithoutAlert, .interruptionLevel, .relevanceScore, .backgroundWithAlert,
        .liveActivityStartWithoutAlert, .liveActivityTimestampAhead, .criticalSound,
    ]

    /// Every trap id in the catalog, in catalog order.
    public static let all: [TrapID] = [
        .payloadTooLarge, .tokenEnvironment, .priorityBudget, .topicSuffix, .tokenUnregistered,
        .credentialsMissing, .providerToken, .channel, .timestamps, .broadcastNotEnabled, .topicMissing,
    ]
}
