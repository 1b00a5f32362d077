public import APNsTransport
import Foundation
public import Logging
public import PostgresNIO
import PushCore
public import PushQueue
import Synchronization

/// The worker: claims jobs up to its free send capacity, sends them, records outcomes in batches, keeps
/// a heartbeat, reclaims the jobs of workers that are gone, prunes delivered rows, and wakes on NOTIFY,
/// on its poll timer, or when the earliest scheduled retry falls due. No transaction is held across a send.
public final class PushWorkerService: Sendable {
    let configuration: WorkerConfiguration
    let queue: JobQueue
    let client: APNsClient
    let listenerConfiguration: PostgresConnection.Configuration?
    let logger: Logger
    let processor: JobProcessor
    let pauses: CredentialPauses
    /// Environments whose APNs endpoint could not be reached: their jobs are not claimed for a while.
    let unreachable: CredentialPauses
    let wake = WakeSignal()
    let capacity = WakeSignal()
    let metrics = WorkerMetrics()
    let recorder: OutcomeRecorder
    private let lastDatabaseSuccess = Mutex(ContinuousClock.now)
    private let state = Locked(State())
    let stats = Locked(WorkerStats())

    struct State {
        var shuttingDown = false
        var inFlight = 0
        /// Jobs claimed and not yet written back: their leases are extended until their outcome is written.
        var held: Set<Int64> = []
        /// The last heartbeat Postgres took; sends start only while it is fresh.
        var lastHeartbeat: ContinuousClock.Instant?
        /// When this worker may first take other workers for gone: a stale period after it started, a
        /// reconnect grace after it was cut off from Postgres (the others were cut off too and check in
        /// as their pools reconnect). `nil` while cut off.
        var reapAllowedAfter: ContinuousClock.Instant?
        /// Whether a heartbeat failed since the last success.
        var cutOff = false
        /// The client's not-processed count at the last scrape (the metric counts the difference).
        var notProcessedReported = 0
    }

    /// Counters since start, for logs and tests.
    public struct WorkerStats: Sendable {
        public var claimed = 0
        public var delivered = 0
        public var retried = 0
        public var dead = 0
        public var requeued = 0
        public var transportRetried = 0
        public var fenced = 0
        public var unwritable = 0
    }

