import Foundation
import Logging
import PushCore
import PushQueue
import Synchronization

/// Collects outcomes from the senders and writes them in batches (every few milliseconds, or at once
/// when a batch fills).
///
/// An outcome is never lost and never wedges the rest: when Postgres refuses a batch (a value it cannot
/// store), the batch is split down to the row that fails, and that row alone is written by the last
/// resort (``JobQueue/deadLetterUnwritable(_:workerID:sentence:)``). A lost connection keeps every outcome
/// and retries with backoff. The jobs stay held (their leases extended) until their outcome is written.
final class OutcomeWriter: Sendable {
    /// What one write did, for the service's bookkeeping.
    struct Report: Sendable {
        var written: [JobOutcome] = []
        var fenced: [JobOutcome] = []
        var unwritable: [JobOutcome] = []
        /// Outcomes not even the last resort could write: set aside, their jobs let go.
        var parked: [JobOutcome] = []
    }

    private struct Waiting {
        var outcome: JobOutcome
        var added: ContinuousClock.Instant
    }

    private let buffer = Mutex<[Waiting]>([])
    private let signal = WakeSignal()
    private let stopped = Mutex<ContinuousClock.Instant?>(nil)
    /// When the oldest outcome of the batch being written now was added (it left the buffer).
    private let writing = Mutex<ContinuousClock.Instant?>(nil)
    let queue: JobQueue
    let workerID: String
    let batchSize: Int
    let interval: Duration
    /// How long one write may take before the connection is given up and the batch tried again.
    let statementDeadline: Duration
    let logger: Logger
    let metrics: WorkerMetrics
    let clock: any PushClock
    let onWritten: @Sendable (Report) -> Void

    init(
        queue: JobQueue,
        workerID: String,
        batchSize: Int,
        interval: Duration,
        statementDeadline: Duration = .seconds(30),
        logger: Logger,
        metrics: WorkerMetrics,
        clock: any PushClock,
        onWritten: @escaping @Sendable (Report) -> Void
    ) {
        self.queue = queue
        self.workerID = workerID
        self.batchSize = batchSize
        self.interval = interval
        self.statementDeadline = statementDeadline
        self.logger = logger
        self.metrics = metrics
        self.clock = clock
        self.onWritten = onWritten
    }

    /// Outcomes waiting to be written.
    var pending: Int { self.buffer.withLock { $0.count } }

    /// How long the oldest unwritten outcome has waited (zero when none waits).
    var oldestWaiting: Duration {
        let buffered = self.buffer.withLock { $0.first?.added }
        let inFlight = self.writing.withLock { $0 }
        guard let oldest = [buffered, inFlight].compactMap({ $0 }).min() else { return .zero }
        return self.clock.now - oldest
    }

    func add(_ outcome: JobOutcome) {
        let now = self.clock.now
        let count = self.buffer.withLock { buffer in
            buffer.append(Waiting(outcome: outcome, added: now))
            return buffer.count
        }
        self.metrics.outcomeBacklog.record(count)
        if count == 1 || count >= self.batchSize { self.signal.signal() }
    }

    /// Writes until ``stop(giveUpAfter:)``, then writes what is left.
    func run() async {
        var backoff = Duration.milliseconds(100)
        while true {
            let giveUpAt = self.stopped.withLock { $0 }
            let stopping = giveUpAt != nil
            if let giveUpAt, self.clock.now > giveUpAt, self.pending > 0 {
                self.logger.error(
                    "could not write the last outcomes before the shutdown deadline; those jobs return to pending when this worker's heartbeat goes stale (same apns_id)",
                    metadata: ["push.outcomes": "\(self.pending)"]
                )
                return
            }
            if self.pending == 0 {
                if stopping { return }
                _ = await self.signal.wait(timeout: .seconds(1), clock: self.clock)
                continue
            }
            if !stopping && self.pending < self.batchSize { try? await self.clock.sleep(for: self.interval) }
            if await self.flush() {
                backoff = .milliseconds(100)
            } else {
                try? await self.clock.sleep(for: backoff)
                backoff = min(backoff * 2, .seconds(5))
            }
        }
    }

    /// Stops after writing what is left, or after `deadline` if the database keeps refusing.
    func stop(giveUpAfter deadline: Duration) {
        let giveUpAt = self.clock.now + deadline
        self.stopped.withLock { $0 = giveUpAt }
        self.signal.signal()
    }

