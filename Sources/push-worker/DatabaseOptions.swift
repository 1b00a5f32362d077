import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import PushCore
import PushEmbeddedPostgres
import PushQueue
import PushTransport

/// Where the database is: flags, then the environment, then the embedded cluster.
struct DatabaseOptions: ParsableArguments {
    @Option(
        name: .customLong("database-url"),
        help: ArgumentHelp(
            "Postgres URL, postgres://USER:PASSWORD@HOST:PORT/DATABASE?sslmode=… (default: $DATABASE_URL, else the embedded cluster).",
            valueName: "url"
        )
    )
    var databaseURL: String?

    @Option(
        name: .customLong("database-password-file"),
        help: ArgumentHelp(
            "A file holding the database password (default: $DATABASE_PASSWORD_FILE), read at start and again whenever the worker reconnects: for short-lived passwords (AWS RDS IAM tokens, Cloud SQL IAM) that a sidecar rewrites. Mode 600 or 400, owned by the worker's user.",
            valueName: "path"
        )
    )
    var passwordFile: String?

    @Option(
        name: .customLong("data-dir"),
        help: ArgumentHelp(
            "Data directory of the embedded Postgres cluster, used when no database URL is given.",
            valueName: "path"
        )
    )
    var dataDirectory: String = ".pushworker/postgres"

    @Option(
        name: .customLong("log-level"),
        help: "How much to log (default: warning; info for run)."
    )
    var logLevel: LogLevelOption?

    @Option(name: .customLong("log-format"), help: "text, or json for one JSON object per line.")
    var logFormat: LogFormat = .text

    func makeLogger() throws -> Logger {
        try self.makeLoggerDefaultingTo(.warning)
    }

    func makeLoggerDefaultingTo(_ defaultLevel: Logger.Level) throws -> Logger {
        let level = self.logLevel?.level ?? defaultLevel
        if self.logFormat == .json { LoggingBootstrapOnce.json() }
        var logger = Logger(label: "push-worker")
        logger.logLevel = level
        return logger
    }

    /// The configured database URL: `nil` when none is set (the embedded cluster is used). One set but
    /// empty (`DATABASE_URL=` from an unresolved template) is an error, never the embedded cluster.
    var configuredURL: String? {
        get throws {
            guard let url = self.databaseURL ?? ProcessInfo.processInfo.environment["DATABASE_URL"] else { return nil }
            guard !url.trimmingCharacters(in: .whitespaces).isEmpty else {
                throw CLIError(
                    "DATABASE_URL (or --database-url) is set but empty: set it to postgres://user@host:5432/db (an unresolved template or secret?), or unset it to use the embedded Postgres"
                )
            }
            return url
        }
    }

    /// The password file's path (flag, then `DATABASE_PASSWORD_FILE`), if one is configured.
    var configuredPasswordFile: String? {
        let path = self.passwordFile ?? ProcessInfo.processInfo.environment["DATABASE_PASSWORD_FILE"]
        return path.flatMap { $0.isEmpty ? nil : $0 }
    }

