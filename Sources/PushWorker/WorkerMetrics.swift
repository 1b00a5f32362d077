import Foundation
import Metrics
import PushCore
import PushQueue
import Synchronization

/// The worker's metrics, through swift-metrics (the daemon bootstraps Prometheus). Labels are static;
/// dimensions are low-cardinality: HTTP status, APNs reason, trap id, outcome.
public struct WorkerMetrics: Sendable {
    let attemptLatency = Metrics.Timer(label: "push_attempt_latency_seconds", preferredDisplayUnit: .seconds)
    /// How long each answered claim took: `push_claim_duration_seconds` (buckets from 1 ms,
    /// ``claimDurationBuckets``). A claim's cost is bounded by its batch; a p99 growing with the number of
    /// topics or after an idle spell is a plan gone wrong.
    let claimDuration = Metrics.Timer(label: WorkerMetrics.claimDurationLabel, preferredDisplayUnit: .seconds)
    public static let claimDurationLabel = "push_claim_duration_seconds"
    /// The histogram's buckets: a claim takes milliseconds; the top buckets catch a statement deadline.
    public static let claimDurationBuckets: [Duration] = [
        .milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(20),
        .milliseconds(50), .milliseconds(100), .milliseconds(250), .seconds(1), .seconds(5), .seconds(30),
    ]
    /// The queue gauges, present only on the worker the fleet elected to count (see ``publish(_:)``).
    private let queueGauges = QueueGaugeSlot()
    let connections = Gauge(label: "push_apns_connections")
    let jwtMints = Gauge(label: "push_jwt_mints")
    let pausedCredentials = Gauge(label: "push_paused_credentials")
    /// Broadcast channels of Live Activities not yet deleted, by environment (Apple allows 10,000 an app).
    func activityChannels(environment: String, count: Int) {
        Gauge(label: "push_activity_channels", dimensions: [("environment", environment)]).record(count)
    }
    /// `push_provider_down{platform,scope}`: 1 while this worker takes an APNs environment or an FCM
    /// credential for down (``ProviderOutages``), 0 once it answers again; made on the first change.
    static func providerDown(platform: Platform, scope: String) -> Gauge {
        Gauge(label: "push_provider_down", dimensions: [("platform", platform.rawValue), ("scope", scope)])
    }
    /// 1 while ``PushWorkerService/isReady``, 0 otherwise: `sum(push_worker_ready) == 0` means no worker
    /// is taking jobs.
    let ready = Gauge(label: "push_worker_ready")
    /// Webhook POSTs by what became of them: `push_webhook_deliveries_total{outcome}` (delivered, failed:
    /// tried again later, gone: a 410 disabled the hook).
    let webhookTries: [WebhookTry.Kind: Counter] = [
        .delivered: Counter(label: "push_webhook_deliveries_total", dimensions: [("outcome", "delivered")]),
        .retry: Counter(label: "push_webhook_deliveries_total", dimensions: [("outcome", "failed")]),
        .gone: Counter(label: "push_webhook_deliveries_total", dimensions: [("outcome", "gone")]),
    ]
    /// Webhook deliveries given up on after 24 hours of failures: `push_webhook_dead_total`.
    let webhookDead = Counter(label: "push_webhook_dead_total")

    /// Outcome writes Postgres refused or could not take (each try counts): `push_outcome_write_failures_total`.
    let outcomeWriteFailures = Counter(label: "push_outcome_write_failures_total")
    /// Outcomes waiting to be written: `push_outcome_backlog`.
    let outcomeBacklog = Gauge(label: "push_outcome_backlog")
    /// Outcomes the fence refused (another worker re-claimed the job): `push_fenced_outcomes_total`.
    let fencedOutcomes = Counter(label: "push_fenced_outcomes_total")
    /// Fenced outcomes that were 200s: pushes delivered while another worker held the job, so likely sent
    /// twice: `push_fenced_deliveries_total`. Non-zero only when a worker was taken for gone too early.
    let fencedDeliveries = Counter(label: "push_fenced_deliveries_total")
    /// Jobs returned to pending because their worker was gone: `push_leases_reclaimed_total`.
    let leasesReclaimed = Counter(label: "push_leases_reclaimed_total")
    /// Requests APNs certainly did not process (resent, or given back uncounted): `push_requests_not_processed_total`.
    let requestsNotProcessed = Counter(label: "push_requests_not_processed_total")
    /// Outcomes written as dead letters by the last resort: `push_outcomes_unwritable_total`.
    let unwritableOutcomes = Counter(label: "push_outcomes_unwritable_total")
    private let outcomes: [String: Counter] = Dictionary(
        uniqueKeysWithValues: ["delivered", "retry", "requeue", "transport_retry", "dead", "superseded"].map {
            ($0, Counter(label: "push_outcomes_total", dimensions: [("outcome", $0)]))
        }
    )
    private let retries = Counter(label: "push_retries_total")
    /// Claims that found a rate limit's schedule full: `push_rate_limited_claims_total`.
    let rateLimitedClaims = Counter(label: "push_rate_limited_claims_total")
    /// Priority-10 Live Activity updates sent at priority 5 past their topic's hourly budget (trap MS015).
    func activityUpdatesDemoted(topic: String, count: Int) {
        Counter(label: "push_activity_updates_demoted_total", dimensions: [("topic", topic)]).increment(by: count)
    }
    /// Rate-limited requests withdrawn because they would have left too long after their slot:
    /// `push_late_limited_sends_total` (each is claimed again for a new slot).
    let lateLimitedSends = Counter(label: "push_late_limited_sends_total")

