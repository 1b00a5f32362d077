/// The sentence a dead letter carries: what APNs (or the worker) said and what to fix. Never names the
/// token or the payload. Per-reason sentences live in ``APNsReason/table``.
public enum DeadLetterSentence {
    /// The sentence for an APNs answer or transport failure that ended the job.
    ///
    /// - Parameter limit: what capped the attempts (``RetryPolicy/limit``), named in an exhausted job's sentence.
    public static func sentence(
        status: Int?,
        reason: String?,
        attempts: Int,
        exhausted: Bool,
        limit: String? = nil,
        provider: String = "APNs"
    ) -> String {
        if exhausted {
            let reason = reason ?? "no reason"
            let what = status.map { "\($0) \(reason)" } ?? reason
            let cap = limit.map { " (the limit: \($0))" } ?? ""
            return
                "gave up after \(attempts) attempt\(attempts == 1 ? "" : "s")\(cap); the last ended in \(what). Check \(provider) status and the worker's connectivity, then replay if it is still worth sending."
        }
        return APNsReason(reason ?? "no reason").sentence(status: status)
    }
}