    /// The password in the password file (one line; the trailing newline is not part of it), read now.
    func readPassword() throws -> String? {
        guard let path = self.configuredPasswordFile else { return nil }
        switch SecretFile.read(path, policy: .privateKey, maxBytes: 16 * 1024) {
        case .failure(let failure):
            throw CLIError("the database password file \(path) \(failure.sentence)")
        case .success(let bytes):
            let text = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .newlines)
            guard !text.isEmpty else {
                throw CLIError(
                    "the database password file \(path) is empty: write the password (or the IAM token) into it, or unset DATABASE_PASSWORD_FILE"
                )
            }
            return text
        }
    }

    /// Whether the embedded cluster is the database (no URL configured).
    var isEmbedded: Bool { get throws { try self.configuredURL == nil } }

    /// The database to use, starting the embedded cluster when none is configured.
    func resolve(logger: Logger) throws -> DatabaseURL {
        try self.resolveStartingCluster(logger: logger).url
    }

    /// The database to use, and the embedded cluster if this call started it (so the caller stops it).
    func resolveStartingCluster(logger: Logger) throws -> (url: DatabaseURL, startedCluster: EmbeddedPostgres?) {
        if let url = try self.configuredURL {
            var parsed = try DatabaseURL(url)
            if let password = try self.readPassword() {
                guard parsed.password == nil else {
                    throw CLIError(
                        "DATABASE_URL carries a password and a database password file is set too: remove the password from the URL (the file's is used, and re-read on reconnect)"
                    )
                }
                parsed.password = password
            }
            if self.databaseURL != nil && parsed.password != nil && self.configuredPasswordFile == nil {
                printError(
                    "warning: --database-url carries a password, which every local user can read in the process list: pass it in DATABASE_URL (an environment file readable by this user only) or ~/.pgpass instead"
                )
            }
            return (parsed, nil)
        }
        if self.configuredPasswordFile != nil {
            throw CLIError(
                "a database password file is set but no DATABASE_URL: the embedded Postgres keeps its own password. Set DATABASE_URL, or unset DATABASE_PASSWORD_FILE"
            )
        }
        let directory = URL(fileURLWithPath: self.dataDirectory).standardizedFileURL.path
        let cluster = EmbeddedPostgres(configuration: .init(dataDirectory: directory), logger: logger)
        let wasRunning = cluster.isRunning
        if !wasRunning {
            printError("no DATABASE_URL: starting the embedded Postgres cluster in \(directory)")
        }
        return (try cluster.start(), wasRunning ? nil : cluster)
    }

    /// Runs `body` with a queue on a running client, and turns database errors into sentences.
    func withQueue<T: Sendable>(
        _ body: @Sendable (JobQueue, PostgresClient, Logger) async throws -> T
    ) async throws -> T {
        let logger = try self.makeLogger()
        let url = try await DatabaseProbe(self.resolve(logger: logger), logger: logger, clock: processClock).primary()
        try await DatabaseProbe(url, logger: logger, clock: processClock).connects()
        var configuration = url.clientConfiguration
        configuration.options.maximumConnections = 4
        // A one-shot verb queries before the pool's run() is scheduled; postgres-nio warns about that on
        // its background logger, harmlessly: keep that logger quiet unless debugging.
        var quiet = logger
        if quiet.logLevel > .debug { quiet.logLevel = max(quiet.logLevel, .error) }
        let queueLogger = quiet
        let client = PostgresClient(configuration: configuration, backgroundLogger: quiet)
        let result: Result<T, any Error> = await withTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            do {
                return .success(
                    try await body(
                        JobQueue(client: client, logger: queueLogger, clock: processClock),
                        client,
                        queueLogger
                    )
                )
            } catch {
                return .failure(error)
            }
        }
        do {
            return try result.get()
        } catch let error as PSQLError
            where error.serverInfo?[.sqlState] == "42P01" || error.serverInfo?[.sqlState] == "3F000"
        {
            throw CLIError("the push schema is missing in \(url): run `push-worker migrate` first")
        } catch let error as PSQLError {
            throw CLIError("database error at \(url): \(QueueError.summary(of: error))")
        }
    }
}

/// An error the CLI prints as one sentence and exits 1 for.
struct CLIError: Error, CustomStringConvertible {
    var description: String
    /// The message may quote the database (a topic, a reason): it is escaped for the terminal here, as
    /// ArgumentParser prints it raw.
    init(_ description: String) { self.description = HumanText.escaped(description) }
}

func printError(_ message: String) {
    FileHandle.standardError.write(Data(("push-worker: " + HumanText.escaped(message) + "\n").utf8))
}

/// `LoggingSystem.bootstrap` may run once per process.
enum LoggingBootstrapOnce {
    private static let done = NSLock()
    nonisolated(unsafe) private static var bootstrapped = false

    static func json() {
        done.lock()
        defer { done.unlock() }
        guard !bootstrapped else { return }
        bootstrapped = true
        LoggingSystem.bootstrap { JSONLogHandler(label: $0) }
    }
}

/// `--log-level`: swift-log's levels, checked by ArgumentParser, which names them in `--help` and in its error.
enum LogLevelOption: String, ExpressibleByArgument, CaseIterable, Sendable {
    case trace, debug, info, notice, warning, error, critical

    var level: Logger.Level {
        switch self {
        case .trace: .trace
        case .debug: .debug
        case .info: .info
        case .notice: .notice
        case .warning: .warning
        case .error: .error
        case .critical: .critical
        }
    }
}

/// `--log-format`: lines of text, or one JSON object per line.
enum LogFormat: String, ExpressibleByArgument, CaseIterable, Sendable {
    case text, json
}
