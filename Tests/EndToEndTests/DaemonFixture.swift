import APNsSimulator
import Crypto
import Foundation
import Logging
import PostgresNIO
import PushEmbeddedPostgres
import PushProcess
import PushQueue
import PushQueueTesting
import Synchronization
import Testing

/// The real `push-worker` binary against a test database and an in-process simulator over real TLS.
struct DaemonFixture: Sendable {
    let db: TestDatabase
    let simulator: APNsSimulator
    let directory: String
    let caFile: String
    let keyPath: String
    let credentials: SimulatorCredentials
    /// The FCM service account's key file the simulator trusts, when the fixture serves FCM too: workers get
    /// it as credential `default` of fcm jobs.
    var fcmAccountPath: String? = nil
    /// The workers this fixture started: any still running when its test ends (a failed wait threw before
    /// the test stopped it) is killed, so it cannot compete for the cores with the tests after it.
    let children = Children()

    final class Children: Sendable {
        private let started = Mutex<[ChildProcess.Running]>([])
        private let step = Mutex("starting")
        func add(_ child: ChildProcess.Running) { self.started.withLock { $0.append(child) } }
        /// What the test is doing now (``DaemonFixture/phase(_:)``).
        func phase(_ text: String) { self.step.withLock { $0 = text } }
        /// For the test watchdog: the test's step, each child's last lines, so a hang in CI shows where
        /// the test waits and what the workers said.
        func report() -> String {
            "the test's step: \(self.step.withLock { $0 })\n"
                + self.started.withLock { $0 }.map { child in
                    let tail = child.output.split(separator: "\n", omittingEmptySubsequences: false).suffix(15)
                    return "worker pid \(child.pid), its last lines:\n" + tail.joined(separator: "\n") + "\n"
                }.joined()
        }
        /// Kills and reaps those not yet reaped; one already reaped (by its test) is left alone.
        func killRunning() {
            for pid in self.started.withLock({ $0.map(\.pid) }) {
                var status: Int32 = 0
                guard waitpid(pid, &status, WNOHANG) == 0 else { continue }
                kill(pid, SIGKILL)
                while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
            }
        }
    }

    /// The push-worker executable the end-to-end tests run (``ReleaseBuild/pushWorker``).
    static var binary: String { ReleaseBuild.pushWorker.path }

    /// - Parameters:
    ///   - fcm: the simulator serves FCM too, and every worker gets its service account
    ///     (`FCM_SERVICE_ACCOUNT_PATH`, `--fcm-endpoint`, `--fcm-ca-file`).
    ///   - expected: about how long the test takes alone (``HeavyTestGate`` lets the longest in first).
    ///   - mostlyWaiting: it spends most of that on timers (an outage, a freeze, a steady stream): let in first.
    static func run<T: Sendable>(
        fcm: Bool = false,
        expected: Duration = .seconds(5),
        mostlyWaiting: Bool = false,
        simulator configure: @Sendable (inout APNsSimulator.Configuration) -> Void = { _ in },
        _ body: @Sendable (DaemonFixture) async throws -> T
    ) async throws -> T {
        // Workers, a simulator and Postgres driven hard: at most a few such tests at once (HeavyTestGate).
        try await HeavyTestGate.run(expected: expected, mostlyWaiting: mostlyWaiting) {
            try await Self.runNow(fcm: fcm, simulator: configure, body)
        }
    }

