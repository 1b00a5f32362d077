import APNsSimulator
import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import PushProcess
import PushQueue

/// `push-bench tenants`: the real `push-worker run` binary draining the same number of jobs spread over many
/// topics, credentials, paused and limited tenants, with fresh statistics and with statistics taken when the
/// queue was drained (autovacuum's ANALYZE after a drain): drain rate, claim p50/p99 (the worker's own
/// `push_claim_duration_seconds`), worker and Postgres CPU per job, all from one run, each row against the
/// one-topic drain of the same run. Ends with the invariants: every job delivered, none pending or running.
struct TenantBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tenants",
        abstract:
            "Drain rate, claim p50/p99 and CPU per job over 1-10,000 topics, 1-100 credentials, paused and limited tenants, fresh and stale statistics."
    )

    @Option(help: "Jobs drained per case.") var jobs: Int = 20_000
    @Option(help: "The push-worker binary.") var worker: String
    @Option(help: "Paused jobs beside the drain in the paused case.") var paused: Int = 100_000
    @Option(help: "Only the cases whose name contains this.") var only: String?
    @Option(help: "The worker's --log-level (its log is printed when a case fails).") var workerLogLevel = "error"

    /// One row of the table.
    struct Case {
        var name: String
        var topics = 1
        var credentials = 1
        var paused = false
        var limitedTopics = 0
        var stale = false
    }

    static let cases: [Case] = [
        Case(name: "1 topic"),
        Case(name: "100 topics", topics: 100),
        Case(name: "1,000 topics", topics: 1_000),
        Case(name: "10,000 topics", topics: 10_000),
        Case(name: "10 credentials", credentials: 10),
        Case(name: "100 credentials", credentials: 100),
        Case(name: "1,000 topics + 100,000 paused", topics: 1_000, paused: true),
        Case(name: "1,000 topics, all limited", topics: 1_000, limitedTopics: 1_000),
        Case(name: "1 topic, stale", stale: true),
        Case(name: "10,000 topics, stale", topics: 10_000, stale: true),
        Case(name: "100 credentials, stale", credentials: 100, stale: true),
        Case(name: "1,000 topics + paused, stale", topics: 1_000, paused: true, stale: true),
        Case(name: "1,000 limited, stale", topics: 1_000, limitedTopics: 1_000, stale: true),
    ]

    func run() async throws {
        let logger = benchLogger()
        let (server, cluster) = try startServer(logger: logger)
        defer { cluster?.stop() }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("push-bench-tenants-\(getpid())")
            .path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let credentials = try SimulatorCredentials.generate(in: directory)
        let url = server.with(database: "push_tenants_\(getpid())")
        try await withClient(server, logger: logger) { client in
            try await client.query("CREATE DATABASE \(unescaped: url.database)", logger: logger)
        }
        let sink = try NGHTTPDSink.start(directory: directory, tokens: self.jobs)
        defer { sink.stop() }
        // A hundred credentials, all with the same key (the stand-in does not verify tokens).
        var configured: [String: [String: String]] = [:]
        for n in 0..<100 {
            configured["c\(n)"] = [
                "team_id": credentials.teamID, "key_id": credentials.keyID, "key_path": credentials.keyPath,
            ]
        }
        let config = directory + "/tenants.json"
        try JSONSerialization.data(withJSONObject: ["credentials": configured]).write(to: URL(fileURLWithPath: config))
        let metricsPort = Int.random(in: 20_000...40_000)
        let (jobs, pausedJobs) = (self.jobs, self.paused)
        let selected = Self.cases.filter { self.only.map($0.name.contains) ?? true }
        try await withClient(url, logger: logger) { client in
            try await Migrator(client: client, logger: logger).migrate()
            let worker = try ChildProcess.start(
                self.worker,
                [
                    "run", "--worker-id", "tenants", "--config", config, "--apns-endpoint",
                    "https://localhost:\(sink.port)", "--apns-ca-file", sink.caFile, "--log-level", self.workerLogLevel,
                    "--metrics-port", "\(metricsPort)",
                ],
                environment: ["DATABASE_URL": url.connectionString],
                outputPath: directory + "/worker.log"
            )
            defer {
                worker.signal(SIGKILL)
                _ = worker.wait()
            }
            try await Task.sleep(for: .seconds(3))
            print(
                "push-worker run (defaults: concurrency 500, batch 250) against nghttpd; \(jobs) jobs per case; statistics fresh (ANALYZE after the insert) or stale (ANALYZE of the drained table before it)"
            )
            print(
                "case                                   jobs/s   × 1 topic   claim p50   claim p99   worker µs/job   Postgres µs/job"
            )
            var base: Double?
            for item in selected {
                // Read while the worker runs (stopped, it cannot answer); it claims nothing until the case's jobs.
                let claimsBefore = try await Self.claimHistogram(port: metricsPort)
                worker.signal(SIGSTOP)
                try await client.query(
                    "TRUNCATE push.jobs, push.dead_jobs, push.pauses, push.rate_limits, push.coalesce_marks",
                    logger: logger
                )
                // The history a drain leaves: delivered rows (inserted pending, as producers must, then marked),
                // the table's statistics taken then if stale.
                try await client.query(
                    """
                    INSERT INTO push.jobs (topic, device_token, payload, credential)
                    SELECT 'com.example.history', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"hi"}}', 'history'
                      FROM generate_series(1, \(Int64(jobs))) AS g
                    """,
                    logger: logger
                )
                try await client.query(
                    "UPDATE push.jobs SET state = 'delivered', delivered_at = now() - interval '1 hour'",
                    logger: logger
                )
                if item.paused {
                    try await client.query(
                        """
                        INSERT INTO push.jobs (topic, device_token, payload, credential)
                        SELECT 'com.example.paused' || (g % 50), lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"hi"}}', 'c0'
                          FROM generate_series(1, \(Int64(pausedJobs))) AS g
                        """,
                        logger: logger
                    )
                    try await client.query(
                        "INSERT INTO push.pauses (topic, reason) SELECT 'com.example.paused' || g, 'bench' FROM generate_series(0, 49) AS g",
                        logger: logger
                    )
                }
                if item.limitedTopics > 0 {
                    // Limits that exist but do not bind: their cost, not their rate.
                    try await client.query(
                        """
                        INSERT INTO push.rate_limits (topic, per_second, burst)
                        SELECT 'com.example.t' || g, 100000, 10000 FROM generate_series(0, \(Int64(item.limitedTopics - 1))) AS g
                        """,
                        logger: logger
                    )
                }
                if item.stale { try await client.query("VACUUM ANALYZE push.jobs", logger: logger) }
                try await client.query(
                    """
                    INSERT INTO push.jobs (topic, device_token, payload, credential)
                    SELECT 'com.example.t' || (g % \(Int64(item.topics))), lpad(to_hex(g), 64, '0'),
                           '{"aps":{"alert":"hi"}}', 'c' || (g % \(Int64(item.credentials)))
                      FROM generate_series(1, \(Int64(jobs))) AS g
                    """,
                    logger: logger
                )
                if !item.stale { try await client.query("VACUUM ANALYZE push.jobs", logger: logger) }
                let before = (worker: cpuMicros(worker.pid), postgres: cpuMicros(named: "postgres"))
                let clock = ContinuousClock()
                let start = clock.now
                worker.signal(SIGCONT)
                while try await scalar(
                    client,
                    "SELECT CASE WHEN EXISTS (SELECT 1 FROM push.jobs WHERE state = 'pending' AND topic LIKE 'com.example.t%') OR EXISTS (SELECT 1 FROM push.jobs WHERE state = 'running') THEN 1 ELSE 0 END::int8",
                    logger
                ) == 1 {
                    try await Task.sleep(for: .milliseconds(250))
                    guard clock.now - start < .seconds(120) else { break }
                }
                if clock.now - start >= .seconds(120) {
                    // A stalled fleet (the old claim after a drain's ANALYZE): say so, and go on with the next case.
                    var states = ""
                    for try await (state, count) in try await client.query(
                        "SELECT state, count(*) FROM push.jobs WHERE topic LIKE 'com.example.t%' GROUP BY 1 ORDER BY 1",
                        logger: logger
                    ).decode((String, Int64).self) {
                        states += "\(count) \(state), "
                    }
                    print(
                        item.name.padding(toLength: 36, withPad: " ", startingAt: 0) + " STALLED: after 120 s \(states)"
                    )
                    continue
                }
                let after = (worker: cpuMicros(worker.pid), postgres: cpuMicros(named: "postgres"))
                let claimsAfter = try await Self.claimHistogram(port: metricsPort)
                // The invariants: every job of the case delivered, none pending or running, none dead.
                let delivered = try await scalar(
                    client,
                    "SELECT count(*) FROM push.jobs WHERE state = 'delivered' AND topic LIKE 'com.example.t%'",
                    logger
                )
                let stuck = try await scalar(
                    client,
                    "SELECT count(*) FROM push.jobs WHERE state = 'running' OR (state = 'pending' AND topic NOT LIKE 'com.example.paused%')",
                    logger
                )
                let dead = try await scalar(client, "SELECT count(*) FROM push.dead_jobs", logger)
                guard delivered == jobs, stuck == 0, dead == 0 else {
                    throw ValidationError(
                        "\(item.name): \(delivered) of \(jobs) delivered, \(stuck) pending or running, \(dead) dead: \(worker.output.suffix(1000))"
                    )
                }
                let seconds = try await client.query(
                    "SELECT extract(epoch FROM max(delivered_at) - min(delivered_at))::float8 FROM push.jobs WHERE topic LIKE 'com.example.t%' AND state = 'delivered'",
                    logger: logger
                ).decode(Double.self).reduce(into: 0.0) { $0 = $1 }
                let rate = Double(jobs - 1) / seconds
                if base == nil { base = rate }
                let claims = zip(claimsAfter, claimsBefore).map { (le: $0.le, count: $0.count - $1.count) }
                func column(_ text: String) -> String {
                    String(repeating: " ", count: max(0, 11 - text.count)) + text
                }
                print(
                    item.name.padding(toLength: 36, withPad: " ", startingAt: 0)
                        + String(format: " %8.0f   %7.2f ", rate, rate / (base ?? rate))
                        + column(Self.percentile(claims, 0.5)) + " " + column(Self.percentile(claims, 0.99))
                        + String(
                            format: "   %13.1f   %15.1f",
                            (after.worker - before.worker) / Double(jobs),
                            (after.postgres - before.postgres) / Double(jobs)
                        )
                )
            }
            worker.signal(SIGTERM)
            _ = worker.wait()
        }
    }

    /// The worker's `push_claim_duration_seconds` histogram: cumulative counts per bucket bound, in seconds.
    static func claimHistogram(port: Int) async throws -> [(le: Double, count: Double)] {
        let result = try ChildProcess.run(
            "/usr/bin/curl",
            ["-s", "--max-time", "5", "http://127.0.0.1:\(port)/metrics"],
            limit: .seconds(10)
        )
        return result.output.split(separator: "\n").compactMap { line -> (Double, Double)? in
            guard line.hasPrefix("push_claim_duration_seconds_bucket{"),
                let start = line.range(of: "le=\""),
                let end = line[start.upperBound...].firstIndex(of: "\""),
                let count = Double(line.split(separator: " ").last ?? "")
            else { return nil }
            let le = String(line[start.upperBound..<end])
            return (le == "+Inf" ? .infinity : Double(le) ?? .infinity, count)
        }.sorted { $0.0 < $1.0 }.map { (le: $0.0, count: $0.1) }
    }

    /// The bucket bound under which a fraction `p` of the claims fell ("≤ 5 ms").
    static func percentile(_ buckets: [(le: Double, count: Double)], _ p: Double) -> String {
        guard let total = buckets.last?.count, total > 0 else { return "-" }
        let bound = buckets.first { $0.count >= total * p }?.le ?? .infinity
        return bound.isInfinite ? "> 30 s" : "≤ \(Int((bound * 1000).rounded())) ms"
    }
}
