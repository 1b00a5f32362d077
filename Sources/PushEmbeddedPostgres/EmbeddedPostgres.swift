import Foundation
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
/// the data directory is handed to that user. The cluster listens on 127.0.0.1 only (no Unix socket) and
/// requires a random password kept in ``passwordFile`` (0600): only its owner can connect.
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
        var legacyTrust = false
        if !fm.fileExists(atPath: data + "/PG_VERSION") {
            self.logger.info("initializing embedded Postgres cluster", metadata: ["push.data_dir": "\(data)"])
            // Only its owner may connect: a random password (scram-sha-256), kept 0600 next to the data
            // directory, and no Unix socket. Trust auth let any local user become superuser and run
            // `COPY … TO PROGRAM` as the cluster's OS user.
            let password = try self.password(creating: true)
            let pwfile = try Self.privateTemporaryFile(contents: password, readableByPostgres: asRoot)
            defer { try? FileManager.default.removeItem(atPath: (pwfile as NSString).deletingLastPathComponent) }
            try self.run(
                bin + "/initdb",
                [
                    "-D", data, "-U", "postgres", "--auth=scram-sha-256", "--pwfile=\(pwfile)", "-E", "UTF8",
                    "--no-instructions",
                ]
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
        } else if Self.allowsTrust(hba: data + "/pg_hba.conf") {
            // A cluster made before passwords (trust auth): give it one now, then close the door.
            legacyTrust = true
        }
        if self.isRunning(bin: bin, asRoot: asRoot), let port = self.runningPort() {
            // Another push-worker process started it: share it.
            if legacyTrust { try self.closeTrust(bin: bin, port: port, asRoot: asRoot) }
            return try self.url(port: port)
        }
        let port = self.configuration.port == 0 ? try Self.freePort() : self.configuration.port
        try self.run(
            bin + "/pg_ctl",
            ["-D", data, "-l", data + "/server.log", "-o", "-p \(port)", "-w", "-t", "60", "start"],
            asPostgres: asRoot
        )
        if legacyTrust {
            try self.closeTrust(bin: bin, port: port, asRoot: asRoot)
        }
        self.logger.info("embedded Postgres started", metadata: ["push.data_dir": "\(data)", "push.port": "\(port)"])
        return try self.url(port: port)
    }

    /// Whether a pg_hba.conf has a rule (not a comment) with the trust method.
    static func allowsTrust(hba path: String) -> Bool {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return false }
        return text.split(separator: "\n").contains { line in
            let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            return fields.first.map { !$0.hasPrefix("#") } == true && fields.contains("trust")
        }
    }

    /// Where the cluster's password is kept: next to the data directory, mode 0600, owned by whoever
    /// runs push-worker (the data directory itself belongs to the postgres user when run as root).
    public var passwordFile: String { self.configuration.dataDirectory + ".password" }

    private func url(port: Int) throws -> DatabaseURL {
        DatabaseURL(
            host: "127.0.0.1",
            port: port,
            username: "postgres",
            password: try self.password(creating: false),
            database: "postgres"
        )
    }

    /// The stored password; with `creating`, a new random one when none is stored.
    private func password(creating: Bool) throws -> String {
        if let stored = try? String(contentsOfFile: self.passwordFile, encoding: .utf8), !stored.isEmpty {
            return stored.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        guard creating else {
            throw QueueError(
                code: .embeddedPostgresFailed,
                message:
                    "embedded Postgres: its password file \(self.passwordFile) is missing: restore it, or delete \(self.configuration.dataDirectory) to start a new cluster"
            )
        }
        var generator = SystemRandomNumberGenerator()
        let password = (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &generator)) }
            .joined()
        let fd = open(self.passwordFile, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw QueueError(
                code: .embeddedPostgresFailed,
                message: "embedded Postgres: cannot write its password file \(self.passwordFile) (errno \(errno))"
            )
        }
        defer { close(fd) }
        fchmod(fd, 0o600)
        _ = Array(password.utf8).withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        return password
    }

    /// A 0600 file in a fresh 0700 directory, readable by the postgres user when `readableByPostgres`.
    private static func privateTemporaryFile(contents: String, readableByPostgres: Bool) throws -> String {
        var template = Array((NSTemporaryDirectory() + "/pushworker-pw-XXXXXX").utf8CString)
        guard
            let directory = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }).map({
                String(cString: $0)
            })
        else {
            throw QueueError(
                code: .embeddedPostgresFailed,
                message: "embedded Postgres: cannot make a temporary directory"
            )
        }
        let path = directory + "/pwfile"
        try contents.write(toFile: path, atomically: false, encoding: .utf8)
        chmod(path, 0o600)
        if readableByPostgres {
            _ = try? ChildProcess.run("/bin/chown", ["-R", "postgres", directory])
        }
        return path
    }

    /// Gives a trust-auth cluster (made by an older push-worker) the stored password and switches its
    /// pg_hba.conf to scram-sha-256, then reloads it.
    private func closeTrust(bin: String, port: Int, asRoot: Bool) throws {
        let password = try self.password(creating: true)
        self.logger.notice(
            "embedded Postgres used trust auth: setting a password and requiring it",
            metadata: ["push.password_file": "\(self.passwordFile)"]
        )
        // The statement goes in a 0600 file, never on psql's command line (the process list).
        let script = try Self.privateTemporaryFile(
            contents: "ALTER ROLE postgres PASSWORD '\(password)';\n",
            readableByPostgres: asRoot
        )
        defer { try? FileManager.default.removeItem(atPath: (script as NSString).deletingLastPathComponent) }
        try self.run(
            bin + "/psql",
            [
                "-w", "-h", "127.0.0.1", "-p", "\(port)", "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1",
                "-q", "-f", script,
            ],
            asPostgres: asRoot
        )
        let hba = """
            # PushWorker embedded cluster: password (scram-sha-256) over TCP on the loopback only.
            host all all 127.0.0.1/32 scram-sha-256
            host all all ::1/128 scram-sha-256

            """
        let data = self.configuration.dataDirectory
        try hba.write(toFile: data + "/pg_hba.conf", atomically: false, encoding: .utf8)
        try self.run(bin + "/pg_ctl", ["-D", data, "reload"], asPostgres: asRoot)
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
        _ = try? self.run(
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
