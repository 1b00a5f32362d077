import APNsTransport
import Foundation
import Logging
import PushCore
import PushQueue

/// The worker's send path: what may be written now, the batches of due jobs, and what a decided attempt
/// does to the worker (pauses, metrics, the outcome writer).
extension PushWorkerService {
    /// The database's clock now for `job`: its claim's `now()` carried forward by this process's clock.
    static func databaseNow(of job: PushJob, claimedAt: Date) -> Date {
        Date().addingTimeInterval((job.claimedAt ?? claimedAt).timeIntervalSince(claimedAt))
    }

    /// Whether a row of `push.pauses` (as of the last heartbeat) matches the job.
    func isPausedByFleet(credential: String, topic: String) -> Bool {
        self.state.withLock { state in
            state.fleetPauses.contains { $0.matches(credential: credential, topic: topic) }
        }
    }

    /// Jobs an operator cancelled while this worker may hold them (`jobs cancel` NOTIFYs their ids): a
    /// request of one not yet written is withdrawn. Bounded: the oldest ids are forgotten first.
    func noteCancelled(_ ids: Substring) {
        let parsed = ids.split(separator: ",").compactMap { Int64($0) }
        self.cancelled.withLock { cancelled in
            for id in parsed where cancelled.set.insert(id).inserted { cancelled.order.append(id) }
            while cancelled.order.count > 100_000 { cancelled.set.remove(cancelled.order.removeFirst()) }
        }
    }

    func isCancelled(_ id: Int64) -> Bool { self.cancelled.withLock { $0.set.contains(id) } }

    /// How late after its slot a rate-limited request may still be written. Later, it is withdrawn
    /// (released uncounted, claimed again for a new slot): sent late, it would leave together with the
    /// requests other workers send on time, and the fleet's rate would not hold where the requests leave.
    static let lateSendTolerance = Duration.milliseconds(150)

    /// Whether the requests of `credential` may be written now (asked just before the write): the worker is
    /// healthy and the provider has not refused the credential. A topic's pauses are asked per request
    /// (``withdrawsTopic(_:)``).
    func mayWrite(credential: String, platform: Platform = .apns) -> @Sendable () -> Bool {
        let pauses = platform == .fcm ? self.fcmCredentialPauses : self.credentialPauses
        return { [weak self] in
            guard let self else { return false }
            return !Task.isCancelled && self.heartbeatFresh && !pauses.isPaused(credential)
        }
    }

    /// Whether one request is withdrawn just before its write because of its topic: APNs refused the
    /// credential for it (TopicDisallowed: APNs' topic pauses), or a row of `push.pauses` matches it.
    func withdrawsTopic(_ job: PushJob) -> Bool {
        if job.platform == .apns && self.topicPauses.isPaused(TopicKey(credential: job.credential, topic: job.topic)) {
            return true
        }
        return self.isPausedByFleet(credential: job.credential, topic: job.topic)
    }

    /// Whether one request is withdrawn just before its write, alone: its job was cancelled meanwhile, or,
    /// rate-limited, it is later than `latest` (sent late, it would leave together with the requests other
    /// workers send on time) or within an interval of this worker's last request of its limit
    /// (``SendSpacer/admit(_:now:)``, which records the write when it is admitted).
    func withdraws(_ job: PushJob, latest: ContinuousClock.Instant?) -> Bool {
        if self.isCancelled(job.id) { return true }
        if let latest, self.clock.now > latest {
            self.metrics.lateLimitedSend()
            return true
        }
        let now = self.clock.now
        return job.sendSpacing.map { !self.spacer.admit($0, now: now) } ?? false
    }

    /// Sends claimed jobs whose send time is later, as batches as their times come: every job whose time has
    /// come goes out in the next batch. A rate-limited job also takes its limit's next free slot in this
    /// worker (``SendSpacer/slot(for:notBefore:)``); one whose slot is later waits for it.
    func sendScheduled(_ jobs: [ScheduledSend], claimedAt: Date) async {
        // Each batch in a task of its own: the next time comes whether or not the last batch's answers have.
        await withDiscardingTaskGroup { batches in
            await self.scheduleBatches(jobs, claimedAt: claimedAt, into: &batches)
        }
    }

