import Foundation
import PushEmbeddedPostgres
import PushProcess
import PushQueue
import PushQueueTesting
import Testing

/// libpq's multi-host DATABASE_URL against a real primary and a real streaming standby (pg_basebackup).
@Suite struct MultiHostTests {
    static let bin = "/usr/lib/postgresql/15/bin"

    /// Runs a server binary, as `postgres` when the test runs as root.
    static func asPostgres(_ command: [String], environment: [String: String] = [:]) throws -> ChildProcess.Result {
        let env = environment.map { "\($0.key)=\($0.value)" }
        if geteuid() == 0 {
            return try ChildProcess.run("/usr/sbin/runuser", ["-u", "postgres", "--", "/usr/bin/env"] + env + command)
        }
        return try ChildProcess.run("/usr/bin/env", env + command)
    }

    /// A streaming standby of the fixture's cluster (pg_basebackup -R), started on a free port.
    static func startStandby(of f: OwnClusterFixture) throws -> (directory: String, port: Int) {
        let standby = f.directory + "/standby"
        let port = try EmbeddedPostgres.freePort()
        let password = f.url.password ?? ""
        try FileManager.default.createDirectory(atPath: standby, withIntermediateDirectories: true)
        chmod(standby, 0o700)
        if geteuid() == 0 {
            _ = try ChildProcess.run("/bin/chmod", ["755", f.directory])
            _ = try ChildProcess.run("/bin/chown", ["postgres", standby])
        }
        let backup = try Self.asPostgres(
            [
                Self.bin + "/pg_basebackup", "-h", "127.0.0.1", "-p", "\(f.url.port)", "-U", f.url.username, "-D",
                standby, "-R", "-X", "stream",
            ],
            environment: ["PGPASSWORD": password]
        )
        try #require(backup.status == 0, "pg_basebackup: \(backup.output)")
        let started = try Self.asPostgres([
            Self.bin + "/pg_ctl", "-D", standby, "-o", "-p \(port) -c listen_addresses=127.0.0.1", "-l",
            standby + "/startup.log", "-w", "start",
        ])
        try #require(started.status == 0, "the standby did not start: \(started.output)")

        return (standby, port)
    }

