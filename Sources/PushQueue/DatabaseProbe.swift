import Foundation
import Logging
public import PostgresNIO
public import PushCore
import Synchronization

/// What connects for a ``DatabaseURL``: whether its server answers (with the worker's session settings),
/// whether it refuses the password (a short-lived token expired), and which of its hosts is the primary
/// (libpq's multi-host search, with patience through a failover). ``DatabaseURL`` only parses.
public struct DatabaseProbe: Sendable {
    public let url: DatabaseURL
    let logger: Logger
    /// The process's clock: the search's deadline.
    let clock: any PushClock

    public init(_ url: DatabaseURL, logger: Logger, clock: any PushClock) {
        self.url = url
        self.logger = logger
        self.clock = clock
    }

    /// Opens one connection and closes it, so a command fails at once with a sentence naming the server
    /// and what to check, rather than with a connection pool's circuit-breaker error later.
    public func connects() async throws {
        try await self.acceptsSessionSettings([])
    }

    /// Whether the server refuses this URL's password (SQLSTATE 28P01 or 28000: a short-lived token expired);
    /// `false` when it accepts it or cannot be reached.
    public func refusesPassword() async -> Bool {
        do {
            let connection = try await PostgresConnection.connect(
                configuration: try self.url.connectionConfiguration(),
                id: 0,
                logger: logger
            )
            try? await connection.close()
            return false
        } catch let error as PSQLError {
            return ["28P01", "28000"].contains(error.serverInfo?[.sqlState] ?? "")
        } catch {
            return false
        }
    }

    /// The URL pointed at the first host that suits `target_session_attrs`, tried in order as libpq does (each
    /// try bounded by `connect_timeout`); a single host with `any` is used as it is, without a connection.
    /// A host that answers but does not suit (a read-only standby) is closed and the next tried; the error
    /// names what each host said.
    ///
    /// `patience`: how long to keep trying, once a second, while no host suits (a failover in progress: the old
    /// primary gone or demoted, the standby not yet promoted); the first round's answers are logged. `excluding`:
    /// a host not to try (the one a worker just lost).
    public func primary(
        patience: Duration = .zero,
        excluding: DatabaseURL.Endpoint? = nil
    ) async throws -> DatabaseURL {
        if self.url.hosts.count == 1 && self.url.targetSessionAttrs == "any" { return self.url }
        let deadline = self.clock.now + patience
        var round = 0
        while true {
            do {
                return try await self.firstSuitingHost(
                    excluding: excluding,
                    deadline: patience > .zero ? deadline : nil
                )
            } catch {
                if error is CancellationError { throw error }
                guard self.clock.now < deadline else { throw error }
                if round == 0 {
                    logger.warning(
                        "no database host suits yet; trying again every second (a failover may be in progress)",
                        metadata: [
                            "push.error": "\(QueueError.summary(of: error))",
                            "push.patience": "\(patience.components.seconds)s",
                        ]
                    )
                }
                round += 1
                // The pause between rounds ends the search with this round's error when it reaches the deadline.
                let pause = min(Duration.seconds(1), deadline - self.clock.now)
                guard pause > .milliseconds(100) else { throw error }
                try await Task.sleep(for: pause)
            }
        }
    }

    /// One host's connect and check in ``primary(patience:excluding:)``: its `connect_timeout`
    /// (the driver's 10 s by default, which covers the connect and the startup) and 2 s more for the check's
    /// query, which the driver does not bound; within a search, never past the search's deadline (at least 2 s).
    func hostCheckLimit(_ url: DatabaseURL, before deadline: ContinuousClock.Instant?) -> Duration {
        let own = Duration.seconds(url.connectTimeout ?? 10) + .seconds(2)
        guard let deadline else { return own }
        return max(.seconds(2), min(own, deadline - self.clock.now))
    }

    private func firstSuitingHost(
        excluding: DatabaseURL.Endpoint?,
        deadline: ContinuousClock.Instant?
    ) async throws -> DatabaseURL {
        var tried: [String] = []
        for endpoint in self.url.hosts where endpoint != excluding {
            // A worker stopping (SIGTERM) stops its search here, not after every host.
            try Task.checkCancellation()
            var candidate = self.url
            candidate.host = endpoint.host
            candidate.port = endpoint.port
            let attributes = self.url.targetSessionAttrs
            // The connection, so that a check abandoned at its limit is closed (the driver's query does not
            // stop on cancellation: a host that authenticates and then hangs would keep it open).
            let opened = Mutex<PostgresConnection?>(nil)
            do {
                let configuration = try candidate.connectionConfiguration()
                let limit = self.hostCheckLimit(candidate, before: deadline)
                let (suits, what) = try await withDeadline(limit, "\(endpoint)'s connect and check") {
                    let connection = try await PostgresConnection.connect(
                        configuration: configuration,
                        id: 0,
                        logger: logger
                    )
                    opened.withLock { $0 = connection }
                    defer { Task { try? await connection.close() } }
                    guard attributes != "any" else { return (true, "") }
                    var suits = false
                    var what = ""
                    for try await (recovery, readOnly) in try await connection.query(
                        SessionSQL.role.query(),
                        logger: logger
                    ).decode((Bool, String).self) {
                        suits = attributes == "primary" ? !recovery : readOnly == "off"
                        what = recovery ? "a standby (in recovery)" : readOnly == "on" ? "read-only" : "read-write"
                    }
                    return (suits, what)
                }
                if suits { return candidate }
                tried.append("\(endpoint): \(what)")
            } catch is CancellationError {
                throw CancellationError()
            } catch {
                if let connection = opened.withLock({ $0 }) { Task { try? await connection.close() } }
                tried.append("\(endpoint): \(QueueError.summary(of: error))")
            }
        }
        throw QueueError(
            code: .databaseUnreachable,
            message:
                "no host of DATABASE_URL is \(self.url.targetSessionAttrs == "any" ? "reachable" : self.url.targetSessionAttrs) (\(tried.joined(separator: "; "))). Check that the primary is up, and the host list"
        )
    }

    /// Opens one connection with the startup parameters the worker's sessions carry (its session settings
    /// and `application_name`), so a server or pooler that refuses them is named at start, with the fix,
    /// instead of a pool retrying in silence. A pooler in transaction mode (PgBouncer) refuses parameters it
    /// does not know ("unsupported startup parameter"), and could not keep them per session anyway.
    public func acceptsSessionSettings(_ parameters: [(String, String)]) async throws {
        var configuration = try self.url.connectionConfiguration()
        configuration.options.additionalStartupParameters = parameters
        do {
            let connection = try await PostgresConnection.connect(configuration: configuration, id: 0, logger: logger)
            try? await connection.close()
        } catch {
            let summary = QueueError.summary(of: error)
            if summary.contains("unsupported startup parameter") || summary.contains("startup parameter") {
                throw QueueError(
                    code: .databaseUnreachable,
                    message:
                        "\(self.url.host):\(self.url.port) refused the worker's session settings (\(summary)): a connection pooler in transaction mode (PgBouncer) is in the way. Start the worker with --no-session-settings (it then sets nothing per session), or point DATABASE_URL at Postgres itself"
                )
            }
            throw QueueError(
                code: .databaseUnreachable,
                message:
                    "cannot connect to Postgres at \(self.url.host):\(self.url.port) as \(self.url.username) (database \(self.url.database)): \(QueueError.summary(of: error)). Check that the server is running and accepts connections, and DATABASE_URL (or --database-url)"
            )
        }
    }
}
