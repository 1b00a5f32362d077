/// What one send of a job came to, before any decision: APNs' answer, a transport fault, or a refusal
/// before any network call. The input of ``Decision/decide(_:attempt:transportRetries:policy:transportBudget:)``.
public enum SendOutcome: Sendable, Hashable {
    /// APNs answered.
    case response(status: Int, reason: String?, retryAfter: Duration?)
    /// FCM answered: its error code (FcmError's `errorCode`, or the error's `status`), whether an
    /// `INVALID_ARGUMENT` names the registration token, `Retry-After`, and whether a `QUOTA_EXCEEDED` names the
    /// project's quota (not its target's).
    case fcm(status: Int, code: String?, namesToken: Bool, retryAfter: Duration?, projectQuota: Bool = false)
    /// No answer came back; the fault says whether APNs may have processed the request.
    case transport(TransportFault, reason: String)
    /// The worker refused the job before any network call (validation, expiry, attempts used up).
    case rejected(PreSendRejection)
}

/// A send that got no APNs answer, by what it means for the job (APNS.md, "not processed" and "unknown
/// outcome" rows).
public enum TransportFault: String, Sendable, Hashable, CaseIterable {
    /// APNs certainly did not process the request (above a GOAWAY's last stream id, REFUSED_STREAM, a
    /// stream never opened or never written) and no live connection could take it: back to `pending`,
    /// uncounted.
    case notProcessed
    /// APNs could not be reached at all (connect failed, backoff): back to `pending`, uncounted.
    case unreachable
    /// The request may have been processed (connection lost mid-request, RST_STREAM other than
    /// REFUSED_STREAM, deadline): retried with the same apns-id under the transport budget.
    case unknownOutcome
    /// No usable signing key for the job's credential (trap MS028): the credential is paused.
    case credentialMissing
    /// The worker stopped before the request was written (shutdown, lease lost): uncounted.
    case cancelled
    /// The provider's token endpoint refused the credential before anything was sent (FCM's service account,
    /// trap FC030): the credential is paused, the job goes back uncounted.
    case credentialRefused
}
