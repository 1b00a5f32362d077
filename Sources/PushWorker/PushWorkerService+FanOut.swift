import Foundation
import PushCore
import PushQueue

/// Recipients' jobs: claimed like any job, never sent themselves. Each becomes one child job per live device
/// of its recipient (``JobQueue/fanOut(_:workerID:)``), which any worker then claims and sends.
extension PushWorkerService {
    /// Fans out claimed recipients' jobs in one statement; they are no longer held afterwards. If the statement
    /// fails, they stay `running` until their lease ends and are claimed again (a fan-out that did commit
    /// left them `fanned_out`: nothing happens twice). If Postgres refuses it (a rule the children's insert
    /// breaks), each parent is tried alone, and one refused alone becomes a dead letter naming the refusal:
    /// tried again as it is, it would fail for ever and hold up the others of its batch.
    func fanOut(_ parents: [PushJob]) async {
        let refused = await self.fanOutOrIsolate(parents)
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
        let wakes = self.state.withLock { state in
            for _ in parents { state.capacity.sendFinished() }
            // A dead letter's job stays held until the outcome writer has written it.
            state.capacity.released(parents.map(\.id).filter { !dead.contains($0) })
            return state.shuttingDown || state.capacity.claimLimit() != nil
        }
        if wakes { self.sendEnded.signal() }
    }

    /// One fan-out statement for `parents`; returns those Postgres refuses alone, with its words.
    private func fanOutOrIsolate(_ parents: [PushJob]) async -> [(PushJob, String)] {
        let queue = self.queue
        let workerID = self.configuration.workerID
        do {
            let results = try await withDeadline(self.configuration.statementDeadline, "the fan-out") {
                try await queue.fanOut(parents, workerID: workerID)
            }
            self.databaseAnswered()
            self.logger.debug(
                "recipients' jobs fanned out",
                metadata: [
                    "push.jobs": "\(parents.count)", "push.children": "\(results.reduce(0) { $0 + $1.children.count })",
                    "push.no_device": "\(results.filter { $0.state == "dead" }.count)",
                ]
            )
            return []
        } catch {
            self.databaseFailed(error)
            guard QueueError.isRefusedForTheRows(error) else {
                self.logger.error(
                    "could not fan out recipients' jobs; they are claimed again when their lease ends",
                    metadata: ["push.jobs": "\(parents.count)", "push.error": "\(QueueError.summary(of: error))"]
                )
                return []
            }
            guard parents.count > 1 else { return [(parents[0], QueueError.summary(of: error))] }
            self.logger.warning(
                "Postgres refused a fan-out of recipients' jobs; trying each alone",
                metadata: ["push.jobs": "\(parents.count)", "push.error": "\(QueueError.summary(of: error))"]
            )
            var refused: [(PushJob, String)] = []
            for parent in parents { refused += await self.fanOutOrIsolate([parent]) }
            return refused
        }
    }
}
