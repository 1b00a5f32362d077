/// Why a job was refused before any network call: the reason stored on the dead letter, its trap id, and
/// a sentence that says what to fix. The sentence never contains the token or the payload.
public struct PreSendRejection: Error, Sendable, Hashable, CustomStringConvertible {
    /// The reason stored on the job (`PayloadTooLarge`, `TopicHasPushTypeSuffix`, `Expired`, …).
    public var reason: String
    /// The trap id met, if the mistake has one.
    public var trapID: TrapID?
    /// What is wrong and what to fix.
    public var message: String

    /// Creates a rejection.
    public init(reason: String, trapID: TrapID?, message: String) {
        self.reason = reason
        self.trapID = trapID
        self.message = message
    }

    public var description: String { self.message }
}

extension PreSendRejection {
    /// A certificate credential whose certificate does not cover the job's environment (a development-only
    /// certificate and a production job, or the reverse): APNs would refuse it with BadCertificateEnvironment.
    /// Only this job is refused; the credential keeps sending the jobs its certificate covers.
    public static func certificateEnvironment(
        credential: String,
        environment: String,
        covered: [String]
    )
        -> PreSendRejection
    {
        PreSendRejection(
            reason: "BadCertificateEnvironment",
            trapID: .tokenEnvironment,
            message:
                "credential '\(credential)' is a certificate for \(covered.joined(separator: " and ")) only, and this job is for \(environment): send it with a certificate for \(environment) (or Apple's universal \"Apple Push Services\" certificate), then replay it."
        )
    }
}
