import APNsSimulator
import Foundation
import Logging
import PushEmbeddedPostgres
import PushProcess
import PushQueue
import PushQueueTesting
import Testing

/// The real binary against a Postgres cluster of its own (the test stops, restarts or freezes it, which
/// the shared test cluster must not suffer) and an in-process simulator over real TLS.
struct OwnClusterFixture: Sendable {
    let cluster: EmbeddedPostgres
    let url: DatabaseURL
    let directory: String
    let simulator: APNsSimulator
    let caFile: String
    let environment: [String: String]
    /// Workers still running when the test ends are killed (see ``DaemonFixture/Children``).
    let children = DaemonFixture.Children()

    static func run(
        _ label: String,
        expected: Duration = .seconds(5),
        mostlyWaiting: Bool = false,
        simulator configure: @Sendable (inout APNsSimulator.Configuration) -> Void = { _ in },
        _ body: @Sendable (OwnClusterFixture) async throws -> Void
    ) async throws {
        // A cluster of its own and workers: at most a few such tests at once (HeavyTestGate), longest first.
        try await HeavyTestGate.run(expected: expected, mostlyWaiting: mostlyWaiting) {
            try await Self.runNow(label, simulator: configure, body)
        }
    }

    private static func runNow(
        _ label: String,
        simulator configure: @Sendable (inout APNsSimulator.Configuration) -> Void,
        _ body: @Sendable (OwnClusterFixture) async throws -> Void
    ) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("\(label)-\(UUID().uuidString)")
            .path
        var logger = Logger(label: "push.test.\(label)")
        logger.logLevel = .error
        let port = try EmbeddedPostgres.freePort()
        let cluster = EmbeddedPostgres(
            configuration: .init(dataDirectory: directory + "/data", port: port, fsync: false),
            logger: logger
        )
        let url = try cluster.start()
        defer {
            cluster.stop()
            try? FileManager.default.removeItem(atPath: directory)
        }
        let credentials = try SimulatorCredentials.generate(in: directory + "/keys")
        var configuration = APNsSimulator.Configuration(keys: [credentials.keyID: credentials.trustedKey])
        configure(&configuration)
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        try await simulator.run { simulator in
            let caFile = try simulator.writeCACertificate(to: directory + "/ca.pem")
            let environment = [
                "DATABASE_URL": url.connectionString, "APNS_KEY_PATH": credentials.keyPath,
                "APNS_KEY_ID": credentials.keyID,
                "APNS_TEAM_ID": credentials.teamID,
            ]
            let fixture = OwnClusterFixture(
                cluster: cluster,
                url: url,
                directory: directory,
                simulator: simulator,
                caFile: caFile,
                environment: environment
            )
            let report = TestWatchdog.addReport(
                { [children = fixture.children] in TestPostgres.activityReport(url) + children.report() },
                onExit: { [children = fixture.children] in children.killRunning() }
            )
            defer {
                TestWatchdog.removeReport(report)
                fixture.children.killRunning()
            }
            try await body(fixture)
        }
    }

    /// Starts `push-worker run` against this cluster and the simulator; `extra` adds flags, `more` environment
    /// (another DATABASE_URL, say).
    func startWorker(
        _ name: String,
        _ extra: [String] = [],
        environment more: [String: String] = [:]
    ) throws -> ChildProcess.Running {
        let worker = try ChildProcess.start(
            DaemonFixture.binary,
            [
                "run", "--worker-id", name, "--apns-endpoint", "https://localhost:\(self.simulator.port)",
                "--apns-ca-file", self.caFile,
                "--poll-interval-ms", "200", "--no-metrics",
            ] + extra,
            environment: self.environment.merging(more) { $1 },
            outputPath: self.directory + "/\(name).log"
        )
        self.children.add(worker)
        return worker
    }

    /// One SQL statement through psql (a connection of its own); its output, trimmed.
    func psql(_ sql: String) throws -> String {
        try ChildProcess.run("/usr/bin/env", ["psql", self.url.connectionString, "-Atc", sql]).output
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Polls `condition` (errors count as false: the server may be down) until it holds.
    func waitFor(
        _ what: String,
        _ timeout: Duration = .seconds(120),
        _ condition: @escaping @Sendable () throws -> Bool
    ) async throws {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            // psql is a child process: waited for on a Dispatch thread, not on the concurrency pool.
            if (try? await offPool(condition)) == true { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        // Say what the workers said: their logs go with the directory.
        let logs =
            (try? FileManager.default.contentsOfDirectory(atPath: self.directory))?.filter { $0.hasSuffix(".log") }
            ?? []
        let tails = logs.sorted().map { name in
            let text = (try? String(contentsOfFile: self.directory + "/" + name, encoding: .utf8)) ?? ""
            return "== \(name)\n\(text.suffix(3000))"
        }
        Issue.record("timed out waiting for \(what)\n\(tails.joined(separator: "\n"))")
        throw CancellationError()
    }
}
