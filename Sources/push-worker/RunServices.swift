import APNsSimulator
import ArgumentParser
import Foundation
import Logging
import Metrics
import PostgresNIO
import Prometheus
import PushCore
import PushQueue
import PushTransport
import PushWorker
import ServiceLifecycle
import Synchronization
import UnixSignals

/// Runs the database client in use, and each one a failover switches to, until the group shuts down.
struct PrimaryClientService: Service {
    let primary: PrimaryClient
    func run() async throws {
        await cancelWhenGracefulShutdown { await self.primary.run() }
    }
}

/// The worker as the group runs it: check the schema, say ready, claim and send until the group shuts
/// down, then close the APNs connections.
struct WorkerDaemon: Service {
    let service: PushWorkerService
    let apnsClient: APNsClient
    let fcmClient: FCMClient?
    let notifier: ServiceManagerNotifier
    let logger: Logger
    let workerID: String
    let banner: String
    let prepare: @Sendable () async throws -> Void

    func run() async throws {
        // The first signal stops a worker that has not started too (waiting for another process's migration,
        // say): the schema check is cancelled and the worker exits without claiming.
        do {
            try await cancelWhenGracefulShutdown { try await self.prepare() }
        } catch  where Task.isShuttingDownGracefully {
            self.logger.notice("stopped before starting: the signal came while the push schema was being checked")
            await self.apnsClient.shutdown()
            await self.fcmClient?.shutdown()
            return
        }
        writeLine(self.banner)
        // systemd (Type=notify): ready once the schema is checked and the service is built.
        self.notifier.notify("READY=1\nSTATUS=claiming and sending as \(self.workerID)\nMAINPID=\(getpid())")
        try await self.service.run()
        await self.apnsClient.shutdown()
        await self.fcmClient?.shutdown()
        let counters = self.service.counters
        self.logger.notice(
            "drained",
            metadata: [
                "push.delivered": "\(counters.delivered)", "push.retried": "\(counters.retried)",
                "push.dead": "\(counters.dead)",
            ]
        )
    }
}

/// SIGTERM/SIGINT: the first starts the group's drain (logged and told to systemd), the second exits
/// at once. Runs until cancelled, through the whole drain.
struct SignalHandling: Sendable {
    let logger: Logger
    let notifier: ServiceManagerNotifier

    func run(drain: @escaping @Sendable () async -> Void) async {
        let signals = await terminationSignals()
        var received = 0
        for await _ in signals {
            received += 1
            if received == 1 {
                self.logger.warning("signal received: draining (a second signal exits at once)")
                self.notifier.notify("STOPPING=1\nSTATUS=draining: finishing sends in flight")
                await drain()
            } else {
                self.logger.warning(
                    "second signal: exiting now; unfinished jobs return to pending once this worker's heartbeat is stale (same apns-id)"
                )
                Foundation.exit(130)
            }
        }
    }
}

/// Pings the systemd watchdog until the group stops.
struct WatchdogService: Service {
    let notifier: ServiceManagerNotifier

    func run() async throws {
        let notifier = self.notifier
        // No watchdog configured: stay until the group shuts down, like every other service.
        guard notifier.watchdogInterval != nil else {
            try? await gracefulShutdown()
            return
        }
        // Pings until the group shuts it down (the cancellation is the normal end).
        await cancelWhenGracefulShutdown { await notifier.runWatchdog() }
    }
}

/// How `run` treats the push schema at start.
enum MigrationMode: String, ExpressibleByArgument, CaseIterable {
    /// Apply pending migrations (one host, compose, the five-minute walkthrough).
    case apply
    /// Refuse to start while migrations are pending (fleets where a deploy step migrates once).
    case check
}
