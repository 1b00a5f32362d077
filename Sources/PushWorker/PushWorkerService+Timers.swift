import Foundation
import PushCore
import PushQueue
import PushTransport

/// The worker's timers: its heartbeat (with lease extension and the reaping of workers that are gone)
/// and maintenance (pruning, unsignable jobs, gauges).
extension PushWorkerService {
    /// One heartbeat: the fleet's pauses, the worker's row, then the leases of every job it holds. The
    /// pauses come first: sends resume on a fresh heartbeat (after a freeze, say), and they must not resume
    /// with a pause list older than the heartbeat.
    func beat() async throws {
        let readAt = self.clock.now
        let paused = try await self.queue.pauses().map { FleetPause(credential: $0.credential, topic: $0.topic) }
        self.state.withLock { state in
            state.fleetPauses = paused
            state.fleetPausesReadAt = readAt
        }
        // An FCM credential registers as fcm:<name> too (the fleet's check for fcm jobs no worker can send); the
        // bare name stays, for workers of schema 9, whose check knows names only.
        let fcmNames = Set(self.senders[.fcm]?.credentialNames ?? [])
        let credentials = (self.configuration.credentials ?? []).flatMap { name -> [String] in
            [name] + (fcmNames.contains(name) ? ["fcm:\(name)"] : [])
        }
        try await self.queue.heartbeat(
            workerID: self.configuration.workerID,
            host: ProcessInfo.processInfo.hostName,
            pid: Int(getpid()),
            credentials: credentials,
            sessionTracked: self.configuration.sessionTracked,
            instance: self.instance,
            staleAfter: self.configuration.staleAfter
        )
        let now = self.clock.now
        self.state.withLock { $0.liveness.heartbeatSucceeded(at: now) }
        let held = Array(self.state.withLock { $0.capacity.held })
        if !held.isEmpty {
            try await self.queue.extendLeases(
                held,
                workerID: self.configuration.workerID,
                lease: self.configuration.lease
            )
            // Cancels whose NOTIFY this worker missed: withdrawn like the ones it heard of.
            let cancelled = try await self.queue.cancelled(among: held)
            if !cancelled.isEmpty { self.noteCancelled(cancelled.map(String.init).joined(separator: ",")[...]) }
        }
    }

