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
    /// The credential may not send to this topic (TopicDisallowed): hold the credential's jobs of this
    /// topic; its other topics keep sending.
    case topicFatal
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

    /// Classifies an HTTP status and `reason` (or a transport failure: `status` nil) by
    /// ``APNsReason/table``; a reason the table does not know is classed by its status (429 and 5xx
    /// retryable, 413 too large) or as unknown.
    public static func classify(status: Int?, reason: String?) -> APNsVerdict {
        guard let status else { return APNsVerdict(responseClass: .retryable, trapID: nil) }
        if status == 200 { return APNsVerdict(responseClass: .delivered, trapID: nil) }
        let known = APNsReason(reason ?? "")
        // A 429 is the throttle whatever its reason, except the credential's own.
        if status == 429, known != .tooManyProviderTokenUpdates {
            return APNsVerdict(responseClass: .retryable, trapID: .priorityBudget)
        }
        // A 5xx is the server's fault whatever its reason.
        if status >= 500 { return APNsVerdict(responseClass: .retryable, trapID: nil) }
        if let row = known.row { return APNsVerdict(responseClass: row.responseClass, trapID: row.trapID) }
        if status == 413 { return APNsVerdict(responseClass: .permanent, trapID: .payloadTooLarge) }
        return APNsVerdict(responseClass: .unknown, trapID: nil)
    }

    /// Every other 4xx reason APNs documents: the job can never succeed as it is.
    public static let permanentReasons: Set<String> = Set(
        APNsReason.table.filter { $0.row.responseClass == .permanent }.map(\.text)
    )
}
