import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import PushQueue

/// `push-bench queue`: claim+record throughput of the queue API alone, next to pgbench running the same SQL.
struct QueueBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "queue",
        abstract: "Claim+record throughput of JobQueue (one worker) vs pgbench running the same SQL on the same database."
    )

    @Option(help: "Batch sizes to measure.") var batches: [Int] = [1, 100, 500]
    @Option(help: "Jobs drained per measurement at batch size 1 (larger batches drain --jobs).") var singleJobs: Int = 3_000
    @Option(help: "Jobs drained per measurement at batch sizes above 1.") var jobs: Int = 50_000
    @Option(help: "Seconds pgbench runs per batch size.") var pgbenchSeconds: Int = 10
    @Option(help: "Directory of bench/pgbench-claim-record.sql.") var sqlDirectory: String = "bench"

    func run() async throws {
        let logger = benchLogger()
        let (server, cluster) = try startServer(logger: logger)
        defer { cluster?.stop() }
        let url = server.with(database: "push_bench_\(getpid())")
        try await withClient(server, logger: logger) { client in
            try await client.query("CREATE DATABASE \(unescaped: url.database)", logger: logger)
        }
        print("database: \(url)  (fsync \(cluster == nil ? "as configured on the server" : "on, synchronous_commit on"))")
        print("batch  api jobs/s  pgbench jobs/s  api/pgbench")
        try await withClient(url, logger: logger) { client in
            try await Migrator(client: client, logger: logger).migrate()
            let queue = JobQueue(client: client, logger: logger)
            for batch in self.batches {
                let count = batch == 1 ? self.singleJobs : self.jobs
                try await preload(client, count: count, logger: logger)
                let clock = ContinuousClock()
                let start = clock.now
                var drained = 0
                while true {
                    let claimed = try await queue.claim(limit: batch, workerID: "bench", lease: .seconds(60))
                    if claimed.isEmpty { break }
                    let result = try await queue.record(
                        claimed.map { JobOutcome(jobID: $0.id, attempt: $0.attempts, disposition: .delivered, status: 200, latencyMs: 1) },
                        workerID: "bench"
                    )
                    precondition(result.fenced.isEmpty)
                    drained += claimed.count
                }
                let elapsed = clock.now - start
                let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
                let apiRate = Double(drained) / seconds

                // pgbench: enough pending jobs that it never runs dry within its time.
                try await preload(client, count: min(max(Int(apiRate * Double(self.pgbenchSeconds) * 1.5), batch * 200), 2_000_000), logger: logger)
                let pgbenchRate = try runPGBench(url: url, batch: batch)
                print(String(format: "%5d  %11.0f  %14.0f  %10.2f", batch, apiRate, pgbenchRate, apiRate / pgbenchRate))
            }
        }
        try await withClient(server, logger: logger) { client in
            try await client.query("DROP DATABASE \(unescaped: url.database) WITH (FORCE)", logger: logger)
        }
    }

    func preload(_ client: PostgresClient, count: Int, logger: Logger) async throws {
        try await self.preloadJobs(client, count: count, logger: logger)
    }

    /// Empties the queue and inserts `count` alert jobs.
    func preloadJobs(_ client: PostgresClient, count: Int, logger: Logger) async throws {
        try await client.query("TRUNCATE push.jobs, push.dead_jobs", logger: logger)
        try await client.query(
            """
            INSERT INTO push.jobs (topic, device_token, payload)
            SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":{"title":"Order shipped","body":"Arrives Tuesday"}}}'
              FROM generate_series(1, \(Int64(count))) AS g
            """,
            logger: logger
        )
        try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
    }

    func runPGBench(url: DatabaseURL, batch: Int) throws -> Double {
        try self.runPGBench(url: url, batch: batch, seconds: self.pgbenchSeconds, sqlDirectory: self.sqlDirectory)
    }

    /// pgbench running bench/pgbench-claim-record.sql with one client; returns jobs/s.
    func runPGBench(url: DatabaseURL, batch: Int, seconds: Int, sqlDirectory: String) throws -> Double {
        let script = URL(fileURLWithPath: sqlDirectory).appendingPathComponent("pgbench-claim-record.sql").path
        let result = try ChildProcess.run(
            "/usr/bin/env",
            ["pgbench", "-n", "-M", "extended", "-c", "1", "-T", String(seconds), "-D", "batch=\(batch)",
             "-f", script, url.connectionString]
        )
        guard result.status == 0,
              let line = result.output.split(separator: "\n").first(where: { $0.hasPrefix("tps = ") }),
              let tps = Double(line.dropFirst(6).prefix { $0.isNumber || $0 == "." })
        else {
            throw ValidationError("pgbench failed (is Debian's postgresql-client installed?): \(result.output)")
        }
        return tps * Double(batch)
    }
}

/// The benchmarks' logger: errors only, so the figures stand out.
func benchLogger() -> Logger {
    var logger = Logger(label: "push-bench")
    logger.logLevel = .error
    return logger
}

/// A fresh fsync-on embedded cluster in a temporary directory, removed again by ``stop()``.
struct BenchCluster {
    let cluster: EmbeddedPostgres
    let directory: String

    func stop() {
        self.cluster.stop()
        try? FileManager.default.removeItem(atPath: self.directory)
    }
}

/// The server to measure on: DATABASE_URL, or a fresh fsync-on embedded cluster.
func startServer(logger: Logger) throws -> (DatabaseURL, BenchCluster?) {
    if let url = ProcessInfo.processInfo.environment["DATABASE_URL"], !url.isEmpty {
        return (try DatabaseURL(url), nil)
    }
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("push-bench-\(getpid())").path
    let cluster = EmbeddedPostgres(
        configuration: .init(dataDirectory: directory + "/data", fsync: true, settings: ["shared_buffers": "'256MB'"]),
        logger: logger
    )
    return (try cluster.start(), BenchCluster(cluster: cluster, directory: directory))
}

/// Runs `body` with a running client on `url`.
func withClient(_ url: DatabaseURL, logger: Logger, _ body: @Sendable (PostgresClient) async throws -> Void) async throws {
    let client = PostgresClient(configuration: url.clientConfiguration, backgroundLogger: logger)
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { await client.run() }
        defer { group.cancelAll() }
        try await body(client)
    }
}
