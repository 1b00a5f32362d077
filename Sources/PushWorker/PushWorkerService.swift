public import APNsTransport
import Foundation
public import Logging
public import PostgresNIO
public import PushQueue
import PushCore
import Synchronization

/// The worker: claims jobs up to its free send capacity, sends them, records outcomes in batches,
/// reclaims expired leases, prunes delivered rows, and wakes on NOTIFY, on its poll timer, or when the
/// earliest scheduled retry falls due. No transaction is held across a send.
public final class PushWorkerService: Sendable {
    let configuration: WorkerConfiguration
    let queue: JobQueue
    let client: APNsClient
    let listenerConfiguration: PostgresConnection.Configuration?
    let logger: Logger
    let processor: JobProcessor
    let pauses: CredentialPauses
    let wake = WakeSignal()
    let capacity = WakeSignal()
    let metrics = WorkerMetrics()
    private let lastDatabaseSuccess = Mutex(ContinuousClock.now)
    private let state = Mutex(State())
    let stats = Mutex(WorkerStats())

    struct State {
        var shuttingDown = false
        var inFlight = 0
        /// Jobs claimed and not yet recorded: their leases are extended while they wait or send.
        var held: Set<Int64> = []
    }

    /// Counters since start, for logs and tests.
    public struct WorkerStats: Sendable {
        public var claimed = 0
        public var delivered = 0
        public var retried = 0
        public var dead = 0
        public var requeued = 0
        public var fenced = 0
    }

    /// - Parameters:
    ///   - listenerConfiguration: the dedicated LISTEN connection's configuration; `nil` polls only.
    public init(configuration: WorkerConfiguration, queue: JobQueue, client: APNsClient, listenerConfiguration: PostgresConnection.Configuration?, logger: Logger) {
        self.configuration = configuration
        self.queue = queue
        self.client = client
        self.listenerConfiguration = listenerConfiguration
        self.logger = logger
        self.processor = JobProcessor(client: client, retry: configuration.retry, environment: ProcessInfo.processInfo.environment, logger: logger)
        self.pauses = CredentialPauses(initial: configuration.credentialPause, maximum: configuration.maximumCredentialPause)
    }

    /// Counters since start.
    public var counters: WorkerStats { self.stats.withLock { $0 } }

    /// Stops claiming; in-flight sends finish within the grace period, outcomes are flushed, and
    /// ``run()`` returns.
    public func shutdown() {
        self.state.withLock { $0.shuttingDown = true }
        self.wake.signal()
        self.capacity.signal()
    }

    var isShuttingDown: Bool { self.state.withLock { $0.shuttingDown } }

    /// Readiness: not draining, and Postgres answered a claim recently.
    public var isReady: Bool {
        let quietFor = ContinuousClock.now - self.lastDatabaseSuccess.withLock { $0 }
        return !self.isShuttingDown && quietFor < self.configuration.pollInterval * 3 + .seconds(10)
    }

    /// Sets the `push_worker_ready` gauge from ``isReady``; call it before each scrape.
    public func recordReadiness() {
        self.metrics.ready.record(self.isReady ? 1 : 0)
    }

    /// Runs until ``shutdown()`` (or cancellation), then drains.
    public func run() async {
        let recorder = OutcomeRecorder(
            queue: self.queue, workerID: self.configuration.workerID, batchSize: self.configuration.batchSize,
            interval: self.configuration.recordInterval, logger: self.logger
        ) { result, batch in
            let recorded = Set(result.recorded)
            self.stats.withLock { stats in
                stats.fenced += result.fenced.count
                for outcome in batch where recorded.contains(outcome.jobID) {
                    switch outcome.disposition {
                    case .delivered: stats.delivered += 1
                    case .retry: stats.retried += 1
                    case .dead: stats.dead += 1
                    case .requeue: stats.requeued += 1
                    }
                }
            }
        }
        self.logger.info("worker started", metadata: ["push.worker": "\(self.configuration.workerID)", "push.concurrency": "\(self.configuration.concurrency)"])
        await withTaskGroup(of: Void.self) { background in
            if let listenerConfiguration = self.listenerConfiguration {
                background.addTask {
                    await JobNotificationListener(configuration: listenerConfiguration, signal: self.wake, logger: self.logger).run()
                }
            }
            background.addTask { await self.maintenanceLoop() }
            background.addTask { await self.leaseHeartbeat() }
            await withTaskGroup(of: Void.self) { core in
                core.addTask { await recorder.run() }
                await self.claimLoop(recorder: recorder)
                // The recorder writes what is left, then returns; this group waits for it.
                recorder.stop(giveUpAfter: self.configuration.shutdownGrace)
            }
            background.cancelAll()
        }
        self.logger.info("worker stopped", metadata: ["push.worker": "\(self.configuration.workerID)"])
    }

