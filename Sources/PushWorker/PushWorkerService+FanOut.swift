import Foundation
import PushCore
import PushQueue

/// Recipients' jobs: claimed like any job, never sent themselves. Each becomes one child job per live device
/// of its recipient (``JobQueue/fanOut(_:workerID:)``), which any worker then claims and sends.
extension PushWorkerService {
    /// Fans out claimed recipients' jobs in one statement; they are no longer held afterwards. If the statement
    /// fails, they stay `running` until their lease ends and are claimed again (a fan-out that did commit
    /// left them `fanned_out`: nothing happens twice).
    func fanOut(_ parents: [PushJob]) async {
        let queue = self.queue
        let workerID = self.configuration.workerID
        do {
            let results = try await withDeadline(self.configuration.statementDeadline, "the fan-out") {
                try await queue.fanOut(parents, workerID: workerID)
            }
            self.databaseAnswered()
            let children = results.reduce(0) { $0 + $1.children.count }
            self.logger.debug(
                "recipients' jobs fanned out",
                metadata: [
                    "push.jobs": "\(parents.count)", "push.children": "\(children)",
                    "push.no_device": "\(results.filter { $0.state == "dead" }.count)",
                ]
            )
        } catch {
            self.databaseFailed(error)
            self.logger.error(
                "could not fan out recipients' jobs; they are claimed again when their lease ends",
                metadata: ["push.jobs": "\(parents.count)", "push.error": "\(QueueError.summary(of: error))"]
            )
        }
        let wakes = self.state.withLock { state in
            for _ in parents { state.capacity.sendFinished() }
            state.capacity.released(parents.map(\.id))
            return state.shuttingDown || state.capacity.claimLimit() != nil
        }
        if wakes { self.sendEnded.signal() }
    }
}