    /// - Parameters:
    ///   - listenerConfiguration: the dedicated LISTEN connection's configuration; `nil` polls only.
    public init(
        configuration: WorkerConfiguration,
        queue: JobQueue,
        client: APNsClient,
        listenerConfiguration: PostgresConnection.Configuration?,
        logger: Logger
    ) {
        self.configuration = configuration
        self.queue = queue
        self.client = client
        self.listenerConfiguration = listenerConfiguration
        self.logger = logger
        self.processor = JobProcessor(
            client: client,
            retry: configuration.retry,
            transportBudget: configuration.transportBudget,
            environment: ProcessInfo.processInfo.environment,
            logger: logger
        )
        self.pauses = CredentialPauses(
            initial: configuration.credentialPause,
            maximum: configuration.maximumCredentialPause
        )
        self.unreachable = CredentialPauses(initial: .seconds(1), maximum: .seconds(30))
        let stats = self.stats
        let state = self.state
        let capacity = self.capacity
        self.recorder = OutcomeRecorder(
            queue: queue,
            workerID: configuration.workerID,
            batchSize: configuration.batchSize,
            interval: configuration.recordInterval,
            logger: logger,
            metrics: self.metrics
        ) { report in
            stats.withLock { stats in
                stats.fenced += report.fenced.count
                stats.unwritable += report.unwritable.count
                for outcome in report.written {
                    switch outcome.disposition {
                    case .delivered: stats.delivered += 1
                    case .retry: stats.retried += 1
                    case .dead: stats.dead += 1
                    case .requeue: stats.requeued += 1
                    case .transportRetry: stats.transportRetried += 1
                    }
                }
            }
            // Written (or fenced out): the job is no longer this worker's to hold.
            let done = report.written + report.fenced + report.unwritable
            state.withLock { state in for outcome in done { state.held.remove(outcome.jobID) } }
            capacity.signal()
        }
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

    /// Readiness: not draining, Postgres answered recently, and no outcome has waited longer than half a lease.
    public var isReady: Bool {
        let quietFor = ContinuousClock.now - self.lastDatabaseSuccess.withLock { $0 }
        return !self.isShuttingDown && quietFor < self.configuration.pollInterval * 3 + .seconds(10)
            && self.recorder.oldestWaiting < self.configuration.lease / 2
    }

    /// Sets the `push_worker_ready` gauge from ``isReady``; call it before each scrape.
    public func recordReadiness() {
        self.metrics.ready.record(self.isReady ? 1 : 0)
        let notProcessed = self.client.notProcessedCount
        let delta = self.state.withLock { state -> Int in
            defer { state.notProcessedReported = notProcessed }
            return notProcessed - state.notProcessedReported
        }
        if delta > 0 { self.metrics.requestsNotProcessed.increment(by: delta) }
    }

    /// Whether this worker may start a send now: its heartbeat is fresh, so no other worker takes it
    /// for gone and re-claims its jobs.
    var heartbeatFresh: Bool {
        guard let last = self.state.withLock({ $0.lastHeartbeat }) else { return false }
        return ContinuousClock.now - last < self.configuration.staleAfter - self.configuration.heartbeatInterval / 2
    }

    /// Runs until ``shutdown()`` (or cancellation), then drains.
    public func run() async {
        let id = self.configuration.workerID
        self.logger.info(
            "worker started",
            metadata: ["push.worker": "\(id)", "push.concurrency": "\(self.configuration.concurrency)"]
        )
        // Check in before the first claim; jobs a previous process of this worker id left running come back now.
        while !self.isShuttingDown && !Task.isCancelled {
            do {
                try await self.beat()
                let reclaimed = try await self.queue.reclaimPreviousLife(workerID: id)
                if !reclaimed.isEmpty {
                    self.metrics.leasesReclaimed.increment(by: reclaimed.count)
                    self.logger.warning(
                        "took back the jobs an earlier process of this worker id left running",
                        metadata: ["push.jobs": "\(reclaimed.count)"]
                    )
                }
                break
            } catch {
                self.logger.error(
                    "could not check in with Postgres; retrying",
                    metadata: ["push.error": "\(QueueError.summary(of: error))"]
                )
                _ = await self.wake.wait(timeout: .seconds(1))
            }
        }
        await withTaskGroup(of: Void.self) { background in
            if let listenerConfiguration = self.listenerConfiguration {
                background.addTask {
                    await JobNotificationListener(
                        configuration: listenerConfiguration,
                        signal: self.wake,
                        logger: self.logger
                    ).run()
                }
            }
            background.addTask { await self.maintenanceLoop() }
            background.addTask { await self.heartbeatLoop() }
            await withTaskGroup(of: Void.self) { core in
                core.addTask { await self.recorder.run() }
                await self.claimLoop()
                // The recorder writes what is left, then returns; this group waits for it.
                self.recorder.stop(giveUpAfter: self.configuration.shutdownGrace)
            }
            background.cancelAll()
        }
        if self.recorder.pending == 0 {
            try? await self.queue.deregister(workerID: id)
        }
        self.logger.info("worker stopped", metadata: ["push.worker": "\(id)"])
    }

    func claimLoop() async {
        let configuration = self.configuration
        var failures = 0
        // Discarding: a plain task group keeps every finished send until the group ends (memory grows per job).
        await withDiscardingTaskGroup { sends in
            while !self.isShuttingDown && !Task.isCancelled {
                let (free, held) = self.state.withLock { (configuration.concurrency - $0.inFlight, $0.held.count) }
                // Claim in whole batches where possible: wait for capacity rather than claiming crumbs.
                // Outcomes not yet written count against capacity: a worker that cannot write stops claiming.
                let room = min(free, configuration.concurrency - held)
                if room < min(configuration.batchSize, configuration.concurrency) / 2 || !self.heartbeatFresh {
                    _ = await self.capacity.wait(timeout: .milliseconds(100))
                    continue
                }
                let limit = min(room, configuration.batchSize)
                let jobs: [PushJob]
                do {
                    jobs = try await self.queue.claim(
                        limit: limit,
                        workerID: configuration.workerID,
                        lease: configuration.lease,
                        excludingCredentials: self.pauses.active(),
                        onlyCredentials: configuration.credentials,
                        excludingEnvironments: self.unreachable.active()
                    )
                    failures = 0
                    self.lastDatabaseSuccess.withLock { $0 = .now }
                } catch {
                    failures += 1
                    let delay = Duration.milliseconds(min(100 << min(failures, 9), 30_000))
                    self.logger.error(
                        "could not claim jobs; retrying",
                        metadata: ["push.error": "\(QueueError.summary(of: error))", "push.retry_in": "\(delay)"]
                    )
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
                let claimedAt = Date()
                for job in jobs {
                    // The database's clock: its now() at the claim, carried forward by this process's clock.
                    let offset = (job.claimedAt ?? claimedAt).timeIntervalSince(claimedAt)
                    sends.addTask {
                        let mayWrite: @Sendable () -> Bool = { [weak self] in
                            self.map { !Task.isCancelled && $0.heartbeatFresh } ?? false
                        }
                        let (outcome, decided) = await self.processor.process(
                            job,
                            databaseNow: Date().addingTimeInterval(offset),
                            mayWrite: mayWrite
                        )
                        self.react(to: decided, of: job)
                        self.metrics.record(outcome)
                        self.recorder.add(outcome)
                        self.state.withLock { $0.inFlight -= 1 }
                        self.capacity.signal()
                    }
                }
                if jobs.count == limit { continue }
                // Not a full batch: sleep until a NOTIFY, the earliest scheduled job, or the poll timer.
                var timeout = configuration.pollInterval
                if let untilNext = try? await self.queue.untilNextDue(), untilNext > .zero {
                    timeout = min(timeout, untilNext + .milliseconds(1))
                }
                _ = await self.wake.wait(timeout: timeout)
            }
            // Draining: let in-flight sends finish within the grace period, then cancel them: a send not
            // yet written is withdrawn and its job released uncounted; one in flight has an unknown outcome.
            let grace = configuration.shutdownGrace
            let deadline = ContinuousClock.now + grace
            while self.state.withLock({ $0.inFlight }) > 0 && ContinuousClock.now < deadline {
                _ = await self.capacity.wait(timeout: .milliseconds(50))
            }
            if self.state.withLock({ $0.inFlight }) > 0 {
                self.logger.warning(
                    "shutdown grace period over; withdrawing the sends still waiting",
                    metadata: ["push.jobs": "\(self.state.withLock { $0.inFlight })"]
                )
                sends.cancelAll()
            }
        }
    }

    /// The worker's side effects of a decision: pause a credential, pause an unreachable endpoint.
    func react(to decided: DecidedOutcome, of job: PushJob) {
        if decided.decision == .delivered {
            self.pauses.succeeded(job.credential)
            self.unreachable.succeeded(job.environment)
        }
        if decided.pausesCredential {
            let (until, isNew) = self.pauses.pause(job.credential)
            if isNew {
                let reason = decided.reason ?? "-"
                self.logger.error(
                    "APNs refused credential '\(job.credential)' (\(reason)): its jobs stay pending until \(until); fix the key configuration",
                    metadata: ["push.credential": "\(job.credential)", "push.reason": "\(reason)"]
                )
            }
        }
        if decided.endpointUnreachable {
            let (_, isNew) = self.unreachable.pause(job.environment)
            if isNew {
                self.logger.warning(
                    "APNs unreachable for \(job.environment): its jobs stay pending, unclaimed, while the pool reconnects",
                    metadata: ["push.environment": "\(job.environment)"]
                )
            }
        }
    }

    /// One heartbeat: the worker's row, then the leases of every job it holds.
    func beat() async throws {
        let credentials = self.configuration.credentials ?? []
        try await self.queue.heartbeat(
            workerID: self.configuration.workerID,
            host: ProcessInfo.processInfo.hostName,
            pid: Int(getpid()),
            credentials: credentials
        )
        let now = ContinuousClock.now
        let (stale, grace) = (self.configuration.staleAfter, self.configuration.reconnectGrace)
        self.state.withLock { state in
            state.lastHeartbeat = now
            if state.reapAllowedAfter == nil { state.reapAllowedAfter = now + (state.cutOff ? grace : stale) }
            state.cutOff = false
        }
        let held = Array(self.state.withLock { $0.held })
        if !held.isEmpty {
            try await self.queue.extendLeases(
                held,
                workerID: self.configuration.workerID,
                lease: self.configuration.lease
            )
        }
    }

    /// Heartbeats, extends the leases of held jobs, and reclaims the jobs of workers that are gone.
    /// After a gap (Postgres was away), this worker first checks in and flushes, and waits a full stale
    /// period before it reaps anyone else's jobs.
    func heartbeatLoop() async {
        while !Task.isCancelled {
            do {
                try await self.beat()
                let allowedAfter = self.state.withLock { $0.reapAllowedAfter } ?? .now
                if ContinuousClock.now >= allowedAfter {
                    let reaped = try await self.queue.reapJobsOfGoneWorkers(
                        staleAfter: self.configuration.staleAfter,
                        workerID: self.configuration.workerID,
                        restartGrace: self.configuration.reconnectGrace
                    )
                    if !reaped.isEmpty {
                        self.metrics.leasesReclaimed.increment(by: reaped.count)
                        self.logger.warning(
                            "reclaimed the jobs of a worker that is gone",
                            metadata: ["push.jobs": "\(reaped.count)"]
                        )
                        self.wake.signal()
                    }
                }
            } catch {
                self.state.withLock { state in
                    state.reapAllowedAfter = nil
                    state.cutOff = true
                }
                self.logger.warning(
                    "could not write the heartbeat; sends pause once it is stale",
                    metadata: ["push.error": "\(QueueError.summary(of: error))"]
                )
            }
            try? await Task.sleep(for: self.configuration.heartbeatInterval)
        }
    }

    /// Prunes delivered rows, dead-letters jobs nobody can sign, and refreshes the queue gauges on their timers.
    func maintenanceLoop() async {
        var lastPrune = ContinuousClock.now
        var lastStats = ContinuousClock.now - .seconds(3600)
        while !Task.isCancelled {
            try? await Task.sleep(for: self.configuration.reaperInterval)
            if Task.isCancelled { return }
            do {
                self.metrics.connections.record(self.client.openConnections)
                self.metrics.jwtMints.record(self.client.mintCount)
                self.metrics.pausedCredentials.record(self.pauses.active().count)
                if ContinuousClock.now - lastStats >= .seconds(15) {
                    lastStats = .now
                    self.metrics.record(try await self.queue.stats())
                }
                let unsignable = try await self.queue.deadLetterUnsignable(
                    wait: self.configuration.credentialWait,
                    staleAfter: self.configuration.staleAfter
                )
                if unsignable > 0 {
                    self.logger.error(
                        "dead-lettered jobs whose credential no running worker can sign for (MS028)",
                        metadata: ["push.jobs": "\(unsignable)"]
                    )
                }
                if ContinuousClock.now - lastPrune >= self.configuration.pruneInterval {
                    lastPrune = .now
                    let pruned = try await self.queue.pruneDelivered(olderThan: self.configuration.retention)
                    if pruned > 0 {
                        self.logger.info("pruned delivered jobs past retention", metadata: ["push.jobs": "\(pruned)"])
                    }
                }
            } catch {
                self.logger.warning(
                    "maintenance query failed; will retry",
                    metadata: ["push.error": "\(QueueError.summary(of: error))"]
                )
            }
        }
    }
}