    func lateLimitedSend() { self.lateLimitedSends.increment() }

    /// What a claim did besides claiming: jobs superseded by a newer one with their `coalesce_key`
    /// (`push_outcomes_total{outcome="superseded"}`), and whether a rate limit held jobs back.
    func claimed(superseded: Int, rateLimited: Bool) {
        if superseded > 0 { self.outcomes["superseded"]?.increment(by: superseded) }
        if rateLimited { self.rateLimitedClaims.increment() }
    }
    private let labelled = LabelledCounters()
    /// `push_sends_total{platform,status="200",reason="none",trap="none"}`, made once per platform.
    private let plainDelivered = Dictionary(
        uniqueKeysWithValues: Platform.allCases.map {
            (
                $0,
                Counter(
                    label: "push_sends_total",
                    dimensions: [("platform", $0.rawValue), ("status", "200"), ("reason", "none"), ("trap", "none")]
                )
            )
        }
    )
    /// `push_credential_refusals_total{platform,reason}`: a provider refused a credential (its jobs are held),
    /// or asked it to wait (FCM's QUOTA_EXCEEDED).
    func credentialRefused(platform: Platform, reason: String) {
        self.labelled.counter(label: "push_credential_refusals_total", platform: platform, status: nil, reason, nil)
            .increment()
    }

    /// One attempt's outcome: `push_sends_total{platform,status,reason,trap}` (attempts that reached the
    /// provider), `push_rejected_before_send_total{platform,reason,trap}`, `push_outcomes_total{outcome}`
    /// (outcome is the decision's one name: delivered, retry, requeue, transport_retry, dead),
    /// `push_retries_total`, `push_dead_letters_total{platform,reason,trap}`, and the attempt latency.
    func count(_ outcome: JobOutcome, platform: Platform = .apns) {
        self.outcomes[outcome.disposition.name]?.increment()
        // The common case, a plain 200, without building its labels.
        if outcome.sent && outcome.status == 200 && outcome.reason == nil && outcome.trapIDs.isEmpty {
            self.plainDelivered[platform]?.increment()
            if let latency = outcome.latencyMs { self.attemptLatency.recordMilliseconds(latency) }
            return
        }
        let reason = outcome.reason ?? "none"
        let trap = outcome.trapIDs.first?.rawValue ?? "none"
        if outcome.sent {
            self.labelled.counter(
                label: "push_sends_total",
                platform: platform,
                status: outcome.status.map(String.init) ?? "none",
                reason,
                trap
            )
            .increment()
        } else if case .dead = outcome.disposition {
            self.labelled.counter(
                label: "push_rejected_before_send_total",
                platform: platform,
                status: nil,
                reason,
                trap
            )
            .increment()
        }
        switch outcome.disposition {
        case .retry: self.retries.increment()
        case .dead:
            self.labelled.counter(label: "push_dead_letters_total", platform: platform, status: nil, reason, trap)
                .increment()
        case .delivered, .requeue, .transportRetry: break
        }
        if let latency = outcome.latencyMs { self.attemptLatency.recordMilliseconds(latency) }
    }

