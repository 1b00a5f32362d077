import APNsSimulator
import Foundation
import Logging
import PushEmbeddedPostgres
import PushProcess
import PushQueue
import PushQueueTesting
import Synchronization
import Testing

/// Failover as users run it: pg_auto_failover (Debian's postgresql-15-auto-failover: a monitor, a primary and a
/// secondary that it keeps synchronous), over TLS checked with `sslmode=verify-full` against the formation's own
/// CA, two workers on the multi-host URL pg_auto_failover documents, under a supervisor that restarts one that
/// hands over (exit 75; none should: they switch their connections to the new primary). A planned failover
/// (`pg_autoctl perform failover`) and then the new primary killed (-9, its keeper with it) mid-drain.
@Suite(.serialized) struct AutoFailoverTests {
    static var available: Bool { FileManager.default.isExecutableFile(atPath: "/usr/bin/pg_autoctl") }

    @Test(
        "pg_auto_failover: a planned failover and a killed primary mid-drain, two workers on the multi-host URL over verify-full TLS switch to the new primary without a restart; every job delivered, none running, a 200 answered twice at most for jobs in flight at the failover, the durability named at start",
        .enabled(
            if: Self.available || ProcessInfo.processInfo.environment["CI"] == "true",
            "pg_autoctl is not installed (apt-get install postgresql-15-auto-failover); .ci/run installs it"
        )
    )
    func plannedAndKilled() async throws {
        // A formation of three clusters and two workers: no other heavy test beside it (HeavyTestGate). The
        // formation is made on one permit while the tests before it finish.
        let directory = "/tmp/autofailover-\(UUID().uuidString.prefix(8))"
        try await HeavyTestGate.run(preparing: { try await offPool { try AutoFailoverFormation.start(in: directory) } })
        {
            formation in
            try await self.plannedAndKilledNow(formation, directory: directory)
        }
    }

