import Foundation
import PushCore
import PushQueue

/// Recipients' jobs: claimed like any job, never sent themselves. Each becomes one child job per live device
/// of its recipient (``JobQueue/fanOut(_:workerID:claimingUpTo:lease:)``). The children nothing could hold
/// back (no key, no pause or limit on the topic, no provider this worker avoids) are claimed by this worker
/// in the same transaction and sent at once; the rest wait, `pending`, for any worker's claim.
extension PushWorkerService {
    /// Fans out claimed recipients' jobs in one statement; they are no longer held afterwards. The children it
    /// claimed for this worker are held from here like a claim's jobs, and sent as room allows (at most
    /// `--concurrency` sends started and not finished). If the statement fails, the parents stay `running`
    /// until their lease ends and are claimed again (a fan-out that did commit left them `fanned_out`:
    /// nothing happens twice). If Postgres refuses it (a rule the children's insert breaks), each parent is
    /// tried alone, and one refused alone becomes a dead letter naming the refusal: tried again as it is, it
    /// would fail for ever and hold up the others of its batch.
    func fanOut(_ parents: [PushJob]) async {
        // Up to twice `--concurrency` jobs held by this worker in all, none while a switch to a new primary is
        // under way or the heartbeat is stale; a child of a provider, credential or topic the worker avoids
        // now is left out, as its claim would leave it. The rest wait, pending, for a claim.
        let (limit, epoch) = self.state.withLock { state in
            let room = state.capacity.concurrency * 2 - (state.capacity.held.count - parents.count)
            return (state.switching || state.shuttingDown ? 0 : max(room, 0), state.switchEpoch)
        }
        let (refused, claimed) = await self.fanOutOrIsolate(
            parents,
            claimingUpTo: self.heartbeatFresh ? limit : 0,
            excluding: self.claimExclusions()
        )
        let claimedAt = self.clock.wallNow
        for (job, why) in refused {
            self.recorder.add(
                JobOutcome(
                    jobID: job.id,
                    attempt: job.attempts,
                    disposition: .dead(
                        sentence:
                            "this recipient's job could not fan out to its devices: Postgres refused its children (\(why)); fix the job and replay it."
                    ),
                    attemptedAt: self.clock.now,
                    reason: "FanOutRefused",
                    sent: false
                )
            )
        }
        let dead = Set(refused.map(\.0.id))
        let (wakes, current) = self.state.withLock { state in
            // Held before the parents are let go: the claim never sees room that is not there.
            let current = state.switchEpoch == epoch
            if current && !claimed.isEmpty { state.capacity.claimedDeferred(claimed.map(\.id)) }
            for _ in parents { state.capacity.sendFinished() }
            // A dead letter's job stays held until the outcome writer has written it.
            state.capacity.released(parents.map(\.id).filter { !dead.contains($0) })
            return (state.shuttingDown || state.capacity.claimLimit() != nil, current)
        }
        if wakes { self.sendEnded.signal() }
        guard current else {
            // Claimed across a switch to a new primary: not sent, and pending again, uncounted, by their own
            // ids (releasing "what this worker does not hold" would catch another statement's jobs between
            // its commit and its hold).
            await self.release(claimed)
            return
        }
        guard !claimed.isEmpty else { return }
        self.stats.withLock { $0.claimed += claimed.count }
        // As room comes free: the sends started and not finished stay within `--concurrency`.
        var rest = claimed[...]
        await withDiscardingTaskGroup { sends in
            while !rest.isEmpty && !Task.isCancelled {
                let count = self.state.withLock { $0.capacity.startDeferred(upTo: rest.count) }
                guard count > 0 else {
                    _ = await self.deferredRoom.wait(timeout: .milliseconds(100), clock: self.clock)
                    continue
                }
                let chunk = Array(rest.prefix(count))
                rest = rest.dropFirst(count)
                sends.addTask { await self.send(chunk, claimedAt: claimedAt) }
            }
        }
        guard !rest.isEmpty else { return }
        // The worker stops (its grace is over) before these went out: pending again, uncounted, at once.
        let unsent = Array(rest)
        self.state.withLock { $0.capacity.abandonDeferred(unsent.map(\.id)) }
        await self.release(unsent)
    }

    /// Claimed jobs never sent back to pending as if never claimed (the attempt not counted).
    private func release(_ jobs: [PushJob]) async {
        guard !jobs.isEmpty else { return }
        let released = try? await self.queue.release(
            jobs.map { (id: $0.id, attempt: $0.attempts) },
            workerID: self.configuration.workerID
        )
        self.logger.notice(
            "children of a fan-out not sent: pending again",
            metadata: ["push.jobs": "\(jobs.count)", "push.released": "\(released ?? 0)"]
        )
    }

    /// One fan-out statement for `parents`; returns those Postgres refuses alone, with its words, and the
    /// children claimed.
    private func fanOutOrIsolate(
        _ parents: [PushJob],
        claimingUpTo limit: Int,
        excluding: ClaimExclusions
    ) async -> (refused: [(PushJob, String)], claimed: [PushJob]) {
        let queue = self.queue
        let (workerID, lease) = (self.configuration.workerID, self.configuration.lease)
        do {
            let batch = try await withDeadline(self.configuration.statementDeadline, "the fan-out") {
                try await queue.fanOut(
                    parents,
                    workerID: workerID,
                    claimingUpTo: limit,
                    lease: lease,
                    excluding: excluding
                )
            }
            self.databaseAnswered()
            self.logger.debug(
                "recipients' jobs fanned out",
                metadata: [
                    "push.jobs": "\(parents.count)",
                    "push.children": "\(batch.parents.reduce(0) { $0 + $1.children.count })",
                    "push.claimed": "\(batch.claimed.count)",
                    "push.no_device": "\(batch.parents.filter { $0.state == "dead" }.count)",
                ]
            )
            return ([], batch.claimed)
        } catch {
            self.databaseFailed(error)
            guard QueueError.isRefusedForTheRows(error) else {
                self.logger.error(
                    "could not fan out recipients' jobs; they are claimed again when their lease ends",
                    metadata: ["push.jobs": "\(parents.count)", "push.error": "\(QueueError.summary(of: error))"]
                )
                return ([], [])
            }
            guard parents.count > 1 else { return ([(parents[0], QueueError.summary(of: error))], []) }
            self.logger.warning(
                "Postgres refused a fan-out of recipients' jobs; trying each alone",
                metadata: ["push.jobs": "\(parents.count)", "push.error": "\(QueueError.summary(of: error))"]
            )
            var refused: [(PushJob, String)] = []
            var claimed: [PushJob] = []
            for parent in parents {
                let alone = await self.fanOutOrIsolate(
                    [parent],
                    claimingUpTo: max(limit - claimed.count, 0),
                    excluding: excluding
                )
                refused += alone.refused
                claimed += alone.claimed
            }
            return (refused, claimed)
        }
    }
}