    /// Writes one batch; returns false (keeping what could not be written) when the database is unreachable.
    private func flush() async -> Bool {
        let batch = self.buffer.withLock { buffer -> [Waiting] in
            let count = min(buffer.count, self.batchSize * 2)
            defer { buffer.removeFirst(count) }
            return Array(buffer.prefix(count))
        }
        guard !batch.isEmpty else { return true }
        self.writing.withLock { $0 = batch.map(\.added).min() }
        defer { self.writing.withLock { $0 = nil } }
        var report = Report()
        let kept = await self.write(batch, report: &report)
        if !kept.isEmpty { self.buffer.withLock { $0.insert(contentsOf: kept, at: 0) } }
        self.metrics.outcomeBacklog.record(self.pending)
        if !report.fenced.isEmpty {
            self.metrics.fencedOutcomes.increment(by: report.fenced.count)
            // A fenced 200: APNs delivered this push and another worker sent (or will send) it again.
            let deliveries = report.fenced.filter { $0.disposition == .delivered }.count
            if deliveries > 0 { self.metrics.fencedDeliveries.increment(by: deliveries) }
            self.logger.warning(
                "outcomes refused by the fence: another worker re-claimed those jobs, or they were superseded",
                metadata: ["push.jobs": "\(report.fenced.count)", "push.delivered": "\(deliveries)"]
            )
        }
        self.onWritten(report)
        // Progress made: no backoff, even if something waits for the database.
        return kept.isEmpty || kept.count < batch.count
    }

    /// Writes `batch`, splitting it when Postgres refuses it; returns what must wait for the database.
    private func write(_ batch: [Waiting], report: inout Report) async -> [Waiting] {
        let outcomes = batch.map(\.outcome)
        do {
            let (queue, workerID) = (self.queue, self.workerID)
            let result = try await withDeadline(self.statementDeadline, "the outcome write") {
                try await queue.writeOutcomes(outcomes, workerID: workerID)
            }
            let written = Set(result.recorded)
            for outcome in outcomes {
                if written.contains(outcome.jobID) {
                    report.written.append(outcome)
                } else {
                    report.fenced.append(outcome)
                }
            }
            return []
        } catch  where QueueError.isRefusedByServer(error) {
            self.metrics.outcomeWriteFailures.increment()
            if batch.count > 1 {
                // Isolate the poison: the halves that Postgres accepts are written now.
                let middle = batch.count / 2
                let first = await self.write(Array(batch[..<middle]), report: &report)
                let second = await self.write(Array(batch[middle...]), report: &report)
                return first + second
            }
            return await self.writeUnwritable(batch[0], error: error, report: &report)
        } catch {
            self.metrics.outcomeWriteFailures.increment()
            self.logger.error(
                "could not write outcomes; keeping them and retrying",
                metadata: ["push.outcomes": "\(batch.count)", "push.error": "\(QueueError.summary(of: error))"]
            )
            return batch
        }
    }

    private func writeUnwritable(_ waiting: Waiting, error: any Error, report: inout Report) async -> [Waiting] {
        let outcome = waiting.outcome
        let summary = QueueError.summary(of: error)
        let sentence =
            "the worker could not write this job's outcome (\(outcome.disposition.name)\(outcome.reason.map { ", \($0)" } ?? "")): Postgres refused it (\(summary)). It was moved here so nothing is lost, without the side effect that failed (such as the invalid-token row); fix the row and replay it if it is still worth sending."
        self.logger.error(
            "Postgres refused one job's outcome; writing it as a dead letter without its side effects",
            metadata: ["push.job_id": "\(outcome.jobID)", "push.error": "\(summary)"]
        )
        do {
            if try await self.queue.deadLetterUnwritable(outcome, workerID: self.workerID, sentence: sentence) {
                self.metrics.unwritableOutcomes.increment()
                report.unwritable.append(outcome)
            } else {
                report.fenced.append(outcome)
            }
            return []
        } catch  where QueueError.isRefusedByServer(error) {
            // Not even the last resort can be stored (a trigger or constraint on the tables themselves):
            // set it aside so it cannot slow the rest; the job's lease lapses and it returns to pending.
            self.metrics.unwritableOutcomes.increment()
            self.logger.critical(
                "Postgres refused even the last-resort write of one outcome; letting the job go back to pending when its lease lapses",
                metadata: ["push.job_id": "\(outcome.jobID)", "push.error": "\(QueueError.summary(of: error))"]
            )
            report.parked.append(outcome)
            return []
        } catch {
            self.logger.error(
                "could not write the last-resort outcome; keeping it",
                metadata: ["push.job_id": "\(outcome.jobID)", "push.error": "\(QueueError.summary(of: error))"]
            )
            return [waiting]
        }
    }
}