    private func plannedAndKilledNow(_ formation: AutoFailoverFormation, directory: String) async throws {
        defer {
            formation.stop()
            // PUSH_KEEP_TEST_DIR=1 keeps the workers' and nodes' logs to read.
            if ProcessInfo.processInfo.environment["PUSH_KEEP_TEST_DIR"] == nil {
                try? FileManager.default.removeItem(atPath: directory)
            }
        }
        var logger = Logger(label: "push.test.autofailover")
        logger.logLevel = .error
        let credentials = try SimulatorCredentials.generate(in: directory + "/keys")
        var simulatorConfiguration = APNsSimulator.Configuration(keys: [credentials.keyID: credentials.trustedKey])
        simulatorConfiguration.faults.slowShare = 1
        simulatorConfiguration.faults.slowLatency = .milliseconds(100)
        let simulator = try APNsSimulator(configuration: simulatorConfiguration, logger: logger)
        try await simulator.run { simulator in
            let caFile = try simulator.writeCACertificate(to: directory + "/apns-ca.pem")
            let hosts = formation.ports.map { "127.0.0.1:\($0)" }.joined(separator: ",")
            // The formation's URL (pg_autoctl show uri), with the CA that signed the servers' certificates.
            let url =
                "postgres://postgres@\(hosts)/app?sslmode=verify-full&sslrootcert=\(formation.caFile)"
                + "&target_session_attrs=read-write&connect_timeout=2"
            let environment = [
                "DATABASE_URL": url, "APNS_KEY_PATH": credentials.keyPath, "APNS_KEY_ID": credentials.keyID,
                "APNS_TEAM_ID": credentials.teamID,
            ]
            func psql(_ sql: String) throws -> String {
                let result = try ChildProcess.run("/usr/bin/env", ["psql", url, "-Atc", sql])
                guard result.status == 0 else { throw CLIFailure(output: result.output) }
                return result.output.trimmingCharacters(in: .whitespacesAndNewlines)
            }
            let supervisor = Supervisor(directory: directory) { name, log in
                try ChildProcess.start(
                    DaemonFixture.binary,
                    [
                        "run", "--worker-id", name, "--apns-endpoint", "https://localhost:\(simulator.port)",
                        "--apns-ca-file", caFile, "--poll-interval-ms", "200", "--no-metrics", "--log-level", "notice",
                        "--concurrency", "40", "--batch-size", "20",
                    ],
                    environment: environment,
                    outputPath: log
                )
            }
            let report = TestWatchdog.addReport({ supervisor.report() }, onExit: { supervisor.killAll() })
            defer {
                TestWatchdog.removeReport(report)
                supervisor.killAll()
            }
            try supervisor.start(slots: ["a", "b"])
            let watching = Task { await supervisor.watch() }
            defer { watching.cancel() }

            let started = ContinuousClock.now
            func since() -> String {
                let elapsed = (ContinuousClock.now - started).components
                return String(format: "%.1f s", Double(elapsed.seconds) + Double(elapsed.attoseconds) / 1e18)
            }
            try await Self.waitFor("the push schema on the primary", supervisor) {
                try psql("SELECT count(*) FROM push.schema_migrations") == "\(Migration.all.count)"
            }
            // PUSH_LONG_TESTS=1: a backlog of 50,000 jobs a phase (the failover lands in a third of it).
            let perPhase = ProcessInfo.processInfo.environment["PUSH_LONG_TESTS"] == "1" ? 50_000 : 1_500
            var figures: [String] = ["the workers up and the schema migrated at \(since())"]
            var secondSends = 0
            for (phase, prefix) in [
                ("planned failover (pg_autoctl perform failover)", "a"), ("primary killed (-9, keeper too)", "b"),
            ] {
                _ = try psql(
                    """
                    INSERT INTO push.jobs (topic, device_token, payload)
                    SELECT 'com.example.app', '\(prefix)' || lpad(to_hex(g), 63, '0'), '{"aps":{}}'
                      FROM generate_series(1, \(perPhase)) g
                    """
                )
                let mine = "device_token LIKE '\(prefix)%'"
                let patience: Duration = perPhase > 10_000 ? .seconds(900) : .seconds(150)
                try await Self.waitFor("a third of phase \(prefix) delivered", supervisor, patience) {
                    (Int(try psql("SELECT count(*) FROM push.jobs WHERE state = 'delivered' AND \(mine)")) ?? 0)
                        > perPhase / 3
                }
                var steps = "a third delivered at \(since())"
                let livesBefore = supervisor.handOvers
                let failedAt = Date()
                if prefix == "a" {
                    let failover = try formation.autoctl(["perform", "failover", "--pgdata", formation.monitor])
                    #expect(failover.status == 0, "\(failover.output)")
                } else {
                    try formation.shortenDemoteTimeout()
                    try formation.killPrimary()
                }
                steps += ", the failover begun by \(since())"
                try await Self.waitFor("every job of phase \(prefix) terminal on the new primary", supervisor, patience)
                {
                    try psql("SELECT count(*) FROM push.jobs WHERE state IN ('pending', 'running') AND \(mine)") == "0"
                }
                steps += ", every job terminal at \(since())"
                let delivered =
                    Int(try psql("SELECT count(*) FROM push.jobs WHERE state = 'delivered' AND \(mine)")) ?? 0
                let dead = Int(try psql("SELECT count(*) FROM push.dead_jobs WHERE \(mine)")) ?? 0
                #expect(
                    delivered + dead == perPhase,
                    "none lost in phase \(prefix): \(delivered) delivered, \(dead) dead"
                )
                // The outage as the producers see it: the longest gap between outcomes written after the failover
                // began, and when the first outcome after that gap (on the new primary) was written.
                let times =
                    try psql(
                        "SELECT extract(epoch FROM delivered_at) FROM push.jobs WHERE \(mine) AND delivered_at >= to_timestamp(\(failedAt.timeIntervalSince1970)) ORDER BY 1"
                    ).split(separator: "\n").compactMap { Double($0) }
                var gap = (length: 0.0, end: failedAt.timeIntervalSince1970)
                var previous = failedAt.timeIntervalSince1970
                for time in times {
                    if time - previous > gap.length { gap = (time - previous, time) }
                    previous = time
                }
                let requests = simulator.requests.filter { $0.deviceToken?.hasPrefix(prefix) == true }
                let sentTwice = Dictionary(grouping: requests.compactMap(\.deviceToken), by: { $0 }).values.filter {
                    $0.count > 1
                }.count
                let phaseIDs = Set(requests.compactMap { $0.headers["apns-id"]?.lowercased() })
                let okTwice = simulator.faultCounters.okAnswers.filter { $0.value > 1 && phaseIDs.contains($0.key) }
                    .count
                // What a job sent twice went through: when each request arrived and on which connection.
                if okTwice > 0 {
                    let twice = Set(simulator.faultCounters.okAnswers.filter { $0.value > 1 }.map(\.key))
                    for token in Set(
                        requests.filter { twice.contains($0.headers["apns-id"]?.lowercased() ?? "") }
                            .compactMap(\.deviceToken)
                    ).prefix(3) {
                        let seen = requests.filter { $0.deviceToken == token }.map {
                            "conn \($0.connectionID) at \(String(format: "%+.3f", $0.receivedAt.timeIntervalSince(failedAt))) s"
                        }
                        let row = try? psql(
                            "SELECT attempts, locked_by, history::text FROM push.jobs WHERE device_token = '\(token)'"
                        )
                        print("sent twice: \(seen.joined(separator: ", ")); row: \(row ?? "?")")
                    }
                }
                // Each worker carries its held jobs and unwritten outcomes over to the new primary: with nothing
                // lost in replication, nothing is sent again.
                #expect(supervisor.handOvers == livesBefore, "the workers switched without a restart")
                // Before claims and outcome writes confirmed their commit (JobQueue.forEachRow), about one planned
                // switchover in four sent 10-26 jobs twice: the old primary was stopped with their commits
                // waiting for the standby, after PostgresNIO had reported the statements done. 0 in every run
                // since; bounded here by the jobs in flight (two workers' concurrency) and printed.
                #expect(okTwice <= 2 * 40, "at most the jobs in flight answered 200 twice in phase \(prefix)")
                secondSends += okTwice
                figures.append(
                    "\(phase): \(perPhase) jobs, \(requests.count) requests, \(sentTwice) sent twice (\(okTwice) answered 200 twice), \(delivered) delivered, \(dead) dead, 0 lost; \(supervisor.handOvers - livesBefore) worker hand-overs (exit 75); no outcome written for \(String(format: "%.1f", gap.length)) s, the first on the new primary \(String(format: "%.1f", gap.end - failedAt.timeIntervalSince1970)) s after the failover began; \(steps)"
                )
            }
            watching.cancel()
            await watching.value
            supervisor.stopAll()
            // The invariants over both phases; a 200 answered twice beyond a worker's death only as counted above.
            let summary = try await Invariants.assert(
                simulator: simulator,
                jobs: perPhase * 2,
                diedWorkers: supervisor.handedOverNames,
                unexplainedSecondSendsAllowed: secondSends,
                context: "(pg_auto_failover)",
                count: { Int64(try psql($0)) ?? -1 },
                texts: { try psql($0).split(separator: "\n").map(String.init) }
            )
            let durability = supervisor.logs().split(separator: "\n").filter { $0.contains("durability:") }
            #expect(
                durability.first?.contains("synchronous replication") == true,
                "the first worker names the synchronous standby: \(durability.first ?? "no durability line")"
            )
            figures.append("the invariants checked at \(since())")
            for line in figures { print(line) }
            print("invariants: \(summary)")
            print("durability lines, first and last:\n\(durability.first ?? "")\n\(durability.last ?? "")")
        }
    }

    struct CLIFailure: Error { var output: String }

    static func waitFor(
        _ what: String,
        _ supervisor: Supervisor,
        _ timeout: Duration = .seconds(150),
        diagnose: () -> String = { "" },
        _ condition: () throws -> Bool
    ) async throws {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if (try? condition()) == true { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        Issue.record("timed out waiting for \(what)\n\(supervisor.report())\n\(diagnose())")
        throw CancellationError()
    }

    /// Restarts a worker that hands over (exit 75) under a new id, as systemd's Restart=on-failure does with the
    /// default worker id (host name and pid); any other exit is a test failure.
    final class Supervisor: Sendable {
        struct Life: Sendable {
            var slot: String
            var name: String
            var process: ChildProcess.Running
            var status: Int32?
        }
        let directory: String
        let launch: @Sendable (String, String) throws -> ChildProcess.Running
        private let lives = Mutex<[Life]>([])
        private let stopping = Mutex(false)

        init(directory: String, launch: @escaping @Sendable (String, String) throws -> ChildProcess.Running) {
            self.directory = directory
            self.launch = launch
        }

        func start(slots: [String]) throws { for slot in slots { try self.startLife(slot) } }

        private func startLife(_ slot: String) throws {
            let count = self.lives.withLock { $0.filter { $0.slot == slot }.count }
            let name = "\(slot)\(count + 1)"
            let process = try self.launch(name, self.directory + "/\(name).log")
            self.lives.withLock { $0.append(Life(slot: slot, name: name, process: process)) }
        }

        /// Reaps exited workers every 100 ms; one that handed over is started again.
        func watch() async {
            while !Task.isCancelled {
                var restart: [String] = []
                self.lives.withLock { lives in
                    for index in lives.indices where lives[index].status == nil {
                        var status: Int32 = 0
                        guard waitpid(lives[index].process.pid, &status, WNOHANG) == lives[index].process.pid else {
                            continue
                        }
                        let code = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
                        lives[index].status = code
                        if code == 75 { restart.append(lives[index].slot) }
                    }
                }
                if !self.stopping.withLock({ $0 }) {
                    for slot in restart { try? self.startLife(slot) }
                }
                try? await Task.sleep(for: .milliseconds(100))
            }
        }

        var handOvers: Int { self.lives.withLock { $0.filter { $0.status == 75 }.count } }
        var handedOverNames: Set<String> { Set(self.lives.withLock { $0.filter { $0.status == 75 }.map(\.name) }) }

        /// SIGTERM to every live worker; each must drain and exit 0.
        func stopAll() {
            self.stopping.withLock { $0 = true }
            let running = self.lives.withLock { $0.filter { $0.status == nil } }
            for life in running { life.process.signal(SIGTERM) }
            for life in running {
                let status = life.process.wait(limit: .seconds(60))
                self.lives.withLock { lives in
                    if let index = lives.firstIndex(where: { $0.name == life.name }) { lives[index].status = status }
                }
                #expect(status == 0, "\(life.name) drained: \(life.process.output.suffix(1500))")
            }
            let unexpected = self.lives.withLock { $0.filter { ![0, 75].contains($0.status ?? 0) } }
            for life in unexpected {
                Issue.record("\(life.name) exited \(life.status ?? -1): \(life.process.output.suffix(1500))")
            }
        }

        func killAll() {
            self.stopping.withLock { $0 = true }
            for life in self.lives.withLock({ $0 }) where life.status == nil {
                var status: Int32 = 0
                guard waitpid(life.process.pid, &status, WNOHANG) == 0 else { continue }
                kill(life.process.pid, SIGKILL)
                while waitpid(life.process.pid, &status, 0) < 0 && errno == EINTR {}
            }
        }

        /// Every life's log, in the order they started.
        func logs() -> String { self.lives.withLock { $0 }.map(\.process.output).joined(separator: "\n") }

        func report() -> String {
            self.lives.withLock { $0 }.map { life in
                "== \(life.name) (exit \(life.status.map(String.init) ?? "running"))\n"
                    + life.process.output.split(separator: "\n").suffix(12).joined(separator: "\n")
            }.joined(separator: "\n")
        }
    }
}

