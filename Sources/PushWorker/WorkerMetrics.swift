import Metrics
import PushCore
import PushQueue

/// The worker's metrics, through swift-metrics (the daemon bootstraps Prometheus). Labels are static;
/// dimensions are low-cardinality: HTTP status, APNs reason, trap id, outcome.
struct WorkerMetrics: Sendable {
    let attemptLatency = Metrics.Timer(label: "push_attempt_latency_seconds", preferredDisplayUnit: .seconds)
    let queueDepthPending = Gauge(label: "push_queue_depth", dimensions: [("state", "pending")])
    let queueDepthRunning = Gauge(label: "push_queue_depth", dimensions: [("state", "running")])
    let oldestPendingAge = Gauge(label: "push_oldest_pending_age_seconds")
    let deadLetters = Gauge(label: "push_dead_letters")
    let connections = Gauge(label: "push_apns_connections")
    let jwtMints = Gauge(label: "push_jwt_mints")
    let pausedCredentials = Gauge(label: "push_paused_credentials")
    /// 1 while ``PushWorkerService/isReady``, 0 otherwise: `sum(push_worker_ready) == 0` means no worker
    /// is taking jobs.
    let ready = Gauge(label: "push_worker_ready")

    /// Outcome writes Postgres refused or could not take (each try counts): `push_outcome_write_failures_total`.
    let outcomeWriteFailures = Counter(label: "push_outcome_write_failures_total")
    /// Outcomes waiting to be written: `push_outcome_backlog`.
    let outcomeBacklog = Gauge(label: "push_outcome_backlog")
    /// Outcomes the fence refused (another worker re-claimed the job): `push_fenced_outcomes_total`.
    let fencedOutcomes = Counter(label: "push_fenced_outcomes_total")
    /// Jobs returned to pending because their worker was gone: `push_leases_reclaimed_total`.
    let leasesReclaimed = Counter(label: "push_leases_reclaimed_total")
    /// Requests APNs certainly did not process (resent, or given back uncounted): `push_requests_not_processed_total`.
    let requestsNotProcessed = Counter(label: "push_requests_not_processed_total")
    /// Outcomes written as dead letters by the last resort: `push_outcomes_unwritable_total`.
    let unwritableOutcomes = Counter(label: "push_outcomes_unwritable_total")
    private let outcomes: [String: Counter] = Dictionary(
        uniqueKeysWithValues: ["delivered", "retry", "requeue", "transport_retry", "dead"].map {
            ($0, Counter(label: "push_outcomes_total", dimensions: [("outcome", $0)]))
        }
    )
    private let retries = Counter(label: "push_retries_total")

    /// One attempt's outcome: `push_sends_total{status,reason,trap}` (attempts that reached APNs),
    /// `push_rejected_before_send_total{reason,trap}`, `push_outcomes_total{outcome}` (outcome is the
    /// decision's one name: delivered, retry, requeue, transport_retry, dead), `push_retries_total`,
    /// `push_dead_letters_total{reason,trap}`, and the attempt latency.
    func record(_ outcome: JobOutcome) {
        self.outcomes[outcome.disposition.name]?.increment()
        if outcome.sent {
            Counter(
                label: "push_sends_total",
                dimensions: [
                    ("status", outcome.status.map(String.init) ?? "none"),
                    ("reason", outcome.reason ?? "none"),
                    ("trap", outcome.trapIDs.first ?? "none"),
                ]
            ).increment()
        } else if case .dead = outcome.disposition {
            Counter(
                label: "push_rejected_before_send_total",
                dimensions: [("reason", outcome.reason ?? "none"), ("trap", outcome.trapIDs.first ?? "none")]
            ).increment()
        }
        switch outcome.disposition {
        case .retry: self.retries.increment()
        case .dead:
            Counter(
                label: "push_dead_letters_total",
                dimensions: [("reason", outcome.reason ?? "none"), ("trap", outcome.trapIDs.first ?? "none")]
            ).increment()
        case .delivered, .requeue, .transportRetry: break
        }
        if let latency = outcome.latencyMs { self.attemptLatency.recordMilliseconds(latency) }
    }

    /// Queue gauges from a stats snapshot.
    func record(_ stats: QueueStats) {
        self.queueDepthPending.record(stats.byState["pending"] ?? 0)
        self.queueDepthRunning.record(stats.byState["running"] ?? 0)
        self.oldestPendingAge.record(stats.oldestPendingAgeSeconds)
        self.deadLetters.record(stats.deadLetters)
    }
}
