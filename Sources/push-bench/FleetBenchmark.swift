import APNsSimulator
import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import PushProcess
import PushQueue
import Synchronization

/// `push-bench fleet`: the fleet at its real shape, in one run. The claim's time with a paused topic and a
/// spent limit, each over a large due backlog, next to the empty-queue claim; concurrent claimers with and
/// without a rate limit present; the real binary draining one credential's backlog with one credential
/// configured and with ten; a producer's INSERT latency while `migrate` runs on a large table.
struct FleetBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fleet",
        abstract:
            "Fleet shape: claim p50/p99 over a paused topic and a spent limit, 4 claimers with and without a limit, drain with 1 vs 10 credentials, producer waits during migrate."
    )

    @Option(help: "Due backlog of the paused topic and of the spent limit's topic.") var backlog: Int = 300_000
    @Option(help: "Claims measured per case.") var rounds: Int = 200
    @Option(help: "Jobs per claim.") var batch: Int = 250
    @Option(help: "Jobs drained by the real binary, per configuration.") var drain: Int = 20_000
    @Option(help: "Rows in push.jobs while migrate runs.") var migrateRows: Int = 1_000_000
    @Option(help: "The schema version the table is at before migrate runs.") var migrateFrom: Int = 7
    @Option(help: "The push-worker binary (the drain is skipped without it).") var worker: String?
    @Option(help: "Which parts to run: claim, claimers, drain, migrate (comma-separated).") var parts: String =
        "claim,claimers,drain,migrate"

    func run() async throws {
        let parts = Set(self.parts.split(separator: ",").map(String.init))
        let logger = benchLogger()
        if parts.contains("claim") { try await self.claimLatency(logger) }
        if parts.contains("claimers") { try await self.claimers(logger) }
        if parts.contains("drain"), let worker = self.worker { try await self.drainCredentials(worker, logger) }
        if parts.contains("migrate") { try await self.migrateWait(logger) }
    }

    static func milliseconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) * 1000 + Double(duration.components.attoseconds) / 1e15
    }

    static func percentile(_ samples: [Double], _ p: Double) -> Double {
        let sorted = samples.sorted()
        return sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
    }

    /// p50/p99 of a claim of `batch` due jobs of com.example.app, with the queue otherwise empty, then with a
    /// paused topic's backlog due, then with a spent limit's backlog due (same credential, same priority).
    func claimLatency(_ logger: Logger) async throws {
        try await withBenchDatabase(named: "push_bench_fleet_claim", logger: logger) { url, _ in
            try await withClient(url, logger: logger, workerSession: true) { client in
                try await Migrator(client: client, logger: logger).migrate()
                let queue = JobQueue(client: client, logger: logger, clock: ContinuousClock(), preparedStatements: true)
                func measure() async throws -> (p50: Double, p99: Double) {
                    let samples = try await claimSamples(
                        client,
                        queue,
                        rounds: self.rounds,
                        batch: self.batch,
                        logger: logger
                    )
                    return (Self.percentile(samples, 0.5), Self.percentile(samples, 0.99))
                }
                func backlog(_ topic: String) async throws {
                    // Older than the measured jobs and of a higher priority: ahead of them in every order.
                    try await client.query(
                        """
                        INSERT INTO push.jobs (topic, device_token, payload, priority, run_at)
                        SELECT \(topic), lpad(to_hex(g), 64, 'd'), '{"aps":{}}', 5, now() - interval '1 hour'
                          FROM generate_series(1, \(Int64(self.backlog))) AS g
                        """,
                        logger: logger
                    )
                    try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
                }
                try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
                let empty = try await measure()
                try await backlog("com.example.paused")
                try await client.query(
                    "INSERT INTO push.pauses (topic, reason) VALUES ('com.example.paused', 'bench')",
                    logger: logger
                )
                let paused = try await measure()
                try await client.query("DELETE FROM push.jobs WHERE topic = 'com.example.paused'", logger: logger)
                try await client.query("DELETE FROM push.pauses", logger: logger)
                try await backlog("com.example.limited")
                // One a day, and the next send a day away: no room.
                try await client.query(
                    """
                    INSERT INTO push.rate_limits (topic, per_second, burst, next_send_at)
                    VALUES ('com.example.limited', 0.0000116, 1, now() + interval '1 day')
                    """,
                    logger: logger
                )
                let spent = try await measure()
                func line(_ name: String, _ m: (p50: Double, p99: Double)) -> String {
                    String(
                        format: "%@: p50 %.2f ms, p99 %.2f ms (%.2fx / %.2fx the empty queue's)",
                        name,
                        m.p50,
                        m.p99,
                        m.p50 / empty.p50,
                        m.p99 / empty.p99
                    )
                }
                print("claim of \(self.batch) due jobs, \(self.rounds) claims per case:")
                print(String(format: "  empty queue: p50 %.2f ms, p99 %.2f ms", empty.p50, empty.p99))
                print("  " + line("paused topic over \(self.backlog) due jobs", paused))
                print("  " + line("spent limit over \(self.backlog) due jobs", spent))
            }
        }
    }

    /// Claims per second of 4 concurrent claimers for 5 s over a large due backlog, without a rate limit and
    /// with one present (on a topic with due jobs of its own, 1,000/s).
    func claimers(_ logger: Logger) async throws {
        try await withBenchDatabase(named: "push_bench_fleet_claimers", logger: logger) { url, _ in
            try await withClient(url, logger: logger, workerSession: true) { client in
                try await Migrator(client: client, logger: logger).migrate()
                try await client.query(
                    """
                    INSERT INTO push.jobs (topic, device_token, payload)
                    SELECT CASE WHEN g % 10 = 0 THEN 'com.example.limited' ELSE 'com.example.app' END,
                           lpad(to_hex(g), 64, 'e'), '{"aps":{}}'
                      FROM generate_series(1, 400000) AS g
                    """,
                    logger: logger
                )
                try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
                func rate() async throws -> Double {
                    let deadline = ContinuousClock.now + .seconds(5)
                    return try await withThrowingTaskGroup(of: Int.self) { group in
                        for n in 0..<4 {
                            group.addTask {
                                let claims = Counter()
                                try await withClient(url, logger: logger, workerSession: true) { own in
                                    let queue = JobQueue(
                                        client: own,
                                        logger: logger,
                                        clock: ContinuousClock(),
                                        preparedStatements: true
                                    )
                                    while ContinuousClock.now < deadline {
                                        let jobs = try await queue.claim(
                                            limit: 50,
                                            workerID: "c\(n)",
                                            lease: .seconds(60)
                                        )
                                        _ = try await queue.writeOutcomes(
                                            jobs.map {
                                                JobOutcome(
                                                    jobID: $0.id,
                                                    attempt: $0.attempts,
                                                    disposition: .delivered,
                                                    attemptedAt: .now,
                                                    status: 200
                                                )
                                            },
                                            workerID: "c\(n)"
                                        )
                                        claims.value.add(1, ordering: .relaxed)
                                    }
                                }
                                return claims.value.load(ordering: .relaxed)
                            }
                        }
                        return Double(try await group.reduce(0, +)) / 5
                    }
                }
                let without = try await rate()
                try await client.query(
                    "INSERT INTO push.rate_limits (topic, per_second, burst) VALUES ('com.example.limited', 1000, 50)",
                    logger: logger
                )
                let with = try await rate()
                print(
                    String(
                        format:
                            "4 claimers (50 jobs a claim, outcomes written): %.0f claims/s without a limit, %.0f with one present: %.2fx",
                        without,
                        with,
                        with / without
                    )
                )
            }
        }
    }

    /// The real binary drains `drain` jobs of credential c0, first with only c0 configured, then with ten.
    func drainCredentials(_ workerPath: String, _ logger: Logger) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("push-bench-fleet-\(getpid())")
            .path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let credentials = try SimulatorCredentials.generate(in: directory)
        let simulator = try APNsSimulator(
            configuration: .init(
                keys: [credentials.keyID: credentials.trustedKey],
                fastMode: true,
                recordRequests: false
            ),
            logger: logger
        )
        try await withBenchDatabase(named: "push_bench_fleet_drain", logger: logger) { url, _ in
            try await simulator.run { simulator in
                let caFile = try simulator.writeCACertificate(to: directory + "/ca.pem")
                try await withClient(url, logger: logger) { client in
                    try await Migrator(client: client, logger: logger).migrate()
                    var rates: [Int: Double] = [:]
                    for configured in [1, 10] {
                        var entries: [String: [String: String]] = [:]
                        for n in 0..<configured {
                            entries["c\(n)"] = [
                                "team_id": credentials.teamID, "key_id": credentials.keyID,
                                "key_path": credentials.keyPath,
                            ]
                        }
                        let config = directory + "/config-\(configured).json"
                        try JSONSerialization.data(withJSONObject: ["credentials": entries]).write(
                            to: URL(fileURLWithPath: config)
                        )
                        try await client.query("DELETE FROM push.jobs", logger: logger)
                        try await client.query(
                            """
                            INSERT INTO push.jobs (topic, device_token, payload, credential)
                            SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"hi"}}', 'c0'
                              FROM generate_series(1, \(Int64(self.drain))) AS g
                            """,
                            logger: logger
                        )
                        let worker = try ChildProcess.start(
                            workerPath,
                            [
                                "run", "--worker-id", "fleet-\(configured)", "--config", config, "--apns-endpoint",
                                "https://localhost:\(simulator.port)", "--apns-ca-file", caFile, "--log-level", "error",
                                "--no-metrics",
                            ],
                            environment: ["DATABASE_URL": url.connectionString],
                            outputPath: directory + "/worker-\(configured).log"
                        )
                        defer {
                            worker.signal(SIGKILL)
                            _ = worker.wait()
                        }
                        let clock = ContinuousClock()
                        let start = clock.now
                        while try await scalar(
                            client,
                            "SELECT CASE WHEN EXISTS (SELECT 1 FROM push.jobs WHERE state IN ('pending', 'running')) THEN 1 ELSE 0 END::int8",
                            logger
                        ) == 1 {
                            try await Task.sleep(for: .milliseconds(250))
                            guard clock.now - start < .seconds(600) else {
                                throw ValidationError("drain did not finish: \(worker.output.suffix(1000))")
                            }
                        }
                        let seconds = try await client.query(
                            "SELECT extract(epoch FROM max(delivered_at) - min(delivered_at))::float8 FROM push.jobs",
                            logger: logger
                        ).decode(Double.self).reduce(into: 0.0) { $0 = $1 }
                        rates[configured] = Double(self.drain - 1) / seconds
                    }
                    print(
                        String(
                            format:
                                "drain of %d jobs of one credential: %.0f jobs/s with 1 configured, %.0f jobs/s with 10 configured: %.2fx",
                            self.drain,
                            rates[1] ?? 0,
                            rates[10] ?? 0,
                            (rates[10] ?? 0) / (rates[1] ?? 1)
                        )
                    )
                }
            }
        }
    }

    /// A producer INSERTs one row every 10 ms while `migrate` brings a table of `migrateRows` rows from
    /// `migrateFrom` to the current version: the median and the longest wait of an INSERT.
    func migrateWait(_ logger: Logger) async throws {
        try await withBenchDatabase(named: "push_bench_fleet_migrate", logger: logger) { url, _ in
            try await withClient(url, logger: logger) { client in
                try await Migrator(
                    client: client,
                    migrations: Migration.all.filter { $0.version <= self.migrateFrom },
                    logger: logger
                ).migrate()
                try await client.query(
                    """
                    INSERT INTO push.jobs (topic, device_token, payload)
                    SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"hi"}}'
                      FROM generate_series(1, \(Int64(self.migrateRows))) AS g
                    """,
                    logger: logger
                )
                try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
                let waits = Samples()
                let done = Counter()
                let clock = ContinuousClock()
                let migrateStart = clock.now
                var migrateTime: Duration = .zero
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask {
                        try await withClient(url, logger: logger) { producer in
                            var n = 0
                            while done.value.load(ordering: .relaxed) == 0 {
                                n += 1
                                let start = clock.now
                                try await producer.query(
                                    """
                                    INSERT INTO push.jobs (topic, device_token, payload)
                                    VALUES ('com.example.app', lpad(to_hex(\(Int64(n))), 64, 'f'), '{"aps":{}}')
                                    """,
                                    logger: logger
                                )
                                let waited = Self.milliseconds(clock.now - start)
                                waits.append(waited)
                                try await Task.sleep(for: .milliseconds(10))
                            }
                        }
                    }
                    try await Task.sleep(for: .milliseconds(200))
                    try await Migrator(client: client, logger: logger).migrate()
                    migrateTime = clock.now - migrateStart
                    try await Task.sleep(for: .milliseconds(200))
                    done.value.add(1, ordering: .relaxed)
                    try await group.waitForAll()
                }
                let samples = waits.values
                print(
                    String(
                        format:
                            "migrate from version %d over %d rows took %.1f s; %d producer INSERTs meanwhile: median %.2f ms, p99 %.2f ms, longest %.1f ms",
                        self.migrateFrom,
                        self.migrateRows,
                        Self.milliseconds(migrateTime) / 1000,
                        samples.count,
                        Self.percentile(samples, 0.5),
                        Self.percentile(samples, 0.99),
                        samples.max() ?? 0
                    )
                )
            }
        }
    }
}

/// Samples shared by tasks.
final class Samples: Sendable {
    private let samples = Mutex<[Double]>([])
    func append(_ sample: Double) { self.samples.withLock { $0.append(sample) } }
    var values: [Double] { self.samples.withLock { $0 } }
}