    func claimLoop(recorder: OutcomeRecorder) async {
        let configuration = self.configuration
        var failures = 0
        // Discarding: a plain task group keeps every finished send until the group ends (memory grows per job).
        await withDiscardingTaskGroup { sends in
            while !self.isShuttingDown && !Task.isCancelled {
                let free = configuration.concurrency - self.state.withLock { $0.inFlight }
                // Claim in whole batches where possible: wait for capacity rather than claiming crumbs.
                if free < min(configuration.batchSize, configuration.concurrency) / 2 {
                    _ = await self.capacity.wait(timeout: .milliseconds(100))
                    continue
                }
                let limit = min(free, configuration.batchSize)
                let jobs: [PushJob]
                do {
                    jobs = try await self.queue.claim(limit: limit, workerID: configuration.workerID, lease: configuration.lease, excludingCredentials: self.pauses.active())
                    failures = 0
                    self.lastDatabaseSuccess.withLock { $0 = .now }
                } catch {
                    failures += 1
                    let delay = Duration.milliseconds(min(100 << min(failures, 9), 30_000))
                    self.logger.error("could not claim jobs; retrying", metadata: ["push.error": "\(QueueError.summary(of: error))", "push.retry_in": "\(delay)"])
                    _ = await self.wake.wait(timeout: delay)
                    continue
                }
                if !jobs.isEmpty {
                    self.state.withLock { state in
                        state.inFlight += jobs.count
                        state.held.formUnion(jobs.map(\.id))
                    }
                    self.stats.withLock { $0.claimed += jobs.count }
                }
                for job in jobs {
                    sends.addTask {
                        let result = await self.processor.process(job) { credential, reason in
                            let (until, isNew) = self.pauses.pause(credential)
                            if isNew {
                                self.logger.error("APNs refused credential '\(credential)' (\(reason)): its jobs stay pending until \(until); fix the key configuration", metadata: ["push.credential": "\(credential)", "push.reason": "\(reason)"])
                            }
                            return until
                        }
                        if case .delivered = result.outcome.disposition { self.pauses.succeeded(job.credential) }
                        self.metrics.record(result.outcome)
                        recorder.add(result.outcome)
                        self.state.withLock { state in
                            state.inFlight -= 1
                            state.held.remove(job.id)
                        }
                        self.capacity.signal()
                    }
                }
                if jobs.count == limit { continue }
                // Not a full batch: sleep until a NOTIFY, the earliest scheduled job, or the poll timer.
                var timeout = configuration.pollInterval
                if let next = try? await self.queue.nextDueAt() {
                    let untilNext = Duration.milliseconds(max(Int64(next.timeIntervalSinceNow * 1000), 0) + 1)
                    if next.timeIntervalSinceNow > 0 { timeout = min(timeout, untilNext) }
                }
                _ = await self.wake.wait(timeout: timeout)
            }
            // Draining: let in-flight sends finish within the grace period, then cancel them (their jobs
            // stay running until the reaper returns them, with the same apns_id).
            let grace = configuration.shutdownGrace
            let deadline = ContinuousClock.now + grace
            while self.state.withLock({ $0.inFlight }) > 0 && ContinuousClock.now < deadline {
                _ = await self.capacity.wait(timeout: .milliseconds(50))
            }
            if self.state.withLock({ $0.inFlight }) > 0 {
                self.logger.warning("shutdown grace period over; leaving in-flight jobs to the reaper", metadata: ["push.jobs": "\(self.state.withLock { $0.inFlight })"])
                sends.cancelAll()
            }
        }
    }

    /// Extends the leases of the jobs this worker holds, every third of a lease, so a job waiting for a
    /// stream or a slow answer is not reclaimed (and sent twice) while its worker is alive.
    func leaseHeartbeat() async {
        while !Task.isCancelled {
            try? await Task.sleep(for: self.configuration.lease / 3)
            let held = Array(self.state.withLock { $0.held })
            guard !held.isEmpty else { continue }
            do {
                try await self.queue.extendLeases(held, workerID: self.configuration.workerID, lease: self.configuration.lease)
            } catch {
                self.logger.warning("could not extend leases; jobs may be reclaimed by the reaper", metadata: ["push.jobs": "\(held.count)", "push.error": "\(QueueError.summary(of: error))"])
            }
        }
    }

    /// Reclaims expired leases, prunes delivered rows and refreshes the queue gauges on their timers.
    func maintenanceLoop() async {
        var lastPrune = ContinuousClock.now
        var lastStats = ContinuousClock.now - .seconds(3600)
        while !Task.isCancelled {
            try? await Task.sleep(for: self.configuration.reaperInterval)
            if Task.isCancelled { return }
            do {
                let reaped = try await self.queue.reapExpiredLeases()
                if !reaped.isEmpty {
                    self.logger.warning("reclaimed jobs whose lease expired", metadata: ["push.jobs": "\(reaped.count)"])
                    self.wake.signal()
                }
                self.metrics.connections.record(self.client.openConnections)
                self.metrics.jwtMints.record(self.client.mintCount)
                self.metrics.pausedCredentials.record(self.pauses.active().count)
                if ContinuousClock.now - lastStats >= .seconds(15) {
                    lastStats = .now
                    self.metrics.record(try await self.queue.stats())
                }
                if ContinuousClock.now - lastPrune >= self.configuration.pruneInterval {
                    lastPrune = .now
                    let pruned = try await self.queue.pruneDelivered(olderThan: self.configuration.retention)
                    if pruned > 0 { self.logger.info("pruned delivered jobs past retention", metadata: ["push.jobs": "\(pruned)"]) }
                }
            } catch {
                self.logger.warning("maintenance query failed; will retry", metadata: ["push.error": "\(QueueError.summary(of: error))"])
            }
        }
    }
}
