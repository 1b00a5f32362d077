/// Where a job is in its life, as stored in `push.jobs.state` (dead letters live in `push.dead_jobs`).
public enum JobState: String, Sendable, Hashable, CaseIterable, Codable {
    /// Waiting for `run_at`, or for a worker.
    case pending
    /// Claimed by a worker that holds its lease.
    case running
    /// APNs answered 200.
    case delivered
    /// Never sent: a newer due job with the same `coalesce_key` replaced it (`superseded_by` names it).
    case superseded
    /// Never sent: an operator cancelled it (`push-worker jobs cancel`).
    case cancelled
    /// A recipient's job, never sent itself: it became one child job per live device (`children`).
    case fannedOut = "fanned_out"
}