    private func scheduleBatches(
        _ jobs: [ScheduledSend],
        claimedAt: Date,
        into batches: inout DiscardingTaskGroup
    ) async {
        var waiting = jobs.sorted { $0.slot < $1.slot }
        while let first = waiting.first {
            // A cancelled wait (a drain past its grace) goes on at once: the writes are then withdrawn.
            try? await self.clock.sleep(until: first.slot, tolerance: nil)
            var ready: [ScheduledSend] = []
            var later: [ScheduledSend] = []
            let now = self.clock.now
            while let next = waiting.first, next.slot <= now {
                waiting.removeFirst()
                if let spacing = next.job.sendSpacing, !next.spaced {
                    let spaced = self.spacer.slot(for: spacing, notBefore: now)
                    if spaced > now {
                        later.append(ScheduledSend(job: next.job, slot: spaced, latest: next.latest, spaced: true))
                        continue
                    }
                }
                ready.append(next)
            }
            if !later.isEmpty { waiting = (waiting + later).sorted { $0.slot < $1.slot } }
            if !ready.isEmpty {
                batches.addTask { await self.send(ready.map(\.job), claimedAt: claimedAt, latest: ready.map(\.latest)) }
            }
        }
    }

    /// Sends claimed jobs that are due now, as few batches as their (environment, credential) pairs: each
    /// answer is decided and handed to the recorder on the event loop it arrives on.
    ///
    /// - Parameter latest: for each job, the latest time a rate-limited one may still be written.
    func send(_ jobs: [PushJob], claimedAt: Date, latest: [ContinuousClock.Instant?]? = nil) async {
        var groups: [[(prepared: JobProcessor.Prepared, latest: ContinuousClock.Instant?)]] = []
        var groupOf: [String: Int] = [:]
        for (position, job) in jobs.enumerated() {
            let prepared = self.processor.prepare(job, databaseNow: Self.databaseNow(of: job, claimedAt: claimedAt))
            guard let request = prepared.request else {
                self.complete(prepared, with: nil)
                continue
            }
            // One batch per (platform, environment, credential), whatever the topics: a batch per topic cost the
            // worker a task and a submission per topic of a claim (30 µs a job more at 10,000 topics). A topic
            // APNs refuses, or the fleet pauses, withdraws only its own requests (``withdrawsTopic``).
            let key: String
            switch request {
            case .apns(let apns): key = "apns/\(apns.environment)/\(job.credential)"
            case .fcm: key = "fcm/\(job.credential)"
            }
            let entry = (prepared, latest?[position] ?? nil)
            if let index = groupOf[key] {
                groups[index].append(entry)
            } else {
                groupOf[key] = groups.count
                groups.append([entry])
            }
        }
        await withDiscardingTaskGroup { pairs in
            for group in groups {
                pairs.addTask {
                    let credential = group[0].prepared.job.credential
                    let first = group[0].prepared.job
                    let mayWrite = self.mayWrite(credential: credential, platform: first.platform)
                    // A job whose topic is paused (APNs refused it, or the fleet paused it), one cancelled while it
                    // waited for a stream, or a limited one now late or too close to its limit's last request, is
                    // withdrawn alone. The topic first: a withdrawn request takes no slot of its limit.
                    let withdraws: @Sendable (Int) -> Bool = { index in
                        let job = group[index].prepared.job
                        // The provider's health last: a request it admits as the probe is written.
                        return self.withdrawsTopic(job) || self.withdraws(job, latest: group[index].latest)
                            || !self.outages.admits(job)
                    }
                    switch group[0].prepared.request {
                    case .fcm:
                        let messages = group.compactMap { entry -> FCMMessage? in
                            if case .fcm(let message) = entry.prepared.request { message } else { nil }
                        }
                        guard let fcm = self.processor.fcm else {
                            let error = TransportError(
                                code: .credentialsMissing,
                                mayHaveBeenProcessed: false,
                                message:
                                    "no FCM service account is configured in this worker for credential '\(credential)'"
                            )
                            for entry in group { self.complete(entry.prepared, with: .failure(error)) }
                            return
                        }
                        await fcm.sendBatch(messages, credential: credential, mayWrite: mayWrite, withdraws: withdraws)
                        {
                            index,
                            result in
                            self.complete(group[index].prepared, with: result.map(JobProcessor.Answer.fcm))
                        }
                    default:
                        let requests = group.compactMap { entry -> APNsRequest? in
                            if case .apns(let request) = entry.prepared.request { request } else { nil }
                        }
                        await self.client.sendBatch(
                            requests,
                            credential: credential,
                            mayWrite: mayWrite,
                            withdraws: withdraws
                        ) { index, result in
                            self.complete(group[index].prepared, with: result.map(JobProcessor.Answer.apns))
                        }
                    }
                }
            }
        }
    }

