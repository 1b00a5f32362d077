import Foundation
import Logging
import PushEmbeddedPostgres
import PushProcess
import PushQueue
import PushQueueTesting
import Testing

/// Other users on the same machine, and operators' half-filled settings: each case here was exploitable
/// or silently wrong before.
@Suite("Hostile neighbours: the embedded Postgres, the simulator rule, empty settings")
struct HostileNeighbourTests {
    static func psql(_ url: String, _ sql: String) throws -> (status: Int32, output: String) {
        let result = try ChildProcess.run("/usr/bin/env", ["PGCONNECT_TIMEOUT=5", "psql", "-w", url, "-Atc", sql])
        return (result.status, result.output.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    @Test(
        "the embedded Postgres admits only its owner: a password kept 0600, no Unix socket; a trust cluster is closed"
    )
    func embeddedPostgresIsPrivate() async throws {
        // A cluster of its own, started and stopped with blocking calls: gated, and off the concurrency pool.
        try await HeavyTestGate.run { try await offPool { try Self.embeddedPostgresIsPrivateNow() } }
    }

    private static func embeddedPostgresIsPrivateNow() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("private-pg-\(UUID().uuidString)")
            .path
        var logger = Logger(label: "push.test.private")
        logger.logLevel = .error
        let cluster = EmbeddedPostgres(
            configuration: .init(dataDirectory: directory + "/data", fsync: false),
            logger: logger
        )
        let url = try cluster.start()
        defer {
            cluster.stop()
            try? FileManager.default.removeItem(atPath: directory)
        }
        #expect(url.password?.count == 64)
        #expect(try Self.psql(url.connectionString, "SELECT 1").output == "1")
        var anonymous = url
        anonymous.password = nil
        let refused = try Self.psql(anonymous.connectionString, "SELECT 1")
        #expect(refused.status != 0 && refused.output.contains("password"), "\(refused.output)")
        var guessed = url
        guessed.password = "postgres"
        #expect(try Self.psql(guessed.connectionString, "SELECT 1").status != 0)
        let mode = try FileManager.default.attributesOfItem(atPath: cluster.passwordFile)[.posixPermissions] as? Int
        #expect(mode == 0o600)
        #expect(try Self.psql(url.connectionString, "SHOW unix_socket_directories").output == "")

        // A cluster made by an older push-worker: trust auth, no password file. Starting it closes the door.
        try "host all all 127.0.0.1/32 trust\n".write(
            toFile: directory + "/data/pg_hba.conf",
            atomically: false,
            encoding: .utf8
        )
        try FileManager.default.removeItem(atPath: cluster.passwordFile)
        _ = try ChildProcess.run(
            "/usr/sbin/runuser",
            ["-u", "postgres", "--", "/usr/lib/postgresql/15/bin/pg_ctl", "-D", directory + "/data", "reload"]
        )
        #expect(try Self.psql(anonymous.connectionString, "SELECT 1").output == "1", "trust, as before")
        let upgraded = try cluster.start()
        #expect(upgraded.password != nil && upgraded.password != url.password)
        #expect(try Self.psql(upgraded.connectionString, "SELECT 1").output == "1")
        #expect(try Self.psql(anonymous.connectionString, "SELECT 1").status != 0)

        // A lost password file is named, never replaced by a new (wrong) password.
        try FileManager.default.removeItem(atPath: cluster.passwordFile)
        let lost = #expect(throws: QueueError.self) { try cluster.start() }
        #expect("\(lost.map { "\($0)" } ?? "")".contains("password file"))
        #expect(!FileManager.default.fileExists(atPath: cluster.passwordFile))
    }

    @Test("DATABASE_URL: sslrootcert is honoured or refused, never ignored")
    func sslRootCert() throws {
        #expect(throws: QueueError.self) { try DatabaseURL("postgres://u@h/db?sslmode=require&sslrootcert=system") }
        #expect(throws: QueueError.self) {
            try DatabaseURL("postgres://u@h/db?sslmode=prefer&sslrootcert=/etc/hostname")
        }
        #expect(throws: QueueError.self) {
            try DatabaseURL("postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent")
        }
        #expect(throws: QueueError.self) {
            try DatabaseURL("postgres://u@h/db?sslmode=verify-full&sslcert=/etc/hostname")
        }
        let verified = try DatabaseURL("postgres://u@h/db?sslmode=require&sslrootcert=/etc/hostname")
        #expect(verified.sslRootCert == "/etc/hostname")
        #expect(verified.connectionString.contains("sslrootcert="))
        #expect(try DatabaseURL("postgres://u@h/db?sslmode=verify-full&sslrootcert=system").sslRootCert == nil)
    }

    @Test(
        "run without a key: the built-in simulator only for the embedded database or with --simulator; empty settings name themselves"
    )
    func simulatorRuleAndEmptySettings() throws {
        func run(_ arguments: [String], _ environment: [String: String]) throws -> (status: Int32, output: String) {
            let unset = ["DATABASE_URL", "APNS_KEY_PATH", "APNS_KEY_ID", "APNS_TEAM_ID"].flatMap { ["-u", $0] }
            let set = environment.map { "\($0.key)=\($0.value)" }
            let result = try ChildProcess.run("/usr/bin/env", unset + set + [DaemonFixture.binary] + arguments)
            return (result.status, result.output)
        }
        // A real database and no key: refused before any connection (nothing listens on port 1).
        let real = try run(["run", "--no-metrics"], ["DATABASE_URL": "postgres://app@127.0.0.1:1/app"])
        #expect(real.status != 0 && real.output.contains("--simulator") && real.output.contains("APNS_KEY_PATH"))
        #expect(!real.output.contains("connect"), "decided before touching the database: \(real.output)")
        // Unresolved templates are errors that name the variable, never "no key" or "embedded database".
        let emptyKey = try run(
            ["run", "--no-metrics"],
            ["DATABASE_URL": "postgres://app@127.0.0.1:1/app", "APNS_KEY_PATH": ""]
        )
        #expect(emptyKey.status != 0 && emptyKey.output.contains("APNS_KEY_PATH") && emptyKey.output.contains("empty"))
        let emptyURL = try run(["run", "--no-metrics"], ["DATABASE_URL": " "])
        #expect(emptyURL.status != 0 && emptyURL.output.contains("DATABASE_URL") && emptyURL.output.contains("empty"))
        let emptyTeam = try run(["check-keys"], ["APNS_KEY_PATH": "/nonexistent.p8", "APNS_TEAM_ID": ""])
        #expect(emptyTeam.status != 0 && emptyTeam.output.contains("APNS_TEAM_ID"))
    }

    @Test("poll-only mode: with the NOTIFY trigger switched off (PREPARE TRANSACTION works), a worker still delivers")
    func pollOnlyMode() async throws {
        try await DaemonFixture.run { f in
            try await f.db.execute("ALTER TABLE push.jobs DISABLE TRIGGER jobs_notify_inserted")
            let worker = try f.startWorker("poll", ["--poll-interval-ms", "100"])
            defer {
                worker.signal(SIGTERM)
                worker.reap()
            }
            // A producer's two-phase commit: impossible while the INSERT fires NOTIFY.
            let prepared = "push_\(UInt32.random(in: 0...UInt32.max))"
            let enabled = try await f.db.int64(
                "SELECT setting::bigint FROM pg_settings WHERE name = 'max_prepared_transactions'"
            )
            if enabled > 0 {
                try await f.db.client.withConnection { connection in
                    try await connection.query("BEGIN", logger: f.db.logger)
                    try await connection.query(
                        "INSERT INTO push.jobs (topic, device_token, payload) VALUES ('com.example.app', \(DaemonFixture.token(1)), '{\"aps\":{}}')",
                        logger: f.db.logger
                    )
                    try await connection.query("PREPARE TRANSACTION '\(unescaped: prepared)'", logger: f.db.logger)
                    try await connection.query("COMMIT PREPARED '\(unescaped: prepared)'", logger: f.db.logger)
                }
            } else {
                try await f.db.execute(
                    "INSERT INTO push.jobs (topic, device_token, payload) VALUES ('com.example.app', '\(DaemonFixture.token(1))', '{\"aps\":{}}')"
                )
            }
            try await f.waitUntil(.seconds(20), "delivered by polling") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == 1
            }
        }
    }

    @Test(
        "operator input: a --config others can change is refused, huge durations are errors, a password in argv warns"
    )
    func operatorInput() async throws {
        try await DaemonFixture.run { f in
            let config = f.directory + "/config.json"
            try """
            {"credentials": {"default": {"team_id": "\(f.credentials.teamID)", "key_id": "\(f.credentials.keyID)", "key_path": "\(f.keyPath)"}}}
            """.write(toFile: config, atomically: true, encoding: .utf8)
            #expect(chmod(config, 0o666) == 0)
            let writable = try ChildProcess.run(DaemonFixture.binary, ["check-keys", "--config", config])
            #expect(writable.status != 0 && writable.output.contains("chmod go-w"), "\(writable.output)")
            #expect(chmod(config, 0o644) == 0)
            let fine = try ChildProcess.run(DaemonFixture.binary, ["check-keys", "--config", config])
            #expect(fine.status == 0 && fine.output.contains("ok: credential default"), "\(fine.output)")

            let huge = try await f.cli(["dead", "purge", "--older-than", "99999999999999999w"])
            #expect(huge.status == 64 && huge.output.contains("--older-than"), "an error, not a trap: \(huge.output)")

            var withPassword = f.db.url
            withPassword.password = withPassword.password ?? "secret"
            let warned = try ChildProcess.run(
                DaemonFixture.binary,
                ["stats", "--database-url", withPassword.connectionString]
            )
            #expect(warned.output.contains("process list"), "\(warned.output)")
        }
    }

    @Test(
        "two live workers with one worker id (containers sharing a hostname, each PID 1): the second refuses to start (exit 78, naming --worker-id) and takes none of the first one's jobs back; a restart after the first is gone starts"
    )
    func duplicateWorkerID() async throws {
        // Every answer takes 3 s: the first worker holds running jobs when the second starts.
        try await DaemonFixture.run(
            expected: .seconds(25),
            simulator: { configuration in
                configuration.faults.slowShare = 1
                configuration.faults.slowLatency = .seconds(3)
            }
        ) { f in
            try await f.insertAlerts(50)
            let first = try f.startWorker("same", ["--log-level", "error"])
            defer {
                first.signal(SIGKILL)
                first.reap()
            }
            try await f.waitUntil(.seconds(30), "the first worker's requests in flight") {
                f.simulator.requests.count >= 50
            }
            let second = try f.startWorker("same", ["--log-level", "error"])
            let status = second.wait(limit: .seconds(60))
            #expect(status == 78, "\(second.output)")
            #expect(second.output.contains("is in use by a live worker") && second.output.contains("--worker-id"))
            #expect(!second.output.contains("took back"), "\(second.output)")
            try await f.waitUntil(.seconds(60), "every job delivered once") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == 50
            }
            let ids = f.simulator.requests.compactMap { $0.headers["apns-id"] }
            #expect(ids.count == 50 && Set(ids).count == 50, "no job sent twice: \(ids.count) requests")
            // The first one killed: a restart under the same id waits out its stale heartbeat, then starts.
            first.signal(SIGKILL)
            first.reap()
            let restarted = try f.startWorker("same", ["--log-level", "error"])
            defer {
                restarted.signal(SIGKILL)
                restarted.reap()
            }
            try await f.insertAlerts(5, offset: 1_000)
            try await f.waitUntil(.seconds(60), "the restarted worker delivers") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == 55
            }
            // The first one was killed after its jobs were written: a second 200 would be allowed for it, and
            // none is expected (checked above); the rest of the invariants hold.
            _ = try await FaultTests.assertInvariants(f, jobs: 55, diedWorkers: ["same"])
        }
    }

    @Test("the health server: 127.0.0.1 by default, at most 32 connections at once, then it answers again")
    func healthServerBounds() async throws {
        try await DaemonFixture.run { f in
            let help = try ChildProcess.run(DaemonFixture.binary, ["help", "run"])
            #expect(help.output.contains("default: 127.0.0.1"), "\(help.output.suffix(3000))")
            let worker = try f.startWorker("h")
            defer {
                worker.signal(SIGTERM)
                worker.reap()
            }
            let port = try await f.metricsPort(worker)
            // 40 idle connections: the first 32 are held, the rest are closed at once.
            let script = """
                import socket, time
                held = []
                for _ in range(40):
                    s = socket.create_connection(("127.0.0.1", \(port)), timeout=5)
                    held.append(s)
                time.sleep(0.5)
                closed = 0
                for s in held:
                    s.settimeout(0.2)
                    try:
                        if s.recv(1) == b"":
                            closed += 1
                    except socket.timeout:
                        pass
                print(closed)
                """
            let result = try ChildProcess.run("/usr/bin/env", ["python3", "-c", script])
            let closed = Int(result.output.trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
            #expect(closed == 8, "connections beyond 32 are closed: \(result.output)")
            #expect(try await f.get(worker, "/healthz").0 == 200, "answers again once they are gone")
        }
    }
}
