import Foundation
public import Logging
public import PushCore
public import PushQueue
public import PushTransport
public import ServiceLifecycle
import Synchronization

/// The worker: claims jobs up to its free send capacity, sends them, records outcomes in batches, keeps
/// a heartbeat, reclaims the jobs of workers that are gone, prunes delivered rows, and wakes on NOTIFY,
/// on its poll timer, or when the earliest scheduled retry falls due. No transaction is held across a send.
public final class PushWorkerService: Service, Sendable {
    let configuration: WorkerConfiguration
    let queue: JobQueue
    /// The providers' senders, by platform: what every job is sent through.
    let senders: [Platform: any PushSender]
    /// APNs' sender as itself, for what only it has (provider token mints, certificate environments).
    let apns: APNsClient
    let listener: JobNotificationListener?
    let logger: Logger
    let processor: JobProcessor
    /// Credentials, topics and endpoints held after what the providers answered.
    let reactions: ProviderReactions
    /// Providers down as their answers show it: their jobs go back uncounted and wait, one probe at a time.
    let outages: ProviderOutages
    /// This process's own id in `push.workers`: another live process with the same worker id is refused.
    let instance = UUID()
    /// Signalled by a NOTIFY, a shutdown, a switch: the claim loop looks again.
    let wake = WakeSignal()
    /// When claimed jobs go out: now, or at their rate limit's slot.
    let scheduler: SendScheduler
    /// Signalled when a send ends or an outcome is written: claim capacity may have come free.
    let sendEnded = WakeSignal()
    /// Signalled when a send ends while a fan-out's children wait for room to go out.
    let deferredRoom = WakeSignal()
    let metrics = WorkerMetrics()
    let recorder: OutcomeWriter
    let lastDatabaseSuccess: Mutex<ContinuousClock.Instant>
    /// Since when every statement that failed was refused as read-only (`nil`: not so since the last success).
    let readOnlySince = Mutex<ContinuousClock.Instant?>(nil)
    let state: Locked<State>
    let stats = Locked(WorkerStats())
    /// The host's wall clock against APNs' `Date` header.
    let skew: ClockSkewMonitor
    /// The monotonic clock every timer of this worker reads (pauses, liveness, the outcome writer's batching
    /// and backoff, send slots, the heartbeat, reaper and read-only loops).
    let clock: any PushClock
    /// Spans for traced jobs' attempts (`nil`: no exporter, no cost).
    let tracing: AttemptTracing?
    /// POSTs webhook deliveries (`nil`: this worker sends none; another worker of the fleet may).
    let webhookSender: WebhookSender?
    /// Ids of held jobs an operator cancelled (see ``noteCancelled(_:)``).
    let cancelled = Locked(CancelledJobs())

