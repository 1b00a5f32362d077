import Foundation
import Logging
import Metrics
import PushCore
import Synchronization

/// The worker's view of its providers' health (``ProviderHealth``, one per APNs environment and per FCM
/// credential, which is one Firebase project): it counts every answer, turns a 5xx answered while the provider
/// is down into a requeue that uses no attempt, keeps the provider's jobs out of the claim, lets one probe
/// request through at a time, and says so in the log and in `push_provider_down{platform,scope}`. By the same
/// rule (``AnswerWindow``), an FCM credential whose answers are mostly `QUOTA_EXCEEDED` for distinct tokens has
/// spent its project's quota, whatever each answer says of its target: the whole credential waits.
final class ProviderOutages: Sendable {
    /// What is down: APNs' environment, or FCM's credential.
    struct Key: Hashable, Sendable {
        var platform: Platform
        /// `production` / `development` for APNs; the credential's name for FCM.
        var scope: String

        init(_ job: PushJob) {
            self.platform = job.platform
            self.scope = job.platform == .fcm ? job.credential : job.environment
        }

        init(platform: Platform, scope: String) {
            self.platform = platform
            self.scope = scope
        }

        var description: String {
            self.platform == .fcm ? "FCM (credential '\(self.scope)')" : "APNs \(self.scope)"
        }
    }

    /// An answer that took longer than this (in milliseconds) is not counted as the provider answering.
    static let staleAnswer = 5_000

    private let states = Mutex<[Key: ProviderHealth]>([:])
    /// FCM credentials' answers, `QUOTA_EXCEEDED` about a target counted as bad.
    private let quotas = Mutex<[String: AnswerWindow]>([:])
    /// Providers down now, read without the lock on the send path's fast way (nothing down).
    private let anyDown = Atomic<Int>(0)
    private let gauges = Mutex<[Key: Gauge]>([:])
    let clock: any PushClock
    let logger: Logger

    init(clock: any PushClock, logger: Logger) {
        self.clock = clock
        self.logger = logger
    }

    /// Records an answered attempt; returns it unchanged, or, when its provider is down and it is a 5xx, as a
    /// requeue that uses no attempt (its history keeps the answer).
    func record(_ attempt: JobProcessor.Attempt) -> JobProcessor.Attempt {
        let job = attempt.job
        guard attempt.outcome.sent, let status = attempt.outcome.status else {
            // No answer: a probe that was not answered makes way for the next one.
            if self.anyDown.load(ordering: .relaxed) > 0 {
                let now = self.clock.now
                self.states.withLock { $0[Key(job)]?.probeEnded(job: job.id, at: now) }
            }
            return attempt
        }
        let key = Key(job)
        let now = self.clock.now
        let serverError = status >= 500
        // An answer read long after its request was written (this worker was frozen, or the answer sat unread)
        // says nothing of the provider now: a frozen worker's 200s, read after an outage began, must not vouch
        // for it. Its 5xx still counts, and so does the probe's answer, however slow (a provider coming back is
        // often slow): dropped, the provider would stay down on this worker with its probe never ended.
        let stale = !serverError && (attempt.outcome.latencyMs ?? 0) > Self.staleAnswer
        var doubted = false
        let (counted, change, wait) = self.states.withLock { states -> (Bool, ProviderHealth.Change?, Duration?) in
            if stale && states[key]?.isProbe(job.id) != true { return (false, nil, nil) }
            let change = states[key, default: ProviderHealth()].record(
                serverError: serverError,
                job: job.id,
                at: now,
                written: attempt.outcome.attemptedAt
            )
            switch change {
            case .down: self.anyDown.add(1, ordering: .relaxed)
            case .up: self.anyDown.subtract(1, ordering: .relaxed)
            case nil: break
            }
            guard serverError, let health = states[key] else { return (true, change, nil) }
            // Down: back uncounted. Maybe down, and this 5xx would end the job: back uncounted, later.
            if health.isDown { return (true, change, ProviderHealth.firstProbe) }
            guard case .dead = attempt.decided.decision else { return (true, change, nil) }
            // Since its previous request was written (by any worker; a first attempt, since this one was): a
            // request written after that and answered shows the provider worked after the job's last failure.
            // For an hour from its first attempt at most: a job whose own request a quiet provider keeps
            // answering 5xx is not sent for ever.
            let since = job.lastAttemptAt.flatMap { Self.local($0, of: attempt) } ?? attempt.outcome.attemptedAt
            if health.mayBeDown(at: now, since: since, afterDoubt: job.lastOutcome == "requeue"),
                Self.local(job.firstAttemptAt, of: attempt).map({ now - $0 < ProviderHealth.doubtfulSpan }) ?? true
            {
                doubted = true
                return (true, change, ProviderHealth.doubtfulWait)
            }
            return (true, change, nil)
        }
        guard counted else { return attempt }
        if let change { self.changed(key, change) }
        if let wait, doubted {
            // Not down, but nothing shows the provider worked since this job's last attempt: its 5xx may be the
            // first of an outage. Said once per job and attempt (the down state has its own line).
            self.logger.info(
                "\(key.description) may be down: no answer since this job's previous request; its 5xx uses no attempt, sent again in \(wait)",
                metadata: [
                    "push.job_id": "\(job.id)", "push.apns_id": "\(job.apnsID.uuidString.lowercased())",
                    "push.status": "\(status)",
                ]
            )
        }
        if let wait { return Self.requeued(attempt, after: wait) }
        return job.platform == .fcm ? self.recordQuota(attempt, at: now) : attempt
    }

