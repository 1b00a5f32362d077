public import Foundation
public import Logging
import PushProcess
public import PushQueue

#if canImport(Glibc)
import Glibc
#endif

/// A local Postgres cluster in a data directory of our own: the daemon's default when no database is
/// configured, and the tests' throwaway database when `DATABASE_URL` is not set.
///
/// Uses the server binaries of Debian's `postgresql` package (`/usr/lib/postgresql/*/bin`). `initdb`
/// refuses to run as root, so as root every server command runs as the `postgres` user (`runuser`) and
/// the data directory is handed to that user. The cluster listens on 127.0.0.1 only, with trust auth.
public struct EmbeddedPostgres: Sendable {
    /// Where and how the cluster runs.
    public struct Configuration: Sendable {
        /// The cluster's data directory; created (and initialized) when missing.
        public var dataDirectory: String
        /// The TCP port on 127.0.0.1; 0 picks a free one.
        public var port: Int
        /// Keep Postgres' durability on (the daemon); tests turn it off for speed.
        public var fsync: Bool
        /// The directory holding `initdb`, `pg_ctl` and `postgres`; `nil` finds it.
        public var binDirectory: String?
        /// Extra `postgresql.conf` settings, written once at initialization.
        public var settings: [String: String]

        /// - Parameters:
        ///   - dataDirectory: the cluster's data directory.
        ///   - port: 0 picks a free port.
        public init(
            dataDirectory: String,
            port: Int = 0,
            fsync: Bool = true,
            binDirectory: String? = nil,
            settings: [String: String] = [:]
        ) {
            self.dataDirectory = dataDirectory
            self.port = port
            self.fsync = fsync
            self.binDirectory = binDirectory
            self.settings = settings
        }
    }

    /// The configuration as given (with the port resolved once started).
    public let configuration: Configuration
    let logger: Logger

    /// - Parameters:
    ///   - configuration: where and how the cluster runs.
    public init(configuration: Configuration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
    }

    /// The directory of the newest installed Postgres server binaries.
    ///
    /// - Throws: ``QueueError/Code/postgresNotInstalled`` with the package to install.
    public static func findBinDirectory() throws -> String {
        let fm = FileManager.default
        var candidates: [String] = []
        if let versions = try? fm.contentsOfDirectory(atPath: "/usr/lib/postgresql") {
            for version in versions.sorted(by: { (Int($0) ?? 0) > (Int($1) ?? 0) }) {
                candidates.append("/usr/lib/postgresql/\(version)/bin")
            }
        }
        candidates += ["/usr/local/pgsql/bin", "/usr/local/bin", "/usr/bin"]
        for directory in candidates
        where fm.isExecutableFile(atPath: directory + "/initdb") && fm.isExecutableFile(atPath: directory + "/postgres")
        {
            return directory
        }
        throw QueueError(
            code: .postgresNotInstalled,
            message:
                "no PostgreSQL server binaries (initdb, postgres) found in /usr/lib/postgresql/*/bin: install Debian's `postgresql` package (apt-get install -y postgresql), or set DATABASE_URL to an existing server"
        )
    }