    struct State {
        var shuttingDown = false
        /// Sends in flight and jobs held until their outcome is written.
        var capacity: ClaimCapacity
        /// The heartbeat's freshness, being cut off, and when this worker may reap others.
        var liveness: WorkerLiveness
        /// The fleet's pauses (`push.pauses`) as of the last heartbeat: a claimed job they match is not sent
        /// (it goes back uncounted), so a worker that held jobs across a pause (it was frozen, or busy) does
        /// not send them once it is paused.
        var fleetPauses: [FleetPause] = []
        /// When the read of ``fleetPauses`` began.
        var fleetPausesReadAt: ContinuousClock.Instant
        /// The client's not-processed count at the last scrape (the metric counts the difference).
        var notProcessedReported = 0
        /// Bumped when a switch to a new primary begins: a claim that began before it and answers after it is
        /// not sent (its jobs are returned to pending on the new primary, or were never claimed there).
        var switchEpoch = 0
        /// A switch is returning this worker's unheld jobs to pending: no claim starts meanwhile.
        var switching = false
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
    ///   - listener: the dedicated LISTEN connection; `nil` polls only.
    ///   - clock: the process's one clock, which the clients' configurations carry too.
    public init(
        configuration: WorkerConfiguration,
        queue: JobQueue,
        client: APNsClient,
        fcm: FCMClient? = nil,
        webhooks: WebhookHTTPClient? = nil,
        tracing: AttemptTracing? = nil,
        listener: JobNotificationListener?,
        clock: any PushClock,
        logger: Logger
    ) {
        self.tracing = tracing
        self.configuration = configuration
        self.clock = clock
        self.lastDatabaseSuccess = Mutex(clock.now)
        self.queue = queue
        self.apns = client
        var senders: [Platform: any PushSender] = [.apns: client.sender]
        if let fcm { senders[.fcm] = fcm.sender }
        self.senders = senders
        self.listener = listener
        self.logger = logger
        self.skew = ClockSkewMonitor(clock: clock, logger: logger)
        self.processor = JobProcessor(
            client: client,
            retry: configuration.retry,
            environment: ProcessInfo.processInfo.environment,
            clock: clock
        )
        self.reactions = ProviderReactions(
            configuration: configuration,
            senders: senders,
            metrics: self.metrics,
            clock: clock,
            logger: logger
        )
        self.outages = ProviderOutages(clock: clock, logger: logger)
        self.scheduler = SendScheduler(clock: clock, metrics: self.metrics)
        let metrics = self.metrics
        self.webhookSender = webhooks.map {
            WebhookSender(
                queue: queue,
                client: $0,
                settings: configuration.webhooks,
                workerID: configuration.workerID,
                logger: logger,
                metrics: metrics,
                clock: clock
            )
        }
        let state = Locked(
            State(
                capacity: ClaimCapacity(concurrency: configuration.concurrency, batchSize: configuration.batchSize),
                liveness: WorkerLiveness(
                    staleAfter: configuration.staleAfter,
                    heartbeatInterval: configuration.heartbeatInterval,
                    reconnectGrace: configuration.reconnectGrace
                ),
                fleetPausesReadAt: clock.now
            )
        )
        self.state = state
        let stats = self.stats
        let sendEnded = self.sendEnded
        self.recorder = OutcomeWriter(
            queue: queue,
            workerID: configuration.workerID,
            batchSize: configuration.batchSize,
            interval: configuration.recordInterval,
            statementDeadline: configuration.statementDeadline,
            logger: logger,
            metrics: self.metrics,
            clock: clock
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
            // Written, fenced out or parked: the job is no longer this worker's to hold (a parked job's
            // lease lapses and this worker's own reaper returns it).
            let done = report.written + report.fenced + report.unwritable + report.parked
            state.withLock { $0.capacity.released(done.map(\.jobID)) }
            sendEnded.signal()
        }
    }

    /// Counters since start.
    public var counters: WorkerStats { self.stats.withLock { $0 } }

    /// Stops claiming; in-flight sends finish within the grace period, outcomes are flushed, and
    /// ``run()`` returns.
    public func shutdown() {
        self.state.withLock { $0.shuttingDown = true }
        self.wake.signal()
        self.sendEnded.signal()
    }

    var isShuttingDown: Bool { self.state.withLock { $0.shuttingDown } }

    /// Readiness: not draining, Postgres answered recently, and no outcome has waited longer than half a lease.
    public var isReady: Bool {
        let quietFor = self.clock.now - self.lastDatabaseSuccess.withLock { $0 }
        return !self.isShuttingDown && quietFor < self.configuration.pollInterval * 3 + .seconds(10)
            && self.recorder.oldestWaiting < self.configuration.lease / 2
    }

    /// Sets the `push_worker_ready` gauge from ``isReady``; call it before each scrape.
    public func publishReadiness() {
        self.metrics.ready.record(self.isReady ? 1 : 0)
        let notProcessed = self.senders.values.reduce(0) { $0 + $1.notProcessedCount }
        let delta = self.state.withLock { state -> Int in
            defer { state.notProcessedReported = notProcessed }
            return notProcessed - state.notProcessedReported
        }
        if delta > 0 { self.metrics.requestsNotProcessed.increment(by: delta) }
    }

    /// Whether this worker may start a send now: its heartbeat is fresh, so no other worker takes it
    /// for gone and re-claims its jobs.
    var heartbeatFresh: Bool { self.state.withLock { $0.liveness.isFresh(at: self.clock.now) } }

    /// Runs until the service group's graceful shutdown (or ``shutdown()``, or cancellation), then drains.
    public func run() async throws {
        await withGracefulShutdownHandler {
            await self.runUntilShutdown()
        } onGracefulShutdown: {
            self.shutdown()
        }
    }

