import Foundation
import PushCore
import PushQueue

/// Live Activity events: claimed like any job, never sent themselves. Each is routed under its activity's row
/// lock (``JobQueue/routeActivities(_:workerID:)``, by PushCore's ``ActivityRouting``): to child jobs for its
/// targets, which any worker then claims and sends; superseded when stale or after the activity's end; or
/// claimed again shortly while the activity's previous request may be in flight.
extension PushWorkerService {
    /// How soon an event waiting for its activity's request in flight is claimed again.
    static var activityWait: Duration { .milliseconds(250) }

    /// Routes claimed Live Activity events in one transaction; they are no longer held afterwards, except
    /// those handed to the outcome writer (waiting: requeued uncounted; refused: dead letters). If the
    /// transaction fails, they stay `running` until their lease ends and are claimed again.
    func routeActivities(_ events: [PushJob]) async {
        let queue = self.queue
        let workerID = self.configuration.workerID
        var recorded: Set<Int64> = []
        do {
            let result = try await withDeadline(self.configuration.statementDeadline, "the Live Activity routing") {
                try await queue.routeActivities(events, workerID: workerID)
            }
            self.databaseAnswered()
            let byID = Dictionary(events.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
            // Handed to the outcome writer, unsent: waiting (requeued, uncounted) or refused (dead letters).
            let unsent =
                result.waiting.map { ($0, Decision.requeue(after: Self.activityWait), "ActivityInFlight") }
                + result.refused.sorted { $0.key < $1.key }.map {
                    ($0.key, Decision.dead(sentence: $0.value.sentence), $0.value.reason)
                }
            for (id, disposition, reason) in unsent {
                guard let job = byID[id] else { continue }
                recorded.insert(id)
                self.recorder.add(
                    JobOutcome(
                        jobID: id,
                        attempt: job.attempts,
                        disposition: disposition,
                        attemptedAt: self.clock.now,
                        reason: reason,
                        sent: false
                    )
                )
            }
            for (topic, count) in result.demoted { self.metrics.activityUpdatesDemoted(topic: topic, count: count) }
            self.logger.debug(
                "Live Activity events routed",
                metadata: [
                    "push.jobs": "\(events.count)", "push.routed": "\(result.routed.count)",
                    "push.superseded": "\(result.superseded.count)", "push.waiting": "\(result.waiting.count)",
                    "push.refused": "\(result.refused.count)",
                ]
            )
        } catch {
            self.databaseFailed(error)
            self.logger.error(
                "could not route Live Activity events; they are claimed again when their lease ends",
                metadata: ["push.jobs": "\(events.count)", "push.error": "\(QueueError.summary(of: error))"]
            )
        }
        let wakes = self.state.withLock { state in
            for _ in events { state.capacity.sendFinished() }
            // One handed to the outcome writer stays held until it is written.
            state.capacity.released(events.map(\.id).filter { !recorded.contains($0) })
            return state.shuttingDown || state.capacity.claimLimit() != nil
        }
        if wakes { self.sendEnded.signal() }
    }
}
