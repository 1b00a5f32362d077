import Foundation
import PushCore
import PushQueue

/// The claim loop: claims whole batches up to the free send capacity, leaving out what is paused, down or held,
/// hands them to the sends, and sleeps until a NOTIFY, the earliest scheduled job or the poll timer.
extension PushWorkerService {
    func claimLoop() async {
        let configuration = self.configuration
        var failures = 0
        // Claims in a row that took nothing while their walk of topics was cut short (bounded: a queue whose
        // topics are all paused or waiting would otherwise be walked round and round without a pause).
        var emptyWalks = 0
        // Discarding: a plain task group keeps every finished send until the group ends (memory grows per job).
        await withDiscardingTaskGroup { sends in
            while !self.isShuttingDown && !Task.isCancelled {
                // Whole batches where possible; outcomes not yet written count against capacity; no claim
                // while this worker's own heartbeat is stale.
                // The limit and the switch epoch in one look: a switch beginning after it finds this claim out.
                let gate = self.state.withLock { state in
                    state.switching ? nil : state.capacity.claimLimit().map { (limit: $0, epoch: state.switchEpoch) }
                }
                guard let (limit, epoch) = gate, self.heartbeatFresh else {
                    _ = await self.sendEnded.wait(timeout: .milliseconds(100), clock: self.clock)
                    continue
                }
                let batch: JobQueue.ClaimBatch
                let claimStarted = self.clock.now
                // Rate-limited jobs are claimed whatever this worker's send backlog: each takes a task of its
                // own that waits for its slot, and the spacer admits it at the write, so a backlog cannot
                // bunch them (it may make one late, then the next waits its interval). Leaving them for
                // when few sends wait starved a limited topic for the whole drain of a large backlog: the
                // fleet harness's 100k-job seeds sent 0-2 of its jobs in 5-7 s under a 22-59/s limit.
                do {
                    let (queue, held) = (self.queue, self.state.withLock { Array($0.capacity.held) })
                    let excluded = self.claimExclusions()
                    batch = try await withDeadline(configuration.statementDeadline, "the claim") {
                        try await queue.claimBatch(
                            limit: limit,
                            workerID: configuration.workerID,
                            lease: configuration.lease,
                            onlyCredentials: configuration.credentials,
                            excluding: excluded,
                            excludingIDs: held,
                            includingRateLimited: true
                        )
                    }
                    self.metrics.claimDuration.record(duration: self.clock.now - claimStarted)
                    failures = 0
                    self.databaseAnswered()
                } catch {
                    failures += 1
                    self.databaseFailed(error)
                    let delay = Duration.milliseconds(min(100 << min(failures, 9), 30_000))
                    self.logger.error(
                        "could not claim jobs; retrying",
                        metadata: ["push.error": "\(QueueError.summary(of: error))", "push.retry_in": "\(delay)"]
                    )
                    _ = await self.wake.wait(timeout: delay, clock: self.clock)
                    continue
                }
                let jobs = batch.jobs
                // Held from here, unless a switch to a new primary began while the claim was out: the switch
                // returned to pending every job this worker did not hold, these among them.
                let current = self.state.withLock { state in
                    guard state.switchEpoch == epoch else { return false }
                    if !jobs.isEmpty { state.capacity.claimed(jobs.map(\.id)) }
                    return true
                }
                guard current else {
                    // Not sent; returned to pending now, uncounted, if the claim went through to the database in
                    // use (the same server after a renewed password), else they were never claimed there. By
                    // their own ids: "every job this worker does not hold" would also catch a fan-out's children
                    // between its commit and its hold.
                    let released = try? await self.queue.release(
                        jobs.map { (id: $0.id, attempt: $0.attempts) },
                        workerID: configuration.workerID
                    )
                    self.logger.notice(
                        "a claim answered across a switch to a new primary; its jobs are not sent, and are pending again",
                        metadata: ["push.jobs": "\(jobs.count)", "push.released": "\(released ?? 0)"]
                    )
                    continue
                }
                self.metrics.claimed(superseded: batch.superseded, rateLimited: batch.rateLimitedFor != nil)
                if !jobs.isEmpty {
                    self.forgetLiftedPauses(matching: jobs, claimStarted: claimStarted)
                    self.stats.withLock { $0.claimed += jobs.count }
                }
                let claimedAt = self.clock.wallNow
                let (due, scheduled) = self.scheduler.split(jobs)
                // The rest go out together: one task for the batch, answers handled as they arrive.
                if !due.isEmpty {
                    let batch = due
                    sends.addTask { await self.send(batch, claimedAt: claimedAt) }
                }
                // Jobs with a later send time: one task sends them as batches as their times come.
                if !scheduled.isEmpty {
                    let batch = scheduled
                    sends.addTask {
                        await self.scheduler.send(batch) { ready in
                            await self.send(ready.map(\.job), claimedAt: claimedAt, latest: ready.map(\.latest))
                        }
                    }
                }
                // A full batch, a range that gave its whole share (another credential had little due work), or a
                // walk of topics that spent its budget: claim again at once. A walk that took nothing (the topics
                // it walked were paused or not due) goes on to the next topics at once too, 64 times in a row
                // at most (64 budgets of topics), then waits as an idle claim does.
                if jobs.count == limit || (batch.mayHaveMore && !jobs.isEmpty) {
                    emptyWalks = 0
                    continue
                }
                if batch.walkIncomplete {
                    if !jobs.isEmpty {
                        emptyWalks = 0
                        continue
                    }
                    if emptyWalks < 64 {
                        emptyWalks += 1
                        continue
                    }
                }
                emptyWalks = 0
                // Not a full batch: sleep until a NOTIFY, the earliest scheduled job, or the poll timer.
                var timeout = configuration.pollInterval
                // Under the statement deadline as the claim is: a read left waiting on a connection that never
                // answers would hold the claim loop, and with it every claim, without a word.
                let queue = self.queue
                if let untilNext = try? await withDeadline(
                    configuration.statementDeadline,
                    "the next due time",
                    { try await queue.untilNextDue() }
                ), untilNext > .zero {
                    timeout = min(timeout, untilNext + .milliseconds(1))
                }
                // A rate limit's bucket ran dry: claim again when it holds a token.
                if let refill = batch.rateLimitedFor { timeout = min(timeout, refill) }
                _ = await self.wake.wait(timeout: timeout, clock: self.clock)
            }
            // Draining: let in-flight sends finish within the grace period, then cancel them: a send not
            // yet written is withdrawn and its job released uncounted; one in flight has an unknown outcome.
            let grace = configuration.shutdownGrace
            let deadline = self.clock.now + grace
            while self.state.withLock({ $0.capacity.inFlight }) > 0 && self.clock.now < deadline {
                _ = await self.sendEnded.wait(timeout: .milliseconds(50), clock: self.clock)
            }
            if self.state.withLock({ $0.capacity.inFlight }) > 0 {
                self.logger.warning(
                    "shutdown grace period over; withdrawing the sends still waiting",
                    metadata: ["push.jobs": "\(self.state.withLock { $0.capacity.inFlight })"]
                )
                sends.cancelAll()
            }
        }
    }

    /// What the claim leaves out now: APNs environments down; (environment, credential) pairs whose endpoint is
    /// unreachable, whose credential a provider refused (each platform's pauses as its own pairs: APNs refusing
    /// 'default' holds APNs' jobs of that name only, and FCM's pauses FCM's), that this worker cannot sign or
    /// whose FCM project is down; and (credential, topic) pairs APNs refused.
    func claimExclusions() -> ClaimExclusions {
        self.reactions.exclusions(down: self.outages.excluded())
    }

    /// Forgets cached fleet pauses that match a job of a claim begun after the pauses were read: the claim
    /// leaves paused jobs out, so such a pause was lifted since (a resume reaches the sends at once, not at the
    /// next heartbeat). An older claim may predate the pause itself.
    func forgetLiftedPauses(matching jobs: [PushJob], claimStarted: ContinuousClock.Instant) {
        self.state.withLock { state in
            guard claimStarted > state.fleetPausesReadAt else { return }
            state.fleetPauses.removeAll { pause in
                jobs.contains { pause.matches(credential: $0.credential, topic: $0.topic) }
            }
        }
    }
}