    @Test(
        "a multi-host URL whose first host is a read-only standby: the worker skips it, works on the primary, and names the durability; with target any it lands on the standby and says why nothing can be written"
    )
    func standbyFirst() async throws {
        try await OwnClusterFixture.run("multi-host") { f in
            let (standby, port) = try Self.startStandby(of: f)
            defer { _ = try? Self.asPostgres([Self.bin + "/pg_ctl", "-D", standby, "-m", "fast", "stop"]) }
            let password = f.url.password ?? ""

            let hosts = "127.0.0.1:\(port),127.0.0.1:\(f.url.port)"
            let base = "postgres://\(f.url.username):\(password)@\(hosts)/\(f.url.database)"
            // target any: the first host answers, a standby: migrate cannot write there, and says so.
            var environment = f.environment
            environment["DATABASE_URL"] = base + "?sslmode=disable"
            let anyHost = try ChildProcess.run(
                "/usr/bin/env",
                environment.map { "\($0.key)=\($0.value)" } + [DaemonFixture.binary, "migrate"]
            )
            #expect(anyHost.status != 0, "\(anyHost.output)")
            #expect(anyHost.output.contains("read-only"), "\(anyHost.output)")

            // read-write: the standby is skipped.
            environment["DATABASE_URL"] = base + "?sslmode=disable&target_session_attrs=read-write&connect_timeout=3"
            let migrate = try ChildProcess.run(
                "/usr/bin/env",
                environment.map { "\($0.key)=\($0.value)" } + [DaemonFixture.binary, "migrate"]
            )
            #expect(migrate.status == 0, "\(migrate.output)")
            let worker = try f.startWorker("multi", ["--log-level", "notice"], environment: environment)
            _ = try f.psql(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{}}' FROM generate_series(1, 200) g
                """
            )
            try await f.waitFor("200 delivered through the multi-host URL") {
                try f.psql("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == "200"
            }
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0)
            #expect(worker.output.contains("database host chosen"), "\(worker.output)")
            #expect(worker.output.contains("127.0.0.1:\(f.url.port)"), "the primary was chosen: \(worker.output)")
            #expect(worker.output.contains("durability: asynchronous replication"), "\(worker.output)")
            print(worker.output.split(separator: "\n").filter { $0.contains("durability") }.joined(separator: "\n"))
        }
    }

    @Test(
        "a single-host URL whose server turns read-only while 20 answers are unwritten (a VIP or HAProxy in front of a failover): the worker keeps them, reconnects to the same name until it takes writes, and writes them; no push answered twice, no restart"
    )
    func demotedPrimary() async throws {
        // Every answer takes 2 s: the answers of the 20 requests come back while the server is read-only.
        try await OwnClusterFixture.run(
            "demoted",
            expected: .seconds(12),
            simulator: { configuration in
                configuration.faults.slowShare = 1
                configuration.faults.slowLatency = .seconds(2)
            }
        ) { f in
            let worker = try f.startWorker("demoted", ["--log-level", "notice"])
            defer {
                worker.signal(SIGKILL)
                worker.reap()
            }
            try await f.waitFor("the schema") {
                try f.psql("SELECT count(*) FROM push.schema_migrations") == "\(Migration.all.count)"
            }
            _ = try f.psql(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{}}' FROM generate_series(1, 20) g
                """
            )
            try await f.waitFor("20 requests in flight") { f.simulator.requests.count == 20 }
            // Demoted: every session's writes are refused from now on (as on a standby), with the answers unwritten.
            _ = try f.psql("ALTER SYSTEM SET default_transaction_read_only = on")
            _ = try f.psql("SELECT pg_reload_conf()")
            let deliveredBefore = try f.psql("SELECT count(*) FROM push.jobs WHERE state = 'delivered'")
            try await Task.sleep(for: .seconds(8))
            #expect(worker.isRunning, "no exit while nothing writable has been looked for long: \(worker.output)")
            let deliveredWhileReadOnly = try f.psql("SELECT count(*) FROM push.jobs WHERE state = 'delivered'")
            #expect(
                deliveredWhileReadOnly == deliveredBefore && Int(deliveredBefore) ?? 20 < 20,
                "\(deliveredBefore) delivered before the server turned read-only, \(deliveredWhileReadOnly) after"
            )
            #expect(worker.output.contains("could not write outcomes; keeping them"), "answers were held unwritten")
            // The name now leads to a writable primary (here: the same server, promoted back).
            _ = try f.psql("ALTER SYSTEM SET default_transaction_read_only = off")
            _ = try f.psql("SELECT pg_reload_conf()")
            try await f.waitFor("20 delivered") {
                try f.psql("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == "20"
            }
            #expect(worker.isRunning, "\(worker.output)")
            // The search for a writable server at that name ends in a switch to fresh connections there.
            try await f.waitFor("the switch to fresh connections", .seconds(20)) {
                worker.output.contains("switched the database connections")
            }
            let ids = f.simulator.requests.compactMap { $0.headers["apns-id"] }
            #expect(ids.count == 20 && Set(ids).count == 20, "no push sent twice: \(ids.count) requests")
            #expect(try f.psql("SELECT count(*) FROM push.jobs WHERE attempts <> 1") == "0")
        }
    }

    @Test(
        "failover: the primary killed (-9) mid-drain and the asynchronous standby promoted; the worker switches to it without a restart, keeps its held jobs and unwritten outcomes, and drains; none lost, none running"
    )
    func killedPrimaryFailover() async throws {
        try await OwnClusterFixture.run(
            "failover",
            expected: .seconds(15),
            simulator: { configuration in
                configuration.faults.slowShare = 1
                configuration.faults.slowLatency = .milliseconds(200)
            }
        ) { f in
            let (standby, port) = try Self.startStandby(of: f)
            defer { _ = try? Self.asPostgres([Self.bin + "/pg_ctl", "-D", standby, "-m", "fast", "stop"]) }
            let password = f.url.password ?? ""
            var environment = f.environment
            environment["DATABASE_URL"] =
                "postgres://\(f.url.username):\(password)@127.0.0.1:\(f.url.port),127.0.0.1:\(port)/\(f.url.database)"
                + "?sslmode=disable&target_session_attrs=read-write&connect_timeout=2"
            let count = 1_000
            let first = try f.startWorker(
                "fo",
                ["--log-level", "notice", "--concurrency", "40", "--batch-size", "20"],
                environment: environment
            )
            try await f.waitFor("the schema") {
                try f.psql("SELECT count(*) FROM push.schema_migrations") == "\(Migration.all.count)"
            }
            _ = try f.psql(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{}}' FROM generate_series(1, \(count)) g
                """
            )
            try await f.waitFor("a third delivered") {
                (Int(try f.psql("SELECT count(*) FROM push.jobs WHERE state = 'delivered'")) ?? 0) > count / 3
            }
            // The failover: the primary's postmaster killed, the standby promoted.
            let pidFile = try String(
                contentsOfFile: f.cluster.configuration.dataDirectory + "/postmaster.pid",
                encoding: .utf8
            )
            let postmaster = try #require(Int32(pidFile.split(separator: "\n")[0]))
            kill(postmaster, SIGKILL)
            let failedAt = Date()
            let promoted = try Self.asPostgres([Self.bin + "/pg_ctl", "-D", standby, "-w", "promote"])
            #expect(promoted.status == 0, "\(promoted.output)")
            // The worker switches its pool and LISTEN connection to the promoted standby, without a restart.
            @Sendable func onNew(_ sql: String) throws -> String {
                try ChildProcess.run(
                    "/usr/bin/env",
                    [
                        "psql",
                        "postgres://\(f.url.username):\(password)@127.0.0.1:\(port)/\(f.url.database)?sslmode=disable",
                        "-Atc", sql,
                    ]
                ).output.trimmingCharacters(in: .whitespacesAndNewlines)
            }
            try await f.waitFor("every job terminal on the new primary", .seconds(180)) {
                try onNew("SELECT count(*) FROM push.jobs WHERE state IN ('pending', 'running')") == "0"
            }
            first.signal(SIGTERM)
            #expect(first.wait() == 0, "the worker switched and drained, never exited: \(first.output.suffix(2000))")
            #expect(first.output.contains("switched the database connections"), "\(first.output.suffix(2000))")
            print(
                first.output.split(separator: "\n").filter {
                    $0.contains("switched") || $0.contains("returned to pending") || $0.contains("refused by the fence")
                }.joined(separator: "\n")
            )
            let delivered = Int(try onNew("SELECT count(*) FROM push.jobs WHERE state = 'delivered'")) ?? 0
            let dead = Int(try onNew("SELECT count(*) FROM push.dead_jobs")) ?? 0
            #expect(delivered + dead == count, "none lost: \(delivered) delivered, \(dead) dead of \(count)")
            let firstOutcome =
                Double(
                    try onNew(
                        "SELECT extract(epoch FROM min(delivered_at)) FROM push.jobs WHERE delivered_at > to_timestamp(\(failedAt.timeIntervalSince1970))"
                    )
                ) ?? 0
            // The invariants, read on the new primary: every job in a named terminal state (above), none running
            // (waited for), one apns-id per job across all its requests. The worker kept its held jobs and
            // unwritten outcomes across the switch, so a second 200 can only be an outcome the old primary
            // acknowledged and its asynchronous standby never received: the job is pending again on the new
            // primary. The shared check's way of telling (a dead worker named in the job's history) cannot see
            // these: an outcome lost with the old primary leaves no history on the new one.
            var apnsIDs: [String: Set<String>] = [:]
            for request in f.simulator.requests {
                if let token = request.deviceToken {
                    apnsIDs[token, default: []].insert(request.headers["apns-id"] ?? "")
                }
            }
            #expect(apnsIDs.count == count && apnsIDs.values.allSatisfy { $0.count == 1 }, "one apns-id per job")
            let okTwice = f.simulator.faultCounters.okAnswers.values.filter { $0 > 1 }.count
            print(
                "failover (kill -9 + promote): \(count) jobs, \(f.simulator.requests.count) requests, \(okTwice) answered 200 twice (outcomes the old primary acknowledged and the asynchronous standby never got), \(delivered) delivered, \(dead) dead, 0 lost; first outcome on the new primary \(String(format: "%.1f", firstOutcome - failedAt.timeIntervalSince1970)) s after it"
            )
        }
    }
    @Test(
        "a short-lived password (IAM-style) in DATABASE_PASSWORD_FILE: rotated on the server and in the file, the worker's new connections use the new one without a restart; a readable file or a password in both places is refused with the fix"
    )
    func passwordFileRenewed() async throws {
        try await OwnClusterFixture.run("password-file") { f in
            let file = f.directory + "/db.password"
            try (f.url.password ?? "").write(toFile: file, atomically: true, encoding: .utf8)
            chmod(file, 0o600)
            var environment = f.environment
            var bare = f.url
            bare.password = nil
            environment["DATABASE_URL"] = bare.connectionString
            environment["DATABASE_PASSWORD_FILE"] = file
            func verb(_ arguments: [String], _ env: [String: String]) throws -> ChildProcess.Result {
                try ChildProcess.run(
                    "/usr/bin/env",
                    env.map { "\($0.key)=\($0.value)" } + [DaemonFixture.binary] + arguments
                )
            }
            // Bad input first: others may read the file; a password in the URL too.
            chmod(file, 0o644)
            let readable = try verb(["migrate"], environment)
            #expect(readable.status != 0 && readable.output.contains("chmod 600"), "\(readable.output)")
            chmod(file, 0o600)
            var both = environment
            both["DATABASE_URL"] = f.url.connectionString
            let twice = try verb(["migrate"], both)
            #expect(twice.status != 0 && twice.output.contains("password file"), "\(twice.output)")

            let worker = try f.startWorker("iam", ["--log-level", "notice"], environment: environment)
            try await f.waitFor("the schema") {
                try f.psql("SELECT count(*) FROM push.schema_migrations") == "\(Migration.all.count)"
            }
            func insert(_ prefix: String) throws {
                _ = try f.psql(
                    """
                    INSERT INTO push.jobs (topic, device_token, payload)
                    SELECT 'com.example.app', '\(prefix)' || lpad(to_hex(g), 63, '0'), '{"aps":{}}'
                      FROM generate_series(1, 50) g
                    """
                )
            }
            try insert("a")
            try await f.waitFor("the first 50 delivered") {
                try f.psql("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == "50"
            }
            // The token expires: the server takes only the new password, the sidecar writes it to the file, and
            // the worker's connections are cut (as after a server restart), so it must open new ones.
            let renewed = "renewed-\(UUID().uuidString)"
            _ = try f.psql("ALTER ROLE \"\(f.url.username)\" PASSWORD '\(renewed)'")
            let temporary = file + ".new"
            try renewed.write(toFile: temporary, atomically: false, encoding: .utf8)
            chmod(temporary, 0o600)
            rename(temporary, file)
            var current = f.url
            current.password = renewed
            let currentURL = current.connectionString
            @Sendable func psqlNow(_ sql: String) throws -> String {
                try ChildProcess.run("/usr/bin/env", ["psql", currentURL, "-Atc", sql]).output
                    .trimmingCharacters(in: .whitespacesAndNewlines)
            }
            _ = try psqlNow(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'iam'"
            )
            _ = try psqlNow(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT 'com.example.app', 'b' || lpad(to_hex(g), 63, '0'), '{"aps":{}}' FROM generate_series(1, 50) g
                """
            )
            try await f.waitFor("the next 50 delivered on connections opened with the renewed password") {
                try psqlNow("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == "100"
            }
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0, "\(worker.output)")
            #expect(worker.output.contains("switched the database connections"), "\(worker.output)")
            #expect(!worker.output.contains(renewed), "the password is never logged")
        }
    }
}
