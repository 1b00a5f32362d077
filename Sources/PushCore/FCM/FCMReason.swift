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

    /// How long the credential waits after `QUOTA_EXCEEDED` without a `Retry-After`.
    public static let quotaWait: Duration = .seconds(60)

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
            "QUOTA_EXCEEDED": Row(responseClass: .retryable, trapID: .fcmQuota, waitsCredential: true),
            "UNAVAILABLE": Row(responseClass: .retryable),
            "INTERNAL": Row(responseClass: .retryable),
            "UNAUTHENTICATED": Row(
                responseClass: .credentialFatal,
                trapID: .fcmCredential,
                sentence: credential,
                connection: .reMintToken
            ),
            "THIRD_PARTY_AUTH_ERROR": Row(
                responseClass: .credentialFatal,
                trapID: .fcmCredential,
                sentence: credential
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

    /// The row for an answer: by code, then by status (a 401 without a code is UNAUTHENTICATED, a 429
    /// QUOTA_EXCEEDED, a 5xx UNAVAILABLE); `nil` for one this build does not know. An `INVALID_ARGUMENT` that
    /// names the token is the `UNREGISTERED` row.
    public static func row(status: Int, code: String?, namesToken: Bool) -> Row? {
        if code == "INVALID_ARGUMENT" && namesToken { return Self.table["UNREGISTERED"] }
        if let code, let row = Self.table[code] {
            // A 5xx is the server's fault whatever its code.
            return status >= 500 ? Self.table["UNAVAILABLE"] : row
        }
        switch status {
        case 401: return Self.table["UNAUTHENTICATED"]
        case 429: return Self.table["QUOTA_EXCEEDED"]
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
