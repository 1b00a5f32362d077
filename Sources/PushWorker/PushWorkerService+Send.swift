import Foundation
import Logging
import PushCore
import PushQueue
import PushTransport

/// The worker's send path: what may be written now, the batches of due jobs, and what a decided attempt
/// does to the worker (pauses, metrics, the outcome writer).
extension PushWorkerService {
    /// The database's clock now for `job`: its claim's `now()` carried forward by this process's clock.
    func databaseNow(of job: PushJob, claimedAt: Date) -> Date {
        self.clock.wallNow.addingTimeInterval((job.claimedAt ?? claimedAt).timeIntervalSince(claimedAt))
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

    /// Whether the requests of a credential may be written now (asked just before the write): the worker is
    /// healthy and the provider has not refused the credential. A topic's pauses are asked per request
    /// (``withdrawsTopic(_:)``).
    func mayWrite(_ credential: CredentialKey) -> @Sendable () -> Bool {
        let reactions = self.reactions
        return { [weak self] in
            guard let self else { return false }
            return !Task.isCancelled && self.heartbeatFresh && !reactions.holds(credential)
        }
    }

    /// Whether one request is withdrawn just before its write because of its topic: APNs refused the
    /// credential for it (TopicDisallowed: APNs' topic pauses), or a row of `push.pauses` matches it.
    func withdrawsTopic(_ job: PushJob) -> Bool {
        self.reactions.holdsTopic(of: job) || self.isPausedByFleet(credential: job.credential, topic: job.topic)
    }

    /// Whether one request is withdrawn just before its write, alone: its job was cancelled meanwhile, or its
    /// rate limit holds it back (``SendScheduler/holdsBack(_:latest:)``).
    func withdraws(_ job: PushJob, latest: ContinuousClock.Instant?) -> Bool {
        self.isCancelled(job.id) || self.scheduler.holdsBack(job, latest: latest)
    }

    /// Sends claimed jobs that are due now, as few batches as their (platform, environment, credential)
    /// groups, each through its platform's sender: each answer is decided and handed to the recorder on the
    /// event loop it arrives on.
    ///
    /// - Parameter latest: for each job, the latest time a rate-limited one may still be written.
    func send(_ jobs: [PushJob], claimedAt: Date, latest: [ContinuousClock.Instant?]? = nil) async {
        // Recipients' jobs are not sent: they become one child job per device, those claimed at once sent
        // beside this batch.
        let parents = jobs.filter { $0.recipient != nil }
        // Live Activity events are not sent either: each is routed to its activity's tokens or channel.
        let events = jobs.filter { $0.activityID != nil }
        var groups: [[(prepared: JobProcessor.Prepared, latest: ContinuousClock.Instant?)]] = []
        var groupOf: [SendGroup: Int] = [:]
        for (position, job) in jobs.enumerated() where !job.isParent {
            let prepared = self.processor.prepare(job, databaseNow: self.databaseNow(of: job, claimedAt: claimedAt))
            guard prepared.request != nil else {
                self.settle(prepared, with: nil)
                continue
            }
            // A topic APNs refuses, or the fleet pauses, withdraws only its own requests (``withdrawsTopic``).
            let key = SendGroup(job)
            let entry = (prepared, latest?[position] ?? nil)
            if let index = groupOf[key] {
                groups[index].append(entry)
            } else {
                groupOf[key] = groups.count
                groups.append([entry])
            }
        }
        await withDiscardingTaskGroup { sends in
            if !parents.isEmpty {
                sends.addTask { await self.fanOut(parents) }
            }
            if !events.isEmpty {
                sends.addTask { await self.routeActivities(events) }
            }
            for group in groups {
                sends.addTask { await self.send(group) }
            }
        }
    }

    /// Sends one group's requests (one platform, environment and credential) through its platform's sender.
    ///
    /// - Parameter pastWave: the requests are a first wave, or waited for one: written without asking again.
    private func send(
        _ group: [(prepared: JobProcessor.Prepared, latest: ContinuousClock.Instant?)],
        pastWave: Bool = false
    ) async {
        let first = group[0].prepared.job
        guard let sender = self.senders[first.platform] else {
            let error = TransportError(
                code: .credentialsMissing,
                mayHaveBeenProcessed: false,
                message:
                    "no \(first.platform.providerName) credentials are configured in this worker for credential '\(first.credential)'"
            )
            for entry in group { self.settle(entry.prepared, with: .failure(error)) }
            return
        }
        // A provider not heard from lately (a quiet spell, this worker just started, thawed or back from an
        // outage) gets a first wave of 20 requests, shared by every batch of this worker: if it went down
        // meanwhile, their answers say so before the rest are written, and those are withdrawn
        // (``ProviderHealth/firstWave(at:)``). The rest waits for the wave's answers 1 s at most: a slow
        // provider is not a down one (a down one answers 5xx at once). A batch given no part of the wave waits
        // until the wave ends (then asks again) or the provider is heard from, that second at most, then goes.
        // A rate-limited group is paced by its limit already, and its requests have a latest time to keep.
        if !pastWave, group.allSatisfy({ $0.latest == nil }),
            let granted = self.outages.takeWave(first, wanting: group.count)
        {
            guard granted < group.count else {
                // All of it is the wave.
                await self.send(group, pastWave: true)
                self.outages.waveEnded(first, count: granted)
                return
            }
            let clock = self.clock
            guard granted > 0 else {
                let deadline = clock.now + ProviderHealth.firstWaveWait
                while clock.now < deadline {
                    try? await clock.sleep(for: .milliseconds(20))
                    if self.outages.firstWave(first) != 0 { break }
                }
                // Room in the wave again, or heard from (no wave): asked again; still none after the second: sent.
                await self.send(group, pastWave: self.outages.firstWave(first) == 0)
                return
            }
            let (wave, rest) = (Array(group.prefix(granted)), Array(group.dropFirst(granted)))
            await withTaskGroup(of: Bool.self) { tasks in
                tasks.addTask {
                    await self.send(wave, pastWave: true)
                    self.outages.waveEnded(first, count: wave.count)
                    return true
                }
                tasks.addTask {
                    try? await clock.sleep(for: ProviderHealth.firstWaveWait)
                    return false
                }
                // The wave answered first: only the timer is left to stop, and the rest is asked again.
                let answered = await tasks.next() == true
                if answered { tasks.cancelAll() }
                await self.send(rest, pastWave: !answered)
            }
            return
        }
        // A job whose topic is paused (APNs refused it, or the fleet paused it), one cancelled while it waited
        // for a stream, or a limited one now late or too close to its limit's last request, is withdrawn alone.
        // The topic first: a withdrawn request takes no slot of its limit. The provider's health last: a
        // request it admits as the probe is written.
        let withdraws: @Sendable (Int) -> Bool = { index in
            let job = group[index].prepared.job
            return self.withdrawsTopic(job) || self.withdraws(job, latest: group[index].latest)
                || !self.outages.admits(job)
        }
        await sender.sendBatch(
            group.compactMap(\.prepared.request),
            credential: first.credential,
            mayWrite: self.mayWrite(CredentialKey(first)),
            withdraws: withdraws
        ) { index, result in
            self.settle(group[index].prepared, with: result)
        }
    }
}

/// The ids of jobs cancelled while a worker may hold them, oldest first.
struct CancelledJobs: Sendable {
    var set: Set<Int64> = []
    var order: [Int64] = []
}
