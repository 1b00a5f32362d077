/// What an APNs answer means for the job (APNS.md, "Responses: what each means for a job").
public enum APNsResponseClass: String, Sendable, Hashable, CaseIterable {
    /// 200: the job is delivered.
    case delivered
    /// The token is dead: dead-letter now and record it in `push.invalid_tokens`.
    case tokenInvalid
    /// Try again later with backoff (429, 5xx, IdleTimeout, transport failures).
    case retryable
    /// Fix the credential (new JWT, new connection) and retry.
    case credentialRetry
    /// The credential is wrong: no job of it can succeed until an operator fixes the configuration.
    case credentialFatal
    /// This job can never succeed: dead-letter now.
    case permanent
    /// A reason this build does not know: retry with the normal budget, log the raw reason.
    case unknown
}

/// An APNs status and reason with its class and trap id.
public struct APNsVerdict: Sendable, Hashable {
    /// What it means for the job.
    public var responseClass: APNsResponseClass
    /// The trap id met, if any.
    public var trapID: TrapID?

    /// Classifies an HTTP status and `reason` (or a transport failure: `status` nil).
    public static func classify(status: Int?, reason: String?) -> APNsVerdict {
        guard let status else { return APNsVerdict(responseClass: .retryable, trapID: nil) }
        if status == 200 { return APNsVerdict(responseClass: .delivered, trapID: nil) }
        let reason = reason ?? ""
        switch (status, reason) {
        case (410, "Unregistered"), (410, "ExpiredToken"):
            return APNsVerdict(responseClass: .tokenInvalid, trapID: .tokenUnregistered)
        case (400, "BadDeviceToken"):
            return APNsVerdict(responseClass: .tokenInvalid, trapID: .tokenEnvironment)
        case (400, "DeviceTokenNotForTopic"):
            return APNsVerdict(responseClass: .tokenInvalid, trapID: nil)
        case (429, "TooManyProviderTokenUpdates"):
            return APNsVerdict(responseClass: .credentialFatal, trapID: .providerToken)
        case (429, _):
            return APNsVerdict(responseClass: .retryable, trapID: .priorityBudget)
        case (400, "IdleTimeout"):
            return APNsVerdict(responseClass: .retryable, trapID: nil)
        case (500..., _):
            return APNsVerdict(responseClass: .retryable, trapID: nil)
        case (403, "ExpiredProviderToken"), (403, "UnrelatedKeyIdInToken"):
            return APNsVerdict(responseClass: .credentialRetry, trapID: .providerToken)
        case (403, "InvalidProviderToken"), (403, "MissingProviderToken"), (403, "Forbidden"):
            return APNsVerdict(responseClass: .credentialFatal, trapID: .providerToken)
        case (403, "BadEnvironmentKeyIdInToken"), (403, "BadCertificate"), (403, "BadCertificateEnvironment"):
            return APNsVerdict(responseClass: .credentialFatal, trapID: nil)
        case (400, "TopicDisallowed"):
            return APNsVerdict(responseClass: .credentialFatal, trapID: .topicSuffix)
        case (_, "BadExpirationDate"):
            return APNsVerdict(responseClass: .permanent, trapID: .timestamps)
        case (_, "MissingTopic"):
            return APNsVerdict(responseClass: .permanent, trapID: .topicMissing)
        case (413, _), (_, "PayloadTooLarge"):
            return APNsVerdict(responseClass: .permanent, trapID: .payloadTooLarge)
        case (_, "MissingChannelId"), (_, "BadChannelId"), (_, "ChannelNotRegistered"):
            return APNsVerdict(responseClass: .permanent, trapID: .channel)
        case (_, "FeatureNotEnabled"):
            return APNsVerdict(responseClass: .permanent, trapID: .broadcastNotEnabled)
        case (_, let known) where Self.permanentReasons.contains(known):
            return APNsVerdict(responseClass: .permanent, trapID: nil)
        default:
            return APNsVerdict(responseClass: .unknown, trapID: nil)
        }
    }

    /// Every other 4xx reason APNs documents: the job can never succeed as it is.
    public static let permanentReasons: Set<String> = [
        "BadCollapseId", "BadExpirationDate", "BadMessageId", "BadPriority", "BadTopic", "DuplicateHeaders",
        "InvalidPushType", "MissingDeviceToken", "MissingTopic", "PayloadEmpty", "BadPath", "MethodNotAllowed",
        "PayloadTooLarge", "MissingChannelId", "BadChannelId", "ChannelNotRegistered", "FeatureNotEnabled",
    ]
}