    /// A prepared job's send ended (`nil`: refused before sending): decide, react, count, hand to the recorder.
    func complete(_ prepared: JobProcessor.Prepared, with result: Result<JobProcessor.Answer, any Error>?) {
        if case .success(.apns(let response)) = result { self.skew.observe(response) }
        self.apply(self.processor.decide(prepared, with: result))
    }

    /// A job's attempt is decided: its effects on this worker, its metrics, the outcome writer; the send no
    /// longer counts.
    func apply(_ attempt: JobProcessor.Attempt) {
        // A 5xx while its provider is down goes back uncounted (``ProviderOutages``).
        let attempt = self.outages.record(attempt)
        self.react(to: attempt)
        self.metrics.count(attempt.outcome, platform: attempt.job.platform)
        var outcome = attempt.outcome
        if let tracing = self.tracing, attempt.job.traceparent != nil {
            outcome.traceSpan = tracing.record(
                attempt,
                worker: self.configuration.workerID,
                started: outcome.attemptedAt,
                now: ContinuousClock.now
            )
        }
        self.recorder.add(outcome)
        // The claim loop waits for room for a batch (and a drain for the last send): woken only when there is,
        // not by every answer. Each wake-up with no room cost a task group, a timer and a thread switch a job.
        let wakes = self.state.withLock { state in
            state.capacity.sendFinished()
            return state.shuttingDown || state.capacity.claimLimit() != nil
        }
        if wakes { self.sendEnded.signal() }
    }

    /// The worker's side effects of a decision: pause a credential, a topic or an unreachable endpoint.
    func react(to attempt: JobProcessor.Attempt) {
        let (job, decided) = (attempt.job, attempt.decided)
        let endpoint = EndpointKey(environment: job.environment, credential: job.credential)
        if decided.decision == .delivered {
            (job.platform == .fcm ? self.fcmCredentialPauses : self.credentialPauses).succeeded(job.credential)
            self.unreachableEndpoints.succeeded(endpoint)
        }
        if decided.pausesCredential {
            let pauses = job.platform == .fcm ? self.fcmCredentialPauses : self.credentialPauses
            let (length, isNew) =
                decided.pauseLength.map { pauses.pause(job.credential, for: $0) } ?? pauses.pause(job.credential)
            if isNew { self.metrics.credentialRefused(platform: job.platform, reason: decided.reason ?? "-") }
            if isNew, decided.pauseLength != nil {
                self.logger.warning(
                    "\(job.platform.providerName) asked credential '\(job.credential)' to wait (\(decided.reason ?? "-")): its jobs stay pending for \(length), no attempt used",
                    metadata: ["push.credential": "\(job.credential)", "push.reason": "\(decided.reason ?? "-")"]
                )
            } else if isNew {
                let reason = decided.reason ?? "-"
                let what = job.platform == .fcm ? "its service account key file" : "its key or certificate"
                self.logger.error(
                    "\(job.platform.providerName) refused credential '\(job.credential)' (\(reason)): its jobs stay pending for \(length); fix the credential (\(what))",
                    metadata: ["push.credential": "\(job.credential)", "push.reason": "\(reason)"]
                )
            }
        }
        if decided.pausesTopic {
            let (length, isNew) = self.topicPauses.pause(TopicKey(credential: job.credential, topic: job.topic))
            if isNew {
                let reason = decided.reason ?? "-"
                self.logger.error(
                    "APNs refused credential '\(job.credential)' for topic '\(job.topic)' (\(reason)): its jobs of this topic stay pending for \(length); its other topics keep sending. Check the bundle id and that the key belongs to the app's team",
                    metadata: [
                        "push.credential": "\(job.credential)", "push.topic": "\(job.topic)",
                        "push.reason": "\(reason)",
                    ]
                )
            }
        }
        if decided.endpointUnreachable {
            let (_, isNew) = self.unreachableEndpoints.pause(endpoint)
            if isNew {
                self.logger.warning(
                    "\(job.platform.providerName) unreachable for \(job.environment) with credential '\(job.credential)': those jobs stay pending, unclaimed, while the pool reconnects",
                    metadata: ["push.environment": "\(job.environment)", "push.credential": "\(job.credential)"]
                )
            }
        }
    }
}

/// The ids of jobs cancelled while a worker may hold them, oldest first.
struct CancelledJobs: Sendable {
    var set: Set<Int64> = []
    var order: [Int64] = []
}

/// A claimed job whose send time is later than the claim: its slot, and for a rate-limited one the latest it
/// may still be written.
struct ScheduledSend: Sendable {
    let job: PushJob
    let slot: ContinuousClock.Instant
    let latest: ContinuousClock.Instant?
    /// The limit's spacing gave it this slot already.
    var spaced = false
}
