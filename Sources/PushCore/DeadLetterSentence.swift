/// The sentence a dead letter carries: what APNs (or the worker) said and what to fix. Never names the
/// token or the payload. Per-reason sentences live in ``APNsReason/table``.
public enum DeadLetterSentence {
    /// The sentence for an APNs answer or transport failure that ended the job.
    public static func sentence(status: Int?, reason: String?, attempts: Int, exhausted: Bool) -> String {
        if exhausted {
            let reason = reason ?? "no reason"
            let what = status.map { "\($0) \(reason)" } ?? reason
            return
                "gave up after \(attempts) attempt\(attempts == 1 ? "" : "s"); the last ended in \(what). Check APNs status and the worker's connectivity, then replay if it is still worth sending."
        }
        return APNsReason(reason ?? "no reason").sentence(status: status)
    }
}