    /// A database instant of `attempt`'s job on this worker's clock: the claim's instant here less the
    /// database's time from then to the claim.
    private static func local(_ date: Date?, of attempt: JobProcessor.Attempt) -> ContinuousClock.Instant? {
        guard let date, let claimed = attempt.job.claimedAt else { return nil }
        let here = attempt.job.claimedLocally ?? attempt.outcome.attemptedAt
        return here - .milliseconds(Int64(max(0, claimed.timeIntervalSince(date)) * 1000))
    }

    /// `attempt` sent back to pending after `wait` without using an attempt (its history keeps the answer);
    /// with `pausing`, its credential waits as long.
    private static func requeued(
        _ attempt: JobProcessor.Attempt,
        after wait: Duration,
        pausing: Bool = false
    ) -> JobProcessor.Attempt {
        var decided = attempt.decided
        decided.decision = .requeue(after: wait)
        decided.unknownReason = false
        if pausing {
            decided.pausesCredential = true
            decided.pauseLength = wait
        }
        var outcome = attempt.outcome
        outcome.disposition = decided.decision
        return JobProcessor.Attempt(job: attempt.job, outcome: outcome, decided: decided)
    }

    /// An FCM answer counted for its credential's quota: a target's `QUOTA_EXCEEDED` for many distinct tokens
    /// at once is the project's quota, so the job goes back uncounted and the credential waits.
    private func recordQuota(_ attempt: JobProcessor.Attempt, at now: ContinuousClock.Instant) -> JobProcessor.Attempt {
        let job = attempt.job
        let targetQuota = attempt.decided.trapID == .fcmQuota && !attempt.decided.pausesCredential
        // Counted by device token, not by job: twenty jobs of one hot device are one target over its rate.
        let target = Int64(truncatingIfNeeded: (job.deviceToken ?? "\(job.id)").hashValue)
        let tipped = self.quotas.withLock { quotas in
            quotas[job.credential, default: AnswerWindow()].record(bad: targetQuota, job: target, at: now)
        }
        guard targetQuota, tipped != nil else { return attempt }
        // Logged once per pause by the worker (``ProviderReactions/react(to:)``), as FCM asking it to wait.
        return Self.requeued(attempt, after: FCMReason.quotaWait, pausing: true)
    }

    /// Asked just before a request is written: false (withdraw it, unsent and uncounted) while its provider is
    /// down, except for the one probe.
    func admits(_ job: PushJob) -> Bool {
        guard self.anyDown.load(ordering: .relaxed) > 0 else { return true }
        let now = self.clock.now
        return self.states.withLock { $0[Key(job)]?.admits(job: job.id, at: now) ?? true }
    }

    /// How many of a batch of `job`'s provider may be written before their answers are read (`nil`: all),
    /// taken from the provider's first wave: ``ProviderHealth/takeWave(_:at:)``.
    func takeWave(_ job: PushJob, wanting wanted: Int) -> Int? {
        let now = self.clock.now
        return self.states.withLock { $0[Key(job), default: ProviderHealth()].takeWave(wanted, at: now) }
    }

    /// How many of `job`'s provider's first wave are free now (`nil`: no wave), taking none.
    func firstWave(_ job: PushJob) -> Int? {
        let now = self.clock.now
        return self.states.withLock { $0[Key(job), default: ProviderHealth()].firstWave(at: now) }
    }

    /// `count` requests of `job`'s provider's first wave ended (answered or withdrawn).
    func waveEnded(_ job: PushJob, count: Int) {
        self.states.withLock { $0[Key(job)]?.waveEnded(count) }
    }

    /// What the claim leaves out: APNs environments and FCM credentials that are down, unless a probe is due.
    func excluded() -> (environments: [String], endpoints: [EndpointKey]) {
        guard self.anyDown.load(ordering: .relaxed) > 0 else { return ([], []) }
        let now = self.clock.now
        return self.states.withLock { states in
            var environments: [String] = []
            var endpoints: [EndpointKey] = []
            for (key, health) in states where health.isDown && !health.probeDue(at: now) {
                if key.platform == .fcm {
                    endpoints.append(EndpointKey(environment: "fcm", credential: key.scope))
                } else {
                    environments.append(key.scope)
                }
            }
            return (environments, endpoints)
        }
    }

    /// Whether `platform`'s `scope` is taken for down (tests, `describe`).
    func isDown(platform: Platform, scope: String) -> Bool {
        self.states.withLock { $0[Key(platform: platform, scope: scope)]?.isDown ?? false }
    }

    private func changed(_ key: Key, _ change: ProviderHealth.Change) {
        let gauge = self.gauges.withLock { gauges in
            if let gauge = gauges[key] { return gauge }
            let gauge = WorkerMetrics.providerDown(platform: key.platform, scope: key.scope)
            gauges[key] = gauge
            return gauge
        }
        let metadata: Logger.Metadata = ["push.platform": "\(key.platform.rawValue)", "push.scope": "\(key.scope)"]
        switch change {
        case .down(let errors, let answers):
            gauge.record(1)
            self.logger.error(
                "\(key.description) is down: \(errors) of the last \(answers) answers within \(ProviderHealth.window) were 5xx, from distinct jobs. Its jobs go back to pending without using an attempt and are not claimed; one probe request is sent after \(ProviderHealth.firstProbe), then backing off to \(ProviderHealth.lastProbe)",
                metadata: metadata
            )
        case .up(let after):
            gauge.record(0)
            self.logger.notice(
                "\(key.description) answers again after \(after) down: claiming its jobs again",
                metadata: metadata
            )
        }
    }
}