/// A pg_auto_failover formation on this machine, as the postgres user: a monitor and two Postgres nodes, each
/// `pg_autoctl run` in a session of its own (so killing one kills its keeper and its Postgres together), with
/// TLS from a CA made for the test and the monitor's health checks shortened (a dead primary noticed in ~3 s
/// rather than ~30 s).
struct AutoFailoverFormation: Sendable {
    let directory: String
    let monitorPort: Int
    let ports: [Int]
    let caFile: String
    var monitor: String { self.directory + "/monitor" }
    var nodes: [String] { [self.directory + "/node1", self.directory + "/node2"] }

    var environment: [String] {
        [
            "PATH=/usr/lib/postgresql/15/bin:/usr/bin:/bin", "XDG_CONFIG_HOME=\(self.directory)/config",
            "XDG_DATA_HOME=\(self.directory)/share", "XDG_RUNTIME_DIR=\(self.directory)/run",
        ]
    }

    /// Runs `pg_autoctl …` (as postgres when the test runs as root) and waits for it.
    func autoctl(_ arguments: [String]) throws -> ChildProcess.Result {
        let command = ["/usr/bin/env"] + self.environment + ["pg_autoctl"] + arguments
        if geteuid() == 0 { return try ChildProcess.run("/usr/sbin/runuser", ["-u", "postgres", "--"] + command) }
        return try ChildProcess.run(command[0], Array(command.dropFirst()))
    }

