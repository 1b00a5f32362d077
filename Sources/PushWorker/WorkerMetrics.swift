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

    /// One attempt's outcome: `push_sends_total{status,reason,trap}` (attempts that reached APNs),
    /// `push_rejected_before_send_total{reason,trap}`, `push_outcomes_total{outcome}`, `push_retries_total`,
    /// `push_dead_letters_total{reason,trap}` (the final attempt's reason and trap id of each job moved to
    /// the dead-letter table), and the attempt latency.
    func record(_ outcome: JobOutcome) {
        let kind: String
        switch outcome.disposition {
        case .delivered: kind = "delivered"
        case .retry: kind = "retry"
        case .dead: kind = "dead"
        case .requeue: kind = "requeued"
        }
        Counter(label: "push_outcomes_total", dimensions: [("outcome", kind)]).increment()
        if outcome.sent {
            Counter(label: "push_sends_total", dimensions: [
                ("status", outcome.status.map(String.init) ?? "none"),
                ("reason", outcome.reason ?? "none"),
                ("trap", outcome.trapIDs.first ?? "none"),
            ]).increment()
        } else {
            Counter(label: "push_rejected_before_send_total", dimensions: [("reason", outcome.reason ?? "none"), ("trap", outcome.trapIDs.first ?? "none")]).increment()
        }
        switch outcome.disposition {
        case .retry: Counter(label: "push_retries_total").increment()
        case .dead: Counter(label: "push_dead_letters_total", dimensions: [("reason", outcome.reason ?? "none"), ("trap", outcome.trapIDs.first ?? "none")]).increment()
        case .delivered, .requeue: break
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
