import APNsSimulator
import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import PushEmbeddedPostgres
import PushProcess
import PushQueue

/// `push-bench e2e`: the real `push-worker run` binary against a fresh fsync-on Postgres and the
/// simulator's fast mode: drain throughput, enqueue-to-request latency at a steady insert rate, worker
/// RSS, and in the same run the SQL ceiling (pgbench) and the transport ceiling (h2load).
struct EndToEndBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "e2e",
        abstract:
            "End-to-end: push-worker run drain throughput, latency at 1,000 inserts/s, RSS, vs the SQL and transport ceilings."
    )

    @Option(help: "Jobs pre-loaded for the drain measurement.") var jobs: Int = 50_000
    @Option(help: "Single-row INSERTs per second for the latency measurement.") var rate: Int = 1_000
    @Option(help: "Seconds of steady inserts for the latency measurement.") var seconds: Int = 10
    @Option(help: "The push-worker binary.") var worker: String
    @Option(help: "Directory of bench/pgbench-claim-record.sql.") var sqlDirectory: String = "bench"

    func run() async throws {
        let logger = benchLogger()
        let (server, cluster) = try startServer(logger: logger)
        defer { cluster?.stop() }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("push-bench-e2e-\(getpid())").path
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
        let url = server.with(database: "push_e2e_\(getpid())")
        try await withClient(server, logger: logger) { client in
            try await client.query("CREATE DATABASE \(unescaped: url.database)", logger: logger)
        }
        let (jobs, rate, seconds, workerPath, sqlDirectory) = (
            self.jobs, self.rate, self.seconds, self.worker, self.sqlDirectory
        )
        try await simulator.run { simulator in
            let caFile = try simulator.writeCACertificate(to: directory + "/ca.pem")
            try await withClient(url, logger: logger) { client in
                try await Migrator(client: client, logger: logger).migrate()
                let environment = [
                    "DATABASE_URL": url.connectionString, "APNS_KEY_PATH": credentials.keyPath,
                    "APNS_KEY_ID": credentials.keyID, "APNS_TEAM_ID": credentials.teamID,
                ]
                let worker = try ChildProcess.start(
                    workerPath,
                    [
                        "run", "--worker-id", "bench", "--apns-endpoint", "https://localhost:\(simulator.port)",
                        "--apns-ca-file", caFile, "--log-level", "error",
                    ],
                    environment: environment,
                    outputPath: directory + "/worker.log"
                )
                defer {
                    worker.signal(SIGKILL)
                    _ = worker.wait()
                }
                // Idle RSS: started, connected to Postgres, nothing to do. Then freeze the worker while the
                // jobs are loaded, so the drain starts from a full queue.
                try await Task.sleep(for: .seconds(3))
                let idleRSS = rssKB(worker.pid)
                let idleAnon = rssKB(worker.pid, field: "RssAnon")
                worker.signal(SIGSTOP)
                try await preloadJobs(client, count: jobs, logger: logger)
                worker.signal(SIGCONT)

                // Drain: from the first delivery (the worker is up and connected) until the last.
                let clock = ContinuousClock()
                var peakRSS = 0
                var peakAnon = 0
                let launched = clock.now
                var delivered = 0
                while delivered == 0 {
                    delivered = try await count(
                        client,
                        "SELECT count(*) FROM push.jobs WHERE state = 'delivered'",
                        logger
                    )
                    guard clock.now - launched < .seconds(120) else {
                        throw ValidationError("the worker delivered nothing: \(worker.output.suffix(1000))")
                    }
                    if delivered == 0 { try await Task.sleep(for: .milliseconds(5)) }
                }
                let start = clock.now
                let alreadyDelivered = delivered
                while try await count(client, "SELECT count(*) FROM push.jobs WHERE state = 'delivered'", logger) < jobs
                {
                    peakRSS = max(peakRSS, rssKB(worker.pid))
                    peakAnon = max(peakAnon, rssKB(worker.pid, field: "RssAnon"))
                    try await Task.sleep(for: .milliseconds(50))
                    guard clock.now - start < .seconds(600) else {
                        throw ValidationError("drain did not finish in 10 minutes: \(worker.output.suffix(1000))")
                    }
                }
                let drainSeconds = (clock.now - start).seconds
                let drainRate = Double(jobs - alreadyDelivered) / drainSeconds

                // Latency: single-row INSERTs at a steady rate; enqueue (created_at) to delivery recorded by the worker.
                try await client.query("TRUNCATE push.jobs", logger: logger)
                let total = rate * seconds
                let interval = Duration.nanoseconds(1_000_000_000 / Int64(rate))
                var next = clock.now
                for n in 0..<total {
                    try await client.query(
                        "INSERT INTO push.jobs (topic, device_token, payload) VALUES ('com.example.app', \(String(format: "%064x", n)), '{\"aps\":{\"alert\":\"hi\"}}')",
                        logger: logger
                    )
                    next = next + interval
                    if next > clock.now { try await Task.sleep(until: next) }
                }
                let sendStart = clock.now
                while try await count(client, "SELECT count(*) FROM push.jobs WHERE state = 'delivered'", logger)
                    < total, clock.now - sendStart < .seconds(60)
                {
                    try await Task.sleep(for: .milliseconds(50))
                }
                // last_attempt_at is when the request went out (the attempt's start): enqueue-to-request.
                let latencies = try await client.query(
                    "SELECT (extract(epoch FROM last_attempt_at - created_at) * 1000)::float8 FROM push.jobs WHERE state = 'delivered' ORDER BY 1",
                    logger: logger
                ).decode(Double.self).reduce(into: [Double]()) { $0.append($1) }
                func percentile(_ p: Double) -> Double {
                    latencies.isEmpty ? .nan : latencies[min(Int(Double(latencies.count) * p), latencies.count - 1)]
                }
                worker.signal(SIGTERM)
                _ = worker.wait()

                // Ceilings, measured in the same run on the same database and simulator.
                try await preloadJobs(client, count: 400_000, logger: logger)
                let sqlCeiling = try runPGBench(url: url, batch: 250, seconds: 10, sqlDirectory: sqlDirectory)
                let request = [("apns-push-type", "alert"), ("apns-topic", "com.example.app"), ("apns-priority", "10")]
                    .map { (name: $0.0, value: $0.1) }
                try "{\"aps\":{\"alert\":\"hi\"}}".write(
                    toFile: directory + "/payload.json",
                    atomically: true,
                    encoding: .utf8
                )
                let transportCeiling = try await TransportBenchmark.h2load(
                    port: simulator.port,
                    token: String(repeating: "ab", count: 32),
                    payloadFile: directory + "/payload.json",
                    requests: 100_000,
                    connections: 2,
                    streams: 250,
                    headers: request
                )

                print(
                    "database: fresh cluster, fsync on; worker: push-worker run defaults (concurrency 500, batch 250, 2 connections)"
                )
                print(
                    String(
                        format: "drain            %8.0f jobs/s  (%d jobs, outcomes written, %.1f s)",
                        drainRate,
                        jobs,
                        drainSeconds
                    )
                )
                print(
                    String(
                        format: "SQL ceiling      %8.0f jobs/s  (pgbench claim+record, batch 250)   ratio %.2f",
                        sqlCeiling,
                        drainRate / sqlCeiling
                    )
                )
                print(
                    String(
                        format: "transport ceiling %7.0f req/s   (h2load, 2 connections, 250 streams) ratio %.2f",
                        transportCeiling,
                        drainRate / transportCeiling
                    )
                )
                print(
                    String(
                        format: "enqueue->request p50 %.1f ms  p99 %.1f ms  (%d single-row INSERTs at %d/s)",
                        percentile(0.5),
                        percentile(0.99),
                        latencies.count,
                        rate
                    )
                )
                print(
                    String(
                        format: "worker RSS       idle %.1f MB (before any job), peak under load %.1f MB",
                        Double(idleRSS) / 1024,
                        Double(peakRSS) / 1024
                    )
                )
                print(
                    String(
                        format:
                            "  of which anonymous (the worker's own memory, not mapped code) idle %.1f MB, under load %.1f MB",
                        Double(idleAnon) / 1024,
                        Double(peakAnon) / 1024
                    )
                )
            }
        }
    }

    func count(_ client: PostgresClient, _ sql: String, _ logger: Logger) async throws -> Int {
        for try await n in try await client.query(PostgresQuery(unsafeSQL: sql), logger: logger).decode(Int64.self) {
            return Int(n)
        }
        return 0
    }
}

/// Resident set size of a process in KiB (`VmRSS`, or another /proc/PID/status field), 0 when unreadable.
func rssKB(_ pid: pid_t, field: String = "VmRSS") -> Int {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix(field + ":") })
    else { return 0 }
    return Int(line.split(separator: " ").dropFirst().first ?? "0") ?? 0
}