    private static func runNow<T: Sendable>(
        fcm: Bool,
        simulator configure: @Sendable (inout APNsSimulator.Configuration) -> Void,
        _ body: @Sendable (DaemonFixture) async throws -> T
    ) async throws -> T {
        try #require(
            FileManager.default.isExecutableFile(atPath: binary),
            "build the push-worker executable first (swift build)"
        )
        return try await TestPostgres.withDatabase { db in
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("e2e-\(UUID().uuidString)")
                .path
            let credentials = try SimulatorCredentials.generate(in: directory)
            var configuration = APNsSimulator.Configuration(keys: [credentials.keyID: credentials.trustedKey])
            let account = fcm ? try SimulatorFCMAccount.make() : nil
            if let account { configuration.fcmAccounts = account.trusted }
            configure(&configuration)
            var logger = Logger(label: "push.test.sim")
            logger.logLevel = .error
            let simulator = try APNsSimulator(configuration: configuration, logger: logger)
            defer { try? FileManager.default.removeItem(atPath: directory) }
            return try await simulator.run { simulator in
                let caFile = try simulator.writeCACertificate(to: directory + "/ca.pem")
                let fixture = DaemonFixture(
                    db: db,
                    simulator: simulator,
                    directory: directory,
                    caFile: caFile,
                    keyPath: credentials.keyPath,
                    credentials: credentials,
                    fcmAccountPath: try account?.write(in: directory + "/fcm", host: "localhost", port: simulator.port)
                )
                let report = TestWatchdog.addReport(
                    { [children = fixture.children] in children.report() },
                    onExit: { [children = fixture.children] in children.killRunning() }
                )
                defer {
                    TestWatchdog.removeReport(report)
                    fixture.children.killRunning()
                }
                fixture.phase("running the test's body")
                return try await body(fixture)
            }
        }
    }

    /// Starts `push-worker run` with fast test timings; `extra` overrides them.
    func startWorker(
        _ name: String = "w1",
        _ extra: [String] = [],
        environment more: [String: String] = [:]
    ) throws -> ChildProcess.Running {
        let arguments =
            [
                "run", "--worker-id", name, "--apns-endpoint", "https://localhost:\(self.simulator.port)",
                "--apns-ca-file", self.caFile,
                "--base-delay-ms", "20", "--max-delay-ms", "100", "--poll-interval-ms", "200", "--log-level", "warning",
                "--metrics-port", "0", "--metrics-host", "127.0.0.1",
            ]
            + (self.fcmAccountPath == nil
                ? [] : ["--fcm-endpoint", "https://localhost:\(self.simulator.port)", "--fcm-ca-file", self.caFile])
            + extra
        let worker = try ChildProcess.start(
            Self.binary,
            arguments,
            environment: self.environment.merging(more) { $1 },
            outputPath: self.directory + "/\(name).log"
        )
        self.children.add(worker)
        return worker
    }

    /// The port a worker printed for its metrics and health endpoint.
    func metricsPort(_ worker: ChildProcess.Running) async throws -> Int {
        for _ in 0..<100 {
            if let line = worker.output.split(separator: "\n").first(where: {
                $0.hasPrefix("metrics and health on http://")
            }),
                let address = line.split(separator: " ").dropFirst(4).first, let colon = address.lastIndex(of: ":"),
                let port = Int(address[address.index(after: colon)...])
            {
                return port
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        Issue.record("the worker printed no metrics address: \(worker.output.suffix(500))")
        throw CancellationError()
    }

    /// GETs a path from a worker's metrics and health endpoint; returns (status, body).
    func get(_ worker: ChildProcess.Running, _ path: String) async throws -> (Int, String) {
        let found = try await self.metricsPort(worker)
        let script = """
            import sys, urllib.request, urllib.error
            try:
                r = urllib.request.urlopen("http://127.0.0.1:\(found)\(path)", timeout=5); print(r.status); print(r.read().decode())
            except urllib.error.HTTPError as e:
                print(e.code); print(e.read().decode())
            """
        let result = try ChildProcess.run("/usr/bin/env", ["python3", "-c", script])
        let lines = result.output.split(separator: "\n", maxSplits: 1, omittingEmptySubsequences: false)
        return (Int(lines.first ?? "") ?? 0, lines.count > 1 ? String(lines[1]) : "")
    }

    /// Runs a CLI verb to completion.
    /// Runs a `push-worker` command, waited for on a Dispatch thread: many talk to the in-process simulator,
    /// whose handlers need the concurrency pool this would otherwise block (a CLI request timed out at 10 s
    /// with two such waits side by side on two cores).
    func cli(_ arguments: [String]) async throws -> ChildProcess.Result {
        var command = ["env"]
        for (key, value) in self.environment { command.append("\(key)=\(value)") }
        let argv = Array(command.dropFirst()) + [Self.binary] + arguments
        return try await offPool { try ChildProcess.run("/usr/bin/env", argv) }
    }

    var environment: [String: String] {
        [
            "DATABASE_URL": self.db.url.connectionString,
            "APNS_KEY_PATH": self.keyPath, "APNS_KEY_ID": self.credentials.keyID,
            "APNS_TEAM_ID": self.credentials.teamID,
            // The workers' and the CLI's webhook secrets directory: the fixture's own.
            "PUSH_WEBHOOKS_SECRETS_DIR": self.directory,
        ].merging(self.fcmAccountPath.map { ["FCM_SERVICE_ACCOUNT_PATH": $0] } ?? [:]) { $1 }
    }

    /// Names what the test does now, for the watchdog's report if the run hangs there.
    func phase(_ text: String) { self.children.phase(text) }

    /// Polls `condition` until it holds or `timeout` passes.
    func waitUntil(
        _ timeout: Duration = .seconds(60),
        _ what: String,
        _ condition: @Sendable () async throws -> Bool
    ) async throws {
        self.phase("waiting for: \(what)")
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if try await condition() { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        // What the jobs and the workers were doing, so a timeout says where things stood: the jobs by state; the
        // first still unfinished, the workers' heartbeats and what their sessions do (a worker that stopped
        // claiming, its heartbeat stale or a statement stuck, reads differently from a job left out of claims).
        let db = self.db
        func lines(_ sql: String) async -> String {
            let rows = try? await db.client.query(PostgresQuery(unsafeSQL: sql)).decode(String.self).collect()
            return (rows ?? []).joined(separator: "; ")
        }
        let states = await lines(
            "SELECT platform || ' ' || state || ' ' || coalesce(reason, '-') || ' attempts ' || attempts || ': ' || count(*) FROM push.jobs GROUP BY platform, state, reason, attempts ORDER BY 1"
        )
        let unfinished = await lines(
            "SELECT concat_ws(' ', id, state, 'attempts', attempts, 'due in', round(extract(epoch FROM run_at - now())::numeric, 1), 'locked by', coalesce(locked_by, '-')) FROM push.jobs WHERE state IN ('pending', 'running') ORDER BY id LIMIT 5"
        )
        let heartbeats = await lines(
            "SELECT concat_ws(' ', worker_id, 'last heartbeat', round(extract(epoch FROM now() - heartbeat_at)::numeric, 1), 's ago', CASE WHEN stopped_at IS NOT NULL THEN 'stopped' END) FROM push.workers ORDER BY 1"
        )
        let sessions = await lines(
            "SELECT concat_ws(' ', application_name, state, coalesce(wait_event_type || ':' || wait_event, '-'), round(extract(epoch FROM now() - query_start)::numeric, 1), left(regexp_replace(query, '\\s+', ' ', 'g'), 60)) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY 1"
        )
        Issue.record(
            """
            timed out waiting for: \(what)
            jobs: \(states)
            unfinished: \(unfinished)
            workers: \(heartbeats)
            sessions: \(sessions)
            \(self.children.report())
            """
        )
        throw CancellationError()
    }

    /// A session of its own on the test database (a producer holding a transaction open, say); close it.
    func session(id: Int) async throws -> PostgresConnection {
        try await PostgresConnection.connect(
            configuration: try self.db.url.connectionConfiguration(),
            id: id,
            logger: Logger(label: "push.test.session")
        )
    }

    /// Inserts `count` plain alerts for com.example.app, tokens 1…count.
    func insertAlerts(_ count: Int, offset: Int = 0) async throws {
        try await self.db.execute(
            """
            INSERT INTO push.jobs (topic, device_token, payload)
            SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"hi"}}' FROM generate_series(\(offset + 1), \(offset + count)) AS g
            """
        )
    }

    /// Jobs not yet terminal (pending or running).
    func unfinished() async throws -> Int64 {
        try await self.db.int64("SELECT count(*) FROM push.jobs WHERE state NOT IN ('delivered', 'fanned_out')")
    }

    static func token(_ n: Int) -> String {
        let hex = String(n, radix: 16)
        return String(repeating: "0", count: 64 - hex.count) + hex
    }
}

extension ChildProcess.Running {
    /// Waits for it to exit after a signal. One still running after `limit` is killed and the test fails with
    /// its last output: a worker that hangs in its drain fails its test instead of hanging the whole run.
    func reap(within limit: Duration = .seconds(90)) {
        if self.wait(killingAfter: limit).hung {
            Issue.record(
                "pid \(self.pid) still ran \(limit) after it was told to stop; killed. It printed:\n\(self.output.suffix(3000))"
            )
        }
    }
}
