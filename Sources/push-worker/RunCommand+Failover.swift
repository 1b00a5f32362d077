import Foundation
import Logging
import PostgresNIO
import PushQueue
import PushWorker
import Synchronization

extension RunCommand {
    /// How long the worker looks for a writable primary after losing its own: a pg_auto_failover promotion
    /// (20 s to notice the primary gone, then its 30 s `primary_demote_timeout`) with 40 s of margin.
    static let primarySearch: Duration = .seconds(90)

    /// What the worker does when the primary it uses is lost (demoted, gone, or its password expired). It
    /// finds a writable primary again (up to ``primarySearch``; a multi-host URL's hosts in order; a single
    /// host, the same name looked up afresh: a virtual IP, HAProxy or a managed endpoint moves to the new
    /// primary; the password file re-read) and switches its pool and LISTEN connection there, keeping its held
    /// jobs and unwritten outcomes. When none answers in time, or the switches keep recurring, it exits 75 for
    /// its supervisor to restart it.
    func watchPrimary(
        _ configuration: inout WorkerConfiguration,
        primary: PrimaryClient,
        hosts: DatabaseURL,
        connect: @escaping @Sendable (DatabaseURL) throws -> (PostgresClient, PostgresConnection.Configuration),
        logger: Logger
    ) {
        let database = self.database
        let multiHost = hosts.hosts.count > 1
        let passwordFile = database.configuredPasswordFile
        let recent = RecentSwitches(password: hosts.password)
        @Sendable func handOver(_ why: String) -> Never {
            logger.critical(
                "\(why): exiting with status 75 so the supervisor restarts it (give DATABASE_URL every host, with target_session_attrs=read-write); held jobs are taken back at the restart"
            )
            Foundation.exit(75)
        }
        configuration.onPrimaryLost = { loss in
            let now = processClock.now
            let switches = recent.times.withLock { times in
                times = times.filter { now - $0 < .seconds(600) } + [now]
                return times.count
            }
            if switches > 6 {
                handOver("the database connections were switched 6 times in 10 minutes and lost again each time")
            }
            var quiet = logger
            quiet.logLevel = .error
            do {
                var target = hosts
                if passwordFile != nil { target.password = try database.readPassword() }
                // One name: whatever answers there once it takes writes (the name moves to the new primary).
                if !multiHost && target.targetSessionAttrs == "any" { target.targetSessionAttrs = "read-write" }
                let next = try await DatabaseProbe(target, logger: logger, clock: processClock).primary(
                    patience: Self.primarySearch
                )
                // Read-only, and a multi-host URL's search came back to the same server (target any picking the
                // first again): a switch would land where it is.
                if multiHost && loss == .readOnly && "\(next.host):\(next.port)" == primary.host {
                    handOver(
                        "the database became read-only (a failover demoted the primary) and no other host takes writes"
                    )
                }
                let (client, listener) = try connect(next)
                let from = primary.host
                await primary.switchTo(client, listener: listener, host: "\(next.host):\(next.port)")
                recent.password.withLock { $0 = next.password }
                logger.notice(
                    "switched the database connections (a failover, or a renewed password): held jobs and unwritten outcomes carry over",
                    metadata: [
                        "push.from": "\(from)", "push.to": "\(next.host):\(next.port)", "push.why": "\(loss)",
                    ]
                )
                // What the new primary promises: after a failover, often less (its standby is gone).
                if let durability = try? await JobQueue(primary: primary, logger: quiet, clock: processClock)
                    .durability()
                {
                    logger.notice("durability: \(durability)")
                }
            } catch {
                // A signal while looking for the primary: the worker is stopping, not lost.
                if Task.isCancelled || error is CancellationError { return }
                handOver(
                    "the database was lost and nothing writable answered in \(Self.primarySearch) (\(QueueError.summary(of: error)))"
                )
            }
        }
        // Nothing reached for 15 s: switch (or hand over), sooner once a fresh connection would get through.
        // One host: an outage is waited out (nothing else to try), unless the password was renewed.
        if multiHost { configuration.hostLostAfter = .seconds(15) }
        let lastPasswordCheck = Mutex(processClock.now)
        configuration.switchWouldHelp = { missedHeartbeat in
            var quiet = logger
            quiet.logLevel = .critical
            let current = primary.host
            // Another host promoted, once a heartbeat has not got through (only a host that takes writes
            // counts: with target_session_attrs=any, any host would).
            if missedHeartbeat && multiHost && hosts.targetSessionAttrs != "any" {
                var target = hosts
                if passwordFile != nil, let renewed = try? database.readPassword() { target.password = renewed }
                let excluded = hosts.hosts.first { "\($0.host):\($0.port)" == current }
                if (try? await DatabaseProbe(target, logger: quiet, clock: processClock).primary(excluding: excluded))
                    != nil
                {
                    return true
                }
            }
            // A renewed password: checked every 30 s (a heartbeat missed: at once) while the file holds a password
            // other than the one in use, and only acted on when the server refuses the one in use and accepts
            // the file's (connections already open outlive their token, new ones do not; a slow server or a
            // sidecar's early rotation is no reason to switch).
            // The file is read only when a check is due (every 30 s), not on every tick of the watch.
            guard passwordFile != nil else { return false }
            let due = lastPasswordCheck.withLock { last in
                let now = processClock.now
                guard missedHeartbeat || now - last >= .seconds(30) else { return false }
                last = now
                return true
            }
            guard due, let here = hosts.hosts.first(where: { "\($0.host):\($0.port)" == current }),
                let renewed = try? database.readPassword(), renewed != recent.password.withLock({ $0 })
            else { return false }
            var inUse = hosts
            inUse.host = here.host
            inUse.port = here.port
            inUse.hosts = [here]
            var fresh = inUse
            inUse.password = recent.password.withLock { $0 }
            fresh.password = renewed
            guard await DatabaseProbe(inUse, logger: quiet, clock: processClock).refusesPassword() else { return false }
            return (try? await DatabaseProbe(fresh, logger: quiet, clock: processClock).connects()) != nil
        }
    }
}

/// When the worker last switched its database connections.
final class RecentSwitches: Sendable {
    let times = Mutex<[ContinuousClock.Instant]>([])
    /// The password the connections in use were opened with.
    let password: Mutex<String?>
    init(password: String?) { self.password = Mutex(password) }
}