    /// Initializes the cluster if needed and starts it; returns the URL to connect with.
    public func start() throws -> DatabaseURL {
        let bin = try self.configuration.binDirectory ?? Self.findBinDirectory()
        let data = self.configuration.dataDirectory
        let fm = FileManager.default
        let asRoot = geteuid() == 0
        try fm.createDirectory(atPath: data, withIntermediateDirectories: true)
        if asRoot {
            try self.run("/bin/chown", ["-R", "postgres", data], asPostgres: false)
            try self.run("/bin/chmod", ["700", data], asPostgres: false)
        }
        if !fm.fileExists(atPath: data + "/PG_VERSION") {
            self.logger.info("initializing embedded Postgres cluster", metadata: ["push.data_dir": "\(data)"])
            try self.run(
                bin + "/initdb",
                ["-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-instructions"]
                    + (self.configuration.fsync ? [] : ["--no-sync"]),
                asPostgres: asRoot
            )
            var conf = [
                "listen_addresses": "'127.0.0.1'",
                "unix_socket_directories": "''",
                "fsync": self.configuration.fsync ? "on" : "off",
                "synchronous_commit": self.configuration.fsync ? "on" : "off",
                "full_page_writes": self.configuration.fsync ? "on" : "off",
                "max_connections": "200",
            ]
            for (key, value) in self.configuration.settings { conf[key] = value }
            let text = conf.sorted { $0.key < $1.key }.map { "\($0.key) = \($0.value)\n" }.joined()
            let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: data + "/postgresql.conf"))
            try handle.seekToEnd()
            try handle.write(contentsOf: Data(("\n# PushWorker embedded cluster\n" + text).utf8))
            try handle.close()
        }
        if self.isRunning(bin: bin, asRoot: asRoot), let port = self.runningPort() {
            // Another push-worker process started it: share it.
            return DatabaseURL(host: "127.0.0.1", port: port, username: "postgres", database: "postgres")
        }
        let port = self.configuration.port == 0 ? try Self.freePort() : self.configuration.port
        try self.run(
            bin + "/pg_ctl",
            ["-D", data, "-l", data + "/server.log", "-o", "-p \(port)", "-w", "-t", "60", "start"],
            asPostgres: asRoot
        )
        self.logger.info("embedded Postgres started", metadata: ["push.data_dir": "\(data)", "push.port": "\(port)"])
        return DatabaseURL(host: "127.0.0.1", port: port, username: "postgres", database: "postgres")
    }

    /// Whether the cluster in the data directory is running now.
    public var isRunning: Bool {
        guard let bin = try? self.configuration.binDirectory ?? Self.findBinDirectory() else { return false }
        return self.isRunning(bin: bin, asRoot: geteuid() == 0)
    }

    /// The port a running cluster listens on, from its `postmaster.pid` (line 4).
    func runningPort() -> Int? {
        guard
            let text = try? String(
                contentsOfFile: self.configuration.dataDirectory + "/postmaster.pid",
                encoding: .utf8
            )
        else { return nil }
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        return lines.count > 3 ? Int(lines[3].trimmingCharacters(in: .whitespaces)) : nil
    }

    /// Stops the cluster (fast shutdown: open connections are closed); does nothing if it is not running.
    public func stop() {
        guard let bin = try? self.configuration.binDirectory ?? Self.findBinDirectory() else { return }
        let asRoot = geteuid() == 0
        guard self.isRunning(bin: bin, asRoot: asRoot) else { return }
        try? self.run(
            bin + "/pg_ctl",
            ["-D", self.configuration.dataDirectory, "-m", "fast", "-w", "stop"],
            asPostgres: asRoot
        )
    }

    private func isRunning(bin: String, asRoot: Bool) -> Bool {
        (try? self.run(bin + "/pg_ctl", ["-D", self.configuration.dataDirectory, "status"], asPostgres: asRoot)) != nil
    }

    @discardableResult
    private func run(_ executable: String, _ arguments: [String], asPostgres: Bool) throws -> String {
        let result =
            asPostgres
            ? try ChildProcess.run("/usr/sbin/runuser", ["-u", "postgres", "--", executable] + arguments)
            : try ChildProcess.run(executable, arguments)
        let text = result.output
        guard result.status == 0 else {
            let name = (executable as NSString).lastPathComponent
            var message =
                "embedded Postgres: `\(name)` failed (exit \(result.status)): \(text.trimmingCharacters(in: .whitespacesAndNewlines))"
            if text.contains("Permission denied") && asPostgres {
                message +=
                    ". The postgres user must be able to reach \(self.configuration.dataDirectory): choose a data directory outside /root (e.g. under /var/lib or /tmp)"
            }
            if name == "pg_ctl" && arguments.last == "start" {
                message += ". Server log: \(self.configuration.dataDirectory)/server.log"
            }
            throw QueueError(code: .embeddedPostgresFailed, message: message)
        }
        return text
    }

    /// A TCP port on 127.0.0.1 that is free right now.
    public static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else {
            throw QueueError(code: .embeddedPostgresFailed, message: "could not open a socket to find a free port")
        }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard bound == 0 else {
            throw QueueError(code: .embeddedPostgresFailed, message: "could not bind 127.0.0.1:0 to find a free port")
        }
        let named = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard named == 0 else {
            throw QueueError(code: .embeddedPostgresFailed, message: "could not read the port the system chose")
        }
        return Int(UInt16(bigEndian: address.sin_port))
    }
}
