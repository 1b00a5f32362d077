import Foundation
import Logging
import PushQueue
import Synchronization

/// Collects outcomes from the senders and writes them in batches (every few milliseconds, or at once
/// when a batch fills). A failed write keeps the outcomes and retries with backoff: nothing is dropped
/// while the process lives, and after a crash the reaper returns unrecorded jobs (same apns_id).
final class OutcomeRecorder: Sendable {
    private let buffer = Mutex<[JobOutcome]>([])
    private let signal = WakeSignal()
    private let stopped = Mutex<ContinuousClock.Instant?>(nil)
    let queue: JobQueue
    let workerID: String
    let batchSize: Int
    let interval: Duration
    let logger: Logger
    let onRecorded: @Sendable (RecordResult, [JobOutcome]) -> Void

    init(queue: JobQueue, workerID: String, batchSize: Int, interval: Duration, logger: Logger, onRecorded: @escaping @Sendable (RecordResult, [JobOutcome]) -> Void) {
        self.queue = queue
        self.workerID = workerID
        self.batchSize = batchSize
        self.interval = interval
        self.logger = logger
        self.onRecorded = onRecorded
    }

    /// Outcomes waiting to be written.
    var pending: Int { self.buffer.withLock { $0.count } }

    func add(_ outcome: JobOutcome) {
        let count = self.buffer.withLock { buffer in
            buffer.append(outcome)
            return buffer.count
        }
        if count == 1 || count >= self.batchSize { self.signal.signal() }
    }

    /// Writes until ``stop(giveUpAfter:)``, then writes what is left.
    func run() async {
        var backoff = Duration.milliseconds(100)
        while true {
            let giveUpAt = self.stopped.withLock { $0 }
            let stopping = giveUpAt != nil
            if let giveUpAt, ContinuousClock.now > giveUpAt, self.pending > 0 {
                self.logger.error("could not write the last outcomes before the shutdown deadline; the reaper will return those jobs (same apns_id)", metadata: ["push.outcomes": "\(self.pending)"])
                return
            }
            if self.pending == 0 {
                if stopping { return }
                _ = await self.signal.wait(timeout: .seconds(1))
                continue
            }
            if !stopping && self.pending < self.batchSize { try? await Task.sleep(for: self.interval) }
            if await self.flush() {
                backoff = .milliseconds(100)
            } else {
                try? await Task.sleep(for: backoff)
                backoff = min(backoff * 2, .seconds(5))
            }
        }
    }

    /// Stops after writing what is left, or after `deadline` if the database keeps refusing.
    func stop(giveUpAfter deadline: Duration) {
        self.stopped.withLock { $0 = .now + deadline }
        self.signal.signal()
    }

    /// Writes one batch; returns false (keeping the outcomes) when the database refused.
    private func flush() async -> Bool {
        let batch = self.buffer.withLock { buffer -> [JobOutcome] in
            let count = min(buffer.count, self.batchSize * 2)
            defer { buffer.removeFirst(count) }
            return Array(buffer.prefix(count))
        }
        guard !batch.isEmpty else { return true }
        do {
            let result = try await self.queue.record(batch, workerID: self.workerID)
            if !result.fenced.isEmpty {
                self.logger.warning("outcomes refused by the fence: another worker holds those jobs now", metadata: ["push.jobs": "\(result.fenced.count)"])
            }
            self.onRecorded(result, batch)
            return true
        } catch {
            self.buffer.withLock { $0.insert(contentsOf: batch, at: 0) }
            self.logger.error("could not write outcomes; keeping them and retrying", metadata: ["push.outcomes": "\(batch.count)", "push.error": "\(QueueError.summary(of: error))"])
            return false
        }
    }
}
