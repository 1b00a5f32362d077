import ArgumentParser
import Foundation
import PushQueue

/// `push-worker psql`: Postgres' own shell on the database every other verb uses, with nothing to look up.
struct PsqlCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "psql",
        abstract: "Open psql on the database the other verbs use (the embedded cluster, or DATABASE_URL).",
        discussion: """
            Starts the embedded cluster if it is not running, and hands psql its host, port, user, database and \
            password through the environment (never the command line, which every local user can read). \
            Everything after the verb goes to psql:
              push-worker psql -c "SELECT state, count(*) FROM push.jobs GROUP BY 1"
              push-worker psql -- -f my-enqueue.sql
            """
    )

    @OptionGroup var database: DatabaseOptions
    @Argument(parsing: .captureForPassthrough, help: "Arguments for psql (-c SQL, -f FILE, …).")
    var arguments: [String] = []

    /// psql: on the PATH, else Debian's Postgres 15 binaries.
    static func psqlPath() -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        let candidates = path.split(separator: ":").map { "\($0)/psql" } + ["/usr/lib/postgresql/15/bin/psql"]
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    func run() throws {
        // Everything after the verb is psql's, but the verb's own help comes first.
        if self.arguments == ["--help"] || self.arguments == ["-h"] {
            print(Self.helpMessage())
            return
        }
        guard let psql = Self.psqlPath() else {
            throw CLIError("psql is not installed: apt-get install -y postgresql-client")
        }
        let logger = try self.database.makeLoggerDefaultingTo(.warning)
        let url = try self.database.resolve(logger: logger)
        var environment = ProcessInfo.processInfo.environment
        // libpq takes the host list as the worker does (comma-separated hosts and ports).
        environment["PGHOST"] = url.hosts.map(\.host).joined(separator: ",")
        environment["PGPORT"] = url.hosts.map { String($0.port) }.joined(separator: ",")
        if url.targetSessionAttrs != "any" { environment["PGTARGETSESSIONATTRS"] = url.targetSessionAttrs }
        if let timeout = url.connectTimeout { environment["PGCONNECT_TIMEOUT"] = String(timeout) }
        environment["PGUSER"] = url.username
        environment["PGDATABASE"] = url.database
        environment["PGSSLMODE"] = url.sslMode
        if let root = url.sslRootCert { environment["PGSSLROOTCERT"] = root }
        if let password = url.password { environment["PGPASSWORD"] = password }
        var arguments = self.arguments
        if arguments.first == "--" { arguments.removeFirst() }
        // Replace this process with psql: its exit status is ours, and a terminal's signals reach it.
        let argv = ([psql] + arguments).map { strdup($0) } + [nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        execve(psql, argv, envp)
        throw CLIError("could not start \(psql): \(String(cString: strerror(errno)))")
    }
}
