import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import PushEmbeddedPostgres
import PushProcess
import PushQueue

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

/// pgbench running bench/pgbench-claim-record.sql (prepared statements) with `clients` clients; returns jobs/s.
func runPGBench(url: DatabaseURL, batch: Int, seconds: Int, clients: Int = 1, sqlDirectory: String) throws -> Double {
    let script = URL(fileURLWithPath: sqlDirectory).appendingPathComponent("pgbench-claim-record.sql").path
    let result = try ChildProcess.run(
        "/usr/bin/env",
        [
            "pgbench", "-n", "-M", "prepared", "-c", String(clients), "-j", String(min(clients, 2)), "-T",
            String(seconds), "-D", "batch=\(batch)",
            "-f", script, url.connectionString,
        ],
        limit: .seconds(seconds + 120)
    )
    guard result.status == 0,
        let line = result.output.split(separator: "\n").first(where: { $0.hasPrefix("tps = ") }),
        let tps = Double(line.dropFirst(6).prefix { $0.isNumber || $0 == "." })
    else {
        throw ValidationError("pgbench failed (is Debian's postgresql-client installed?): \(result.output)")
    }
    return tps * Double(batch)
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
func withClient(
    _ url: DatabaseURL,
    logger: Logger,
    workerSession: Bool = false,
    _ body: @Sendable (PostgresClient) async throws -> Void
) async throws {
    var configuration = url.clientConfiguration
    if workerSession { configuration.options.additionalStartupParameters = JobQueue.workerSessionSettings }
    let client = PostgresClient(configuration: configuration, backgroundLogger: logger)
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { await client.run() }
        defer { group.cancelAll() }
        try await body(client)
    }
}

/// Runs `body` on a fresh database named `name` on the benchmark server (DATABASE_URL, or a fresh fsync-on
/// embedded cluster), dropped afterwards. `body` gets the URL and whether the cluster is the fresh one.
func withBenchDatabase(
    named name: String,
    logger: Logger,
    _ body: (DatabaseURL, Bool) async throws -> Void
) async throws {
    let (server, cluster) = try startServer(logger: logger)
    defer { cluster?.stop() }
    let url = server.with(database: "\(name)_\(getpid())")
    try await withClient(server, logger: logger) { client in
        try await client.query("CREATE DATABASE \(unescaped: url.database)", logger: logger)
    }
    try await body(url, cluster != nil)
    try await withClient(server, logger: logger) { client in
        try await client.query("DROP DATABASE IF EXISTS \(unescaped: url.database) WITH (FORCE)", logger: logger)
    }
}

/// CPU time (user + system) a process has used, in microseconds, from `/proc/PID/stat`; 0 once it is gone.
func cpuMicros(_ pid: pid_t) -> Double {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let close = stat.lastIndex(of: ")")
    else { return 0 }
    // After "pid (comm)": field 3 (state) is first, so utime (field 14) and stime (15) are at 11 and 12.
    let fields = stat[stat.index(after: close)...].split(separator: " ")
    guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
    return (user + system) * 1_000_000 / Double(sysconf(Int32(_SC_CLK_TCK)))
}

/// Context switches (voluntary and not) summed over a process's threads, from `/proc/PID/task/*/status`: each is
/// a thread that slept and was woken (a hand-off between threads), a figure the machine's speed does not move.
/// Approximate: a thread that ends between two readings takes its count with it (the worker's threads are
/// NIO's event loops and the concurrency pool's, which last).
func contextSwitches(_ pid: pid_t) -> Int {
    let threads = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
    return threads.reduce(0) { sum, thread in
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/task/\(thread)/status", encoding: .utf8)
        else { return sum }
        return sum
            + status.split(separator: "\n").reduce(0) { count, line in
                guard line.contains("ctxt_switches:") else { return count }
                return count + (Int(line.split(separator: ":").last?.trimmingCharacters(in: .whitespaces) ?? "") ?? 0)
            }
    }
}

/// CPU microseconds summed over every process whose command name is `name` (Postgres: the postmaster and
/// all its backends, which keep their connections for the whole measurement).
func cpuMicros(named name: String) -> Double {
    let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
    return entries.compactMap { pid_t($0) }.reduce(0) { sum, pid in
        let comm = (try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8)) ?? ""
        return comm.trimmingCharacters(in: .whitespacesAndNewlines) == name ? sum + cpuMicros(pid) : sum
    }
}

/// The machine's busy and total CPU time from `/proc/stat`, for utilisation over an interval.
func machineCPU() -> (busy: Double, total: Double) {
    guard let stat = try? String(contentsOfFile: "/proc/stat", encoding: .utf8),
        let line = stat.split(separator: "\n").first(where: { $0.hasPrefix("cpu ") })
    else { return (0, 0) }
    let values = line.split(separator: " ").dropFirst().compactMap { Double($0) }
    guard values.count >= 5 else { return (0, 0) }
    let total = values.prefix(8).reduce(0, +)
    return (total - values[3] - values[4], total)
}

/// The first row's single bigint of `sql` (a count, an EXISTS as 0 or 1); 0 when there is no row.
func scalar(_ client: PostgresClient, _ sql: String, _ logger: Logger) async throws -> Int {
    for try await n in try await client.query(PostgresQuery(unsafeSQL: sql), logger: logger).decode(Int64.self) {
        return Int(n)
    }
    return 0
}

/// Milliseconds of each of `rounds` claims of `batch` due priority-5 jobs of com.example.app, inserted just before
/// each claim and deleted after it; `excluding`: credentials the claim leaves out.
func claimSamples(
    _ client: PostgresClient,
    _ queue: JobQueue,
    rounds: Int,
    batch: Int,
    excluding: [String] = [],
    logger: Logger
) async throws -> [Double] {
    var samples: [Double] = []
    for _ in 0..<rounds {
        try await client.query(
            """
            INSERT INTO push.jobs (topic, device_token, payload, priority)
            SELECT 'com.example.app', lpad(to_hex(g), 64, 'c'), '{"aps":{}}', 5
              FROM generate_series(1, \(Int64(batch))) AS g
            """,
            logger: logger
        )
        let clock = ContinuousClock()
        let start = clock.now
        let claimed = try await queue.claim(
            limit: batch,
            workerID: "bench",
            lease: .seconds(60),
            excludingCredentials: excluding
        )
        let elapsed = clock.now - start
        precondition(claimed.count == batch, "claimed \(claimed.count)")
        samples.append(Double(elapsed.components.attoseconds) / 1e15 + Double(elapsed.components.seconds) * 1000)
        try await client.query("DELETE FROM push.jobs WHERE state = 'running'", logger: logger)
    }
    return samples
}