    /// Starts `pg_autoctl run` for one data directory in a new session, in the background.
    func run(_ pgdata: String) throws {
        let command = ["/usr/bin/env"] + self.environment + ["setsid", "pg_autoctl", "run", "--pgdata", pgdata]
        let log = pgdata + ".run.log"
        if geteuid() == 0 {
            _ = try ChildProcess.start(
                "/usr/sbin/runuser",
                ["-u", "postgres", "--"] + command,
                environment: [:],
                outputPath: log
            )
        } else {
            _ = try ChildProcess.start(command[0], Array(command.dropFirst()), environment: [:], outputPath: log)
        }
    }

    /// One SQL statement on the monitor.
    func monitorSQL(_ sql: String) throws -> String {
        let result = try ChildProcess.run(
            "/usr/bin/env",
            [
                "psql",
                "postgres://postgres@127.0.0.1:\(self.monitorPort)/pg_auto_failover?sslmode=verify-ca&sslrootcert=\(self.caFile)",
                "-Atc", sql,
            ]
        )
        guard result.status == 0 else { throw AutoFailoverTests.CLIFailure(output: result.output) }
        return result.output.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Each node's reported state, by port.
    func states() throws -> [Int: String] {
        var states: [Int: String] = [:]
        for line in try self.monitorSQL("SELECT nodeport, reportedstate FROM pgautofailover.node").split(
            separator: "\n"
        ) {
            let parts = line.split(separator: "|")
            if parts.count == 2, let port = Int(parts[0]) { states[port] = String(parts[1]) }
        }
        return states
    }

    /// Creates and starts the formation; on failure, stops what it started.
    static func start(in directory: String) throws -> AutoFailoverFormation {
        let formation = AutoFailoverFormation(
            directory: directory,
            monitorPort: try EmbeddedPostgres.freePort(),
            ports: [try EmbeddedPostgres.freePort(), try EmbeddedPostgres.freePort()],
            caFile: directory + "/ca.pem"
        )
        do {
            try formation.create()
        } catch {
            formation.stop()
            throw error
        }
        return formation
    }

    private func create() throws {
        let formation = self
        let directory = self.directory
        try FileManager.default.createDirectory(atPath: directory + "/run", withIntermediateDirectories: true)
        // A CA of the test's own and a server certificate for 127.0.0.1 and localhost.
        func openssl(_ arguments: [String]) throws {
            let result = try ChildProcess.run("/usr/bin/openssl", arguments)
            try #require(result.status == 0, "openssl \(arguments.first ?? ""): \(result.output)")
        }
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        try openssl(
            ["req", "-x509"] + ec + [
                "-keyout", directory + "/ca.key", "-out", formation.caFile, "-days", "2", "-subj", "/CN=push-test-ca",
            ]
        )
        try openssl(
            ["req"] + ec + [
                "-keyout", directory + "/server.key", "-out", directory + "/server.csr", "-subj", "/CN=localhost",
            ]
        )
        try "subjectAltName=DNS:localhost,IP:127.0.0.1\n".write(
            toFile: directory + "/san.ext",
            atomically: true,
            encoding: .utf8
        )
        try openssl([
            "x509", "-req", "-in", directory + "/server.csr", "-CA", formation.caFile, "-CAkey", directory + "/ca.key",
            "-CAcreateserial", "-out", directory + "/server.crt", "-days", "2", "-extfile", directory + "/san.ext",
        ])
        chmod(directory + "/server.key", 0o600)
        if geteuid() == 0 { _ = try ChildProcess.run("/bin/chown", ["-R", "postgres", directory]) }
        let tls = [
            "--ssl-ca-file", formation.caFile, "--server-cert", directory + "/server.crt", "--server-key",
            directory + "/server.key", "--ssl-mode", "verify-ca",
        ]
        let monitor = try formation.autoctl(
            [
                "create", "monitor", "--pgdata", formation.monitor, "--pgport", "\(formation.monitorPort)",
                "--hostname", "127.0.0.1", "--auth", "trust",
            ] + tls
        )
        try #require(monitor.status == 0, "pg_autoctl create monitor: \(monitor.output)")
        // The monitor has no --listen: keep it off every interface but loopback too.
        let listen = try formation.autoctl([
            "config", "set", "--pgdata", formation.monitor, "postgresql.listen_addresses", "127.0.0.1",
        ])
        try #require(listen.status == 0, "pg_autoctl config set: \(listen.output)")
        try formation.run(formation.monitor)
        try Self.until("the monitor answers") { try formation.monitorSQL("SELECT 1") == "1" }
        // A dead primary noticed in ~3 s (defaults: 5 s checks, 20 s unhealthy). primary_demote_timeout keeps
        // its default (30 s) here: it is how long a demoted primary's last writes have to reach the standby
        // before it is promoted; at 5 s, one planned failover in six lost 597 acknowledged commits. The killed
        // primary's phase shortens it (``shortenDemoteTimeout()``): nothing of a dead primary is pending.
        for (name, value) in [
            ("health_check_period", 1000), ("health_check_timeout", 1000), ("health_check_max_retries", 1),
            ("health_check_retry_delay", 500), ("node_considered_unhealthy_timeout", 3000),
        ] {
            _ = try formation.monitorSQL("ALTER SYSTEM SET pgautofailover.\(name) = \(value)")
        }
        _ = try formation.monitorSQL("SELECT pg_reload_conf()")
        let monitorURL =
            "postgres://autoctl_node@127.0.0.1:\(formation.monitorPort)/pg_auto_failover?sslmode=verify-ca&sslrootcert=\(formation.caFile)"
        for (index, pgdata) in formation.nodes.enumerated() {
            let node = try formation.autoctl(
                [
                    "create", "postgres", "--pgdata", pgdata, "--pgport", "\(formation.ports[index])", "--hostname",
                    "127.0.0.1", "--listen", "127.0.0.1", "--auth", "trust", "--monitor", monitorURL, "--dbname",
                    "app", "--name", "node\(index + 1)",
                ] + tls
            )
            try #require(node.status == 0, "pg_autoctl create postgres: \(node.output)")
            try formation.run(pgdata)
            // Alone, the first node is "single"; it turns primary once the second is a secondary.
            let wanted = index == 0 ? "single" : "secondary"
            try Self.until("node\(index + 1) \(wanted)") { try formation.states()[formation.ports[index]] == wanted }
        }
        try Self.until("the formation primary and secondary") {
            Set(try formation.states().values) == ["primary", "secondary"]
        }
    }

    static func until(_ what: String, _ timeout: Duration = .seconds(90), _ condition: () throws -> Bool) throws {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if (try? condition()) == true { return }
            usleep(200_000)
        }
        Issue.record("pg_auto_failover: timed out waiting for \(what)")
        throw CancellationError()
    }

