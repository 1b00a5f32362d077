/// FCM's answers (CONTRACT.md 1b) in one table: each error code with its class, trap id, dead-letter
/// sentence and what it does to the connection. The one place an FCM answer is interpreted; the same
/// ``Decision/decide(_:attempt:transportRetries:policy:transportBudget:using:)`` reads it as it reads
/// ``APNsReason``.
public enum FCMReason {
    /// What an FCM error code means.
    public struct Row: Sendable {
        /// What it means for the job.
        public var responseClass: APNsResponseClass
        /// The trap id it meets, if any.
        public var trapID: TrapID?
        /// The dead letter's sentence when it ends a job (`%@` is the code); `nil` for the generic one.
        public var sentence: String?
        /// What the transport does about it on the connection, once per request, before the job sees it.
        public var connection: ConnectionEffect = .none
        /// FCM did not process the request and the whole credential (one Firebase project) waits
        /// `Retry-After`: the job goes back uncounted.
        public var waitsCredential = false
    }

    /// How long the credential waits after the project's quota is spent, without a `Retry-After`.
    public static let quotaWait: Duration = .seconds(60)

    /// How long a job whose target (a device, a topic) is over its rate waits before its `attempt`-th retry,
    /// without a `Retry-After`: 10 s doubling, at most 10 minutes.
    public static func targetQuotaWait(attempt: Int) -> Duration {
        min(.seconds(10) * (1 << min(max(attempt - 1, 0), 6)), .seconds(600))
    }

    /// The project's quota is spent: FCM did not process the request, and the whole credential waits.
    public static let projectQuota = Row(responseClass: .retryable, trapID: .fcmQuota, waitsCredential: true)

    /// The table, by error code (FcmError's `errorCode`, or the error's `status` when it has none).
    public static let table: [String: Row] = {
        let credential =
            "FCM refused the service account (%@, FC030): check the key file belongs to the Firebase project, the account has the Firebase Cloud Messaging API Admin role and the API is enabled."
        return [
            "UNREGISTERED": Row(
                responseClass: .tokenInvalid,
                trapID: .fcmTokenUnregistered,
                sentence:
                    "FCM says the registration token is no longer valid (%@, FC010): stop sending to it; the app gets a new one from FirebaseMessaging."
            ),
            "SENDER_ID_MISMATCH": Row(
                responseClass: .permanent,
                trapID: .fcmSenderMismatch,
                sentence:
                    "FCM says the token belongs to another Firebase project (SENDER_ID_MISMATCH, FC011): check the job's credential names the service account of the app's project."
            ),
            "INVALID_ARGUMENT": Row(
                responseClass: .permanent,
                trapID: .fcmInvalidArgument,
                sentence:
                    "FCM refused the message as written (INVALID_ARGUMENT, FC040): fix the payload's fields (see FCM's message in the history) and replay."
            ),
            // About the message's target (a device or a topic over its rate) unless shown otherwise
            // (``projectQuota``): that job alone waits.
            "QUOTA_EXCEEDED": Row(
                responseClass: .retryable,
                trapID: .fcmQuota,
                sentence:
                    "FCM kept refusing this message's target as over its rate (%@, FC020: a device takes at most 240 messages a minute, 5,000 an hour): send it fewer messages (a coalesce_key keeps only the latest of a kind), then replay."
            ),
            // Google Cloud's own quota of the project (a 429 without FCM's error code).
            "RESOURCE_EXHAUSTED": Self.projectQuota,
            "UNAVAILABLE": Row(responseClass: .retryable),
            "INTERNAL": Row(responseClass: .retryable),
            "UNAUTHENTICATED": Row(
                responseClass: .credentialFatal,
                trapID: .fcmCredential,
                sentence: credential,
                connection: .reMintToken
            ),
            // The token is an iOS (or web) client's and Firebase lacks its APNs (web push) key: that job only.
            "THIRD_PARTY_AUTH_ERROR": Row(
                responseClass: .permanent,
                trapID: .fcmThirdPartyAuth,
                sentence:
                    "FCM could not pass this message on to Apple: the token belongs to an iOS (or web) app of the Firebase project, and Firebase has no valid APNs auth key (or web push key) for it (THIRD_PARTY_AUTH_ERROR, FC031). Upload the APNs key in the Firebase console (Project settings, Cloud Messaging) and replay, or send to this device through APNs (platform = 'apns')."
            ),
            "PERMISSION_DENIED": Row(responseClass: .credentialFatal, trapID: .fcmCredential, sentence: credential),
            "NOT_FOUND": Row(
                responseClass: .credentialFatal,
                trapID: .fcmCredential,
                sentence:
                    "FCM does not know the project (NOT_FOUND, FC030): check project_id in the service account's key file."
            ),
        ]
    }()

    /// The row for an answer: by code, then by status (a 401 without a code is UNAUTHENTICATED, a 429 the
    /// project's quota, a 5xx UNAVAILABLE); `nil` for one this build does not know. An `INVALID_ARGUMENT` that
    /// names the token is the `UNREGISTERED` row; a `QUOTA_EXCEEDED` that names the project is ``projectQuota``.
    public static func row(status: Int, code: String?, namesToken: Bool, projectQuota: Bool = false) -> Row? {
        if code == "INVALID_ARGUMENT" && namesToken { return Self.table["UNREGISTERED"] }
        if code == "QUOTA_EXCEEDED" && projectQuota && status < 500 { return Self.projectQuota }
        if let code, let row = Self.table[code] {
            // A 5xx is the server's fault whatever its code.
            return status >= 500 ? Self.table["UNAVAILABLE"] : row
        }
        switch status {
        case 401: return Self.table["UNAUTHENTICATED"]
        case 429: return Self.projectQuota
        case 500...: return Self.table["UNAVAILABLE"]
        default: return nil
        }
    }

    /// The class and trap id of an answer (200 delivered; unknown 4xx `.unknown`).
    public static func classify(status: Int, code: String?, namesToken: Bool) -> APNsVerdict {
        if status == 200 { return APNsVerdict(responseClass: .delivered, trapID: nil) }
        guard let row = Self.row(status: status, code: code, namesToken: namesToken) else {
            return APNsVerdict(responseClass: .unknown, trapID: nil)
        }
        return APNsVerdict(responseClass: row.responseClass, trapID: row.trapID)
    }

    /// What the transport does on the connection about an answer.
    public static func connectionEffect(status: Int, code: String?) -> ConnectionEffect {
        guard status != 200 else { return .none }
        return Self.row(status: status, code: code, namesToken: false)?.connection ?? .none
    }

    /// The dead letter's sentence for an answer that ended the job, naming what to fix.
    public static func sentence(status: Int, code: String?, namesToken: Bool) -> String {
        let text = code ?? "HTTP \(status)"
        if let template = Self.row(status: status, code: code, namesToken: namesToken)?.sentence {
            if let range = template.range(of: "%@") { return template.replacingCharacters(in: range, with: text) }
            return template
        }
        return
            "FCM answered \(status) \(text): this job cannot succeed as it is; fix the job's columns and replay it."
    }
}