    /// Heartbeats, extends the leases of held jobs, and reclaims the jobs of workers that are gone.
    /// After a gap (Postgres was away), this worker first checks in and flushes, and waits a full stale
    /// period before it reaps anyone else's jobs.
    func heartbeatLoop() async {
        while !Task.isCancelled {
            do {
                try await self.beat()
                self.databaseAnswered()
                if self.state.withLock({ $0.liveness.mayReap(at: self.clock.now) }) {
                    let reaped = try await self.queue.reapJobsOfGoneWorkers(
                        staleAfter: self.configuration.staleAfter,
                        workerID: self.configuration.workerID,
                        restartGrace: self.configuration.reconnectGrace,
                        frozenAfter: self.configuration.frozenAfter
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
            } catch let inUse as WorkerIDInUse {
                // Another process checked in under this id while this one was frozen or cut off longer than the
                // stale period: it took this worker's jobs back. This one must not go on as a second holder.
                self.state.withLock { $0.liveness.heartbeatFailed(connectionLost: false) }
                self.logger.critical("\(inUse.description); this process stops")
                if let refuse = self.configuration.onWorkerIDInUse { refuse(inUse.description) }
            } catch {
                // A statement Postgres refused (a deadlock, say) is no outage; a lost connection is.
                let connectionLost = !QueueError.isRefusedByServer(error)
                self.state.withLock { $0.liveness.heartbeatFailed(connectionLost: connectionLost) }
                self.logger.warning(
                    "could not write the heartbeat; sends pause once it is stale",
                    metadata: ["push.error": "\(QueueError.summary(of: error))"]
                )
                self.databaseFailed(error)
            }
            try? await self.clock.sleep(for: self.configuration.heartbeatInterval)
        }
    }

    /// A statement reached the database: it is neither gone nor read-only.
    func databaseAnswered() {
        self.lastDatabaseSuccess.withLock { $0 = self.clock.now }
        self.readOnlySince.withLock { $0 = nil }
    }

    /// A statement failed: a read-only refusal starts (or continues) the read-only spell.
    func databaseFailed(_ error: any Error) {
        guard QueueError.isReadOnlyServer(error) else { return }
        let now = self.clock.now
        self.readOnlySince.withLock { $0 = $0 ?? now }
    }

    /// The primary this worker uses is lost when its writes have been refused as read-only for 2 s (demoted
    /// by a failover); when, with ``WorkerConfiguration/hostLostAfter``, nothing has reached the database for
    /// that long (killed: queries wait on a pool that cannot connect, so no error comes back to act on); or
    /// when ``WorkerConfiguration/switchWouldHelp`` finds a database a fresh connection reaches (the standby
    /// promoted, a renewed password). Then ``WorkerConfiguration/onPrimaryLost`` switches (or exits); the
    /// watch then starts over.
    func primaryLostWatch() async {
        guard let handler = self.configuration.onPrimaryLost else { return }
        while !Task.isCancelled {
            try? await self.clock.sleep(for: .seconds(1))
            let now = self.clock.now
            let readOnly = self.readOnlySince.withLock { $0 }.map { now - $0 >= .seconds(2) } ?? false
            let quiet = now - self.lastDatabaseSuccess.withLock { $0 }
            var loss: PrimaryLoss? = readOnly ? .readOnly : nil
            if loss == nil, let after = self.configuration.hostLostAfter, quiet >= after { loss = .unreachable }
            // Quiet longer than a heartbeat: the heartbeat itself did not get through.
            let missedHeartbeat = quiet >= self.configuration.heartbeatInterval + .seconds(1)
            if loss == nil, let helps = self.configuration.switchWouldHelp, await helps(missedHeartbeat) {
                loss = .reachableElsewhere
            }
            if let loss, !self.isShuttingDown, !Task.isCancelled {
                await handler(loss)
                // A fresh start for the host now in use.
                self.lastDatabaseSuccess.withLock { $0 = self.clock.now }
                self.readOnlySince.withLock { $0 = nil }
            }
        }
    }

    /// Prunes delivered rows, dead-letters jobs nobody can sign, and refreshes the queue gauges on their timers.
    func maintenanceLoop() async {
        var lastPrune = self.clock.now
        while !Task.isCancelled {
            try? await self.clock.sleep(for: self.configuration.reaperInterval)
            if Task.isCancelled { return }
            do {
                self.metrics.connections.record(
                    self.senders.values.reduce(0) { $0 + $1.openConnections }
                )
                self.metrics.jwtMints.record(self.apns.mintCount)
                self.metrics.pausedCredentials.record(
                    self.reactions.heldCount
                )
                // Like reaping: not while this worker may have just come back from being cut off.
                let mayJudge = self.state.withLock { $0.liveness.mayReap(at: self.clock.now) }
                let unsignable =
                    mayJudge ? try await self.queue.deadLetterUnsignable(wait: self.configuration.credentialWait) : 0
                if unsignable > 0 {
                    self.logger.error(
                        "dead-lettered jobs whose credential no running worker can sign for (MS028)",
                        metadata: ["push.jobs": "\(unsignable)"]
                    )
                }
                if self.clock.now - lastPrune >= self.configuration.pruneInterval {
                    lastPrune = self.clock.now
                    let pruned = try await self.queue.pruneDelivered(olderThan: self.configuration.retention)
                    try await self.queue.forgetRetiredAPNsIDs(olderThan: self.configuration.apnsIDMemory)
                    try await self.queue.pruneWebhookDeliveries(olderThan: self.configuration.retention)
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

    /// Live Activities' broadcast channels, on the maintenance timer in a loop of their own (APNs calls never
    /// delay reaping or pruning): created for those that ask, deleted for those ended and dismissed.
    func activityChannelsLoop() async {
        while !Task.isCancelled {
            try? await self.clock.sleep(for: self.configuration.reaperInterval)
            if Task.isCancelled { return }
            do {
                try await self.createActivityChannels()
                try await self.deleteEndedActivityChannels()
            } catch {
                self.logger.warning(
                    "Live Activity channel maintenance failed; will retry",
                    metadata: ["push.error": "\(QueueError.summary(of: error))"]
                )
            }
        }
    }

    /// Creates the broadcast channels Live Activities asked for (`wants_channel`), each leased so that two
    /// workers do not both create one; their updates and end wait for it. One APNs refuses (past Apple's
    /// 10,000, broadcast not enabled for the key) is asked for no more: the activity's updates go by its
    /// tokens, or end NoDevice. A worker that dies between Apple's answer and the row's update leaves a
    /// channel no activity names (it counts against Apple's limit).
    func createActivityChannels() async throws {
        for request in try await self.queue.activityChannelsToCreate(limit: 100, lease: .seconds(120)) {
            let environment = APNsEnvironment(rawValue: request.environment) ?? .production
            do {
                let channel = try await self.apns.createChannel(
                    bundleID: request.topic,
                    environment: environment,
                    credential: request.credential,
                    storage: APNsClient.MessageStoragePolicy(rawValue: request.storage) ?? .noStorage
                )
                if try await !self.queue.activityChannelCreated(request.activity, channelID: channel) {
                    // Another worker recorded one first: this one would count against the limit for nothing.
                    try? await self.apns.deleteChannel(
                        channel,
                        bundleID: request.topic,
                        environment: environment,
                        credential: request.credential
                    )
                }
            } catch let error as ChannelManagementError where (400..<500).contains(error.status) {
                try await self.queue.activityChannelRefused(request.activity, error: error.description)
                self.logger.error(
                    "APNs refused a Live Activity's channel; its updates go by its tokens instead",
                    metadata: [
                        "push.topic": "\(request.topic)", "push.activity": "\(request.activity)",
                        "push.error": "\(error)",
                    ]
                )
            } catch {
                self.logger.warning(
                    "could not create a Live Activity's channel; its updates wait, and it is tried again in a minute",
                    metadata: [
                        "push.topic": "\(request.topic)", "push.activity": "\(request.activity)",
                        "push.error": "\(error)",
                    ]
                )
            }
        }
    }

    /// Deletes the broadcast channels of ended Live Activities whose dismissal passed (an app may hold
    /// 10,000 channels per environment, and Apple never deletes one), 500 a tick, each leased so that two workers
    /// do not both delete it; one APNs no longer knows counts as deleted. Records the channels still in use.
    func deleteEndedActivityChannels() async throws {
        let due = try await self.queue.activityChannelsToDelete(limit: 500, lease: .seconds(120))
        var deleted: [Int64] = []
        for channel in due {
            do {
                try await self.apns.deleteChannel(
                    channel.channelID,
                    bundleID: channel.topic,
                    environment: APNsEnvironment(rawValue: channel.environment) ?? .production,
                    credential: channel.credential
                )
                deleted.append(channel.activity)
            } catch let error as ChannelManagementError where [400, 404, 410].contains(error.status) {
                // APNs does not know it (BadChannelId, ChannelNotRegistered): nothing left to delete.
                deleted.append(channel.activity)
            } catch {
                // Left leased: tried again once the lease ends.
                self.logger.warning(
                    "could not delete an ended Live Activity's channel; trying again in two minutes",
                    metadata: [
                        "push.topic": "\(channel.topic)", "push.activity": "\(channel.activity)",
                        "push.error": "\(error)",
                    ]
                )
            }
        }
        try await self.queue.activityChannelsDeleted(deleted)
        if !deleted.isEmpty {
            self.logger.info(
                "deleted the channels of ended Live Activities",
                metadata: ["push.channels": "\(deleted.count)"]
            )
        }
        // Every environment, so a count that fell to none does not stay at its last value.
        let counts = try await self.queue.operations.activityChannelCounts()
        for environment in ["production", "development"] {
            self.metrics.activityChannels(environment: environment, count: counts[environment] ?? 0)
        }
    }

    /// Every 15 s, the queue gauges, from the one worker the fleet elects (the live one with the smallest id);
    /// in a loop of its own, so a slow count never delays reaping or pruning.
    func gaugesLoop() async {
        // After the first heartbeat, so a lone worker is elected on its first try.
        try? await self.clock.sleep(for: self.configuration.heartbeatInterval)
        while !Task.isCancelled {
            do {
                self.metrics.publish(
                    try await self.queue.gauges(
                        workerID: self.configuration.workerID,
                        staleAfter: self.configuration.staleAfter
                    ),
                    now: self.clock.wallNow
                )
            } catch {
                self.logger.debug(
                    "queue gauges failed; will retry",
                    metadata: ["push.error": "\(QueueError.summary(of: error))"]
                )
            }
            try? await self.clock.sleep(for: .seconds(15))
        }
    }
}