    /// The queue gauges: `push_queue_depth{state}`, `push_oldest_pending_age_seconds`, `push_dead_letters`.
    /// Only the elected worker has them; `nil` (another worker counts now) removes them from this worker's
    /// `/metrics`, so a stale value never wins a `max()` in an alert. `now`: wall time, for the pauses' ages.
    func publish(_ gauges: QueueGauges?, now: Date) {
        self.queueGauges.handles.withLock { handles in
            guard let gauges else {
                handles?.destroy()
                handles = nil
                return
            }
            if handles == nil { handles = QueueGaugeHandles() }
            handles?.pending.record(gauges.pending)
            handles?.running.record(gauges.running)
            handles?.oldestDueAge.record(gauges.oldestDueAgeSeconds)
            handles?.deadLetters.record(gauges.deadLetters)
            handles?.webhookOldestDueAge.record(gauges.webhookOldestDueAgeSeconds)
            handles?.publish(gauges.pauses, gauges.rateLimits, now: now)
        }
    }
}

/// Counters with per-outcome dimensions, made once per label set and then reused (creating a swift-metrics
/// handle takes the factory's lock and allocates; a job should only increment).
final class LabelledCounters: Sendable {
    private struct Key: Hashable {
        var label: String
        var platform: Platform
        var status: String?
        var reason: String
        var trap: String?
    }
    private let counters = Mutex<[Key: Counter]>([:])

    func counter(label: String, platform: Platform, status: String?, _ reason: String, _ trap: String?) -> Counter {
        let key = Key(label: label, platform: platform, status: status, reason: reason, trap: trap)
        return self.counters.withLock { counters in
            if let counter = counters[key] { return counter }
            var dimensions = [("platform", platform.rawValue)]
            if let status { dimensions.append(("status", status)) }
            dimensions.append(("reason", reason))
            if let trap { dimensions.append(("trap", trap)) }
            let counter = Counter(label: label, dimensions: dimensions)
            counters[key] = counter
            return counter
        }
    }
}

/// Where the queue gauges live while this worker is the elected counter.
final class QueueGaugeSlot: Sendable {
    let handles = Mutex<QueueGaugeHandles?>(nil)
}

/// The queue gauges, made when this worker is elected to count and destroyed when it is not: four fixed
/// ones, and one per fleet-wide pause (`push_pause_age_seconds{credential,topic,reason}`) and rate limit
/// (`push_rate_limit_available{credential,topic}`: how many a claim could take now; 0 = saturated), made
/// and destroyed as those come and go.
final class QueueGaugeHandles: Sendable {
    let pending = Gauge(label: "push_queue_depth", dimensions: [("state", "pending")])
    let running = Gauge(label: "push_queue_depth", dimensions: [("state", "running")])
    let oldestDueAge = Gauge(label: "push_oldest_pending_age_seconds")
    let deadLetters = Gauge(label: "push_dead_letters")
    /// `push_webhook_oldest_due_age_seconds`: how long the oldest due webhook delivery has waited.
    let webhookOldestDueAge = Gauge(label: "push_webhook_oldest_due_age_seconds")
    private let scoped = Mutex<[[String]: Gauge]>([:])

    func publish(_ pauses: [Pause], _ limits: [RateLimit], now: Date) {
        var seen: [[String]: Double] = [:]
        for pause in pauses {
            // The reason is the operator's text: one line, bounded, as a label.
            let reason = String(pause.reason.prefix(80)).replacingOccurrences(of: "\n", with: " ")
            let key = ["pause", pause.credential ?? "*", pause.topic ?? "*", reason]
            seen[key] = max(0, now.timeIntervalSince(pause.createdAt))
        }
        for limit in limits {
            seen[["limit", limit.credential ?? "*", limit.topic ?? "*"]] = Double(limit.available)
        }
        self.scoped.withLock { gauges in
            for (key, gauge) in gauges where seen[key] == nil {
                gauge.destroy()
                gauges[key] = nil
            }
            for (key, value) in seen {
                let gauge =
                    gauges[key]
                    ?? (key[0] == "pause"
                        ? Gauge(
                            label: "push_pause_age_seconds",
                            dimensions: [("credential", key[1]), ("topic", key[2]), ("reason", key[3])]
                        )
                        : Gauge(
                            label: "push_rate_limit_available",
                            dimensions: [("credential", key[1]), ("topic", key[2])]
                        ))
                gauges[key] = gauge
                gauge.record(value)
            }
        }
    }

    func destroy() {
        for gauge in [self.pending, self.running, self.oldestDueAge, self.deadLetters, self.webhookOldestDueAge] {
            gauge.destroy()
        }
        self.scoped.withLock { gauges in
            for gauge in gauges.values { gauge.destroy() }
            gauges.removeAll()
        }
    }
}