    /// The session (process group) of the `pg_autoctl run` serving `pgdata`: its Postgres is in it.
    func session(of pgdata: String) -> pid_t? { self.postmaster(of: pgdata)?.session }

    /// The postmaster serving `pgdata` and its session. Its own children are not in that session: each calls
    /// `setsid` (``stop()`` kills them one by one).
    func postmaster(of pgdata: String) -> (pid: pid_t, session: pid_t)? {
        guard let text = try? String(contentsOfFile: pgdata + "/postmaster.pid", encoding: .utf8),
            let pid = Int32(text.split(separator: "\n").first ?? ""),
            // Still this node's postmaster: the file outlives a killed server, and its pid may since be another
            // process's (pids wrap at 32,768 here, and a run forks thousands of backends), whose group would die.
            let command = try? String(contentsOfFile: "/proc/\(pid)/cmdline", encoding: .utf8),
            command.contains(pgdata),
            let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return nil }
        // Fields after "(comm)": state, ppid, pgrp.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 2, let session = Int32(fields[2]) else { return nil }
        return (pid, session)
    }

    /// The processes whose parent is `pid`.
    static func children(of pid: pid_t) -> [pid_t] {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap { entry -> pid_t? in
            guard let child = Int32(entry),
                let stat = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
                let close = stat.lastIndex(of: ")")
            else { return nil }
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            return fields.count > 1 && Int32(fields[1]) == pid ? child : nil
        }
    }

    /// The standby of a primary that died is promoted 2 s after it is noticed, not 30 s: its keeper died with
    /// it, so no demotion is pending and every acknowledged commit is on the synchronous standby already.
    func shortenDemoteTimeout() throws {
        _ = try self.monitorSQL("ALTER SYSTEM SET pgautofailover.primary_demote_timeout = 2000")
        _ = try self.monitorSQL("SELECT pg_reload_conf()")
    }

    /// Kills the primary's keeper and Postgres at once (kill -9 of its session), as a machine dying.
    func killPrimary() throws {
        let states = try self.states()
        let index = try #require(self.ports.firstIndex { states[$0] == "primary" }, "a primary: \(states)")
        let group = try #require(self.session(of: self.nodes[index]), "the primary's session")
        kill(-group, SIGKILL)
    }

    func stop() {
        for pgdata in self.nodes + [self.monitor] {
            guard let (pid, group) = self.postmaster(of: pgdata) else { continue }
            // The postmaster's children first: each is a session of its own, and the monitor's health-check
            // worker and logger outlived a killed postmaster (four pairs after four runs, 2026-11-29).
            for child in Self.children(of: pid) { kill(child, SIGKILL) }
            kill(-group, SIGKILL)
        }
        // The keepers of killed Postgres servers would restart them: their sessions went with the kill above.
        usleep(200_000)
        for pgdata in self.nodes + [self.monitor] {
            if let group = self.session(of: pgdata) { kill(-group, SIGKILL) }
        }
    }
}