    /// Runs until ``shutdown()`` (or cancellation), then drains.
    public func runUntilShutdown() async {
        let id = self.configuration.workerID
        self.logger.info(
            "worker started",
            metadata: ["push.worker": "\(id)", "push.concurrency": "\(self.configuration.concurrency)"]
        )
        // Check in before the first claim; jobs a previous process of this worker id left running come back now.
        // Not while another live process heartbeats under this id: wait for its heartbeat to go stale (it was
        // this worker's previous life), or give up when it keeps beating (a second worker with the same id).
        var inUseSince: ContinuousClock.Instant?
        var checkedIn = false
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
                checkedIn = true
                break
            } catch let inUse as WorkerIDInUse {
                let since = inUseSince ?? self.clock.now
                inUseSince = since
                if self.clock.now - since > self.configuration.staleAfter * 2,
                    let refuse = self.configuration.onWorkerIDInUse
                {
                    refuse(inUse.description)
                    return
                }
                self.logger.error("\(inUse.description); waiting for its heartbeat to go stale")
                _ = await self.wake.wait(timeout: .seconds(1), clock: self.clock)
            } catch {
                self.logger.error(
                    "could not check in with Postgres; retrying",
                    metadata: ["push.error": "\(QueueError.summary(of: error))"]
                )
                _ = await self.wake.wait(timeout: .seconds(1), clock: self.clock)
            }
        }
        // Stopped before it checked in (a signal while another process held this id): nothing of this worker's
        // ran, and nothing of the other's (its row, its webhook deliveries) is touched.
        guard checkedIn else {
            self.logger.info("worker stopped before it checked in", metadata: ["push.worker": "\(id)"])
            return
        }
        // A failover's switch to the new primary: first return the claims the old primary committed while their
        // answer was lost (this worker does not hold them), before any claim of its own goes there.
        self.queue.primary.beforeSwitch { [logger = self.logger] client in
            let held = self.state.withLock { state in
                state.switchEpoch += 1
                state.switching = true
                return Array(state.capacity.held)
            }
            defer { self.state.withLock { $0.switching = false } }
            do {
                let onNew = JobQueue(client: client, logger: logger, clock: self.clock, preparedStatements: false)
                let released = try await onNew.releaseUnheld(workerID: id, holding: held)
                if !released.isEmpty {
                    self.metrics.leasesReclaimed.increment(by: released.count)
                    logger.warning(
                        "returned to pending the jobs claimed on the old primary whose claim answer was lost",
                        metadata: ["push.jobs": "\(released.count)"]
                    )
                }
            } catch {
                logger.warning(
                    "could not return the jobs claimed on the old primary; they come back when their lease lapses",
                    metadata: ["push.error": "\(QueueError.summary(of: error))"]
                )
            }
        }
        await withTaskGroup(of: Void.self) { background in
            if let listener = self.listener {
                let wake = self.wake
                background.addTask {
                    await listener.run(onPayload: { payload in
                        if payload.hasPrefix(JobQueue.cancelNotificationPrefix) {
                            self.noteCancelled(payload.dropFirst(JobQueue.cancelNotificationPrefix.count))
                        }
                        wake.signal()
                    })
                }
            }
            background.addTask { await self.maintenanceLoop() }
            background.addTask { await self.activityChannelsLoop() }
            background.addTask { await self.heartbeatLoop() }
            if self.configuration.onPrimaryLost != nil {
                background.addTask { await self.primaryLostWatch() }
            }
            background.addTask { await self.gaugesLoop() }
            await withTaskGroup(of: Void.self) { core in
                core.addTask { await self.recorder.run() }
                if let webhooks = self.webhookSender {
                    core.addTask { await webhooks.run() }
                }
                for sender in self.senders.values {
                    await sender.warmUp(
                        credentials: self.configuration.credentials ?? sender.credentialNames,
                        timeout: .seconds(2)
                    )
                }
                await self.claimLoop()
                // Webhook POSTs in flight finish within their deadline and are recorded.
                self.webhookSender?.stop()
                // The recorder writes what is left, then returns; this group waits for it.
                self.recorder.stop(giveUpAfter: self.configuration.shutdownGrace)
            }
            background.cancelAll()
        }
        if self.recorder.pending == 0 {
            try? await self.queue.deregister(workerID: id, instance: self.instance)
        }
        self.logger.info("worker stopped", metadata: ["push.worker": "\(id)"])
    }
}
