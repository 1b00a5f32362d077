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
    @Option(
        help:
            "The APNs stand-in: nghttpd (Debian's nghttp2-server: a C HTTP/2 server, cheap per request, so the worker's own cost shows) or simulator (this process, fast mode)."
    ) var sink: String = "nghttpd"
    @Option(
        help:
            "A Python with pgqueuer 1.6 and aioapns 4.0 installed (bench/e2e.sh makes one): drains the same jobs through bench/peer/pgqueuer_aioapns.py in two processes, in the same run, for the comparison."
    ) var peerPython: String?

    func run() async throws {
        let logger = benchLogger()
        let (server, cluster) = try startServer(logger: logger)
        defer { cluster?.stop() }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("push-bench-e2e-\(getpid())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let credentials = try SimulatorCredentials.generate(in: directory)
        let fcmAccount = try SimulatorFCMAccount.make()
        var simulatorConfiguration = APNsSimulator.Configuration(
            keys: [credentials.keyID: credentials.trustedKey],
            fastMode: true,
            recordRequests: false
        )
        simulatorConfiguration.fcmAccounts = fcmAccount.trusted
        let simulator = try APNsSimulator(configuration: simulatorConfiguration, logger: logger)
        let url = server.with(database: "push_e2e_\(getpid())")
        try await withClient(server, logger: logger) { client in
            try await client.query("CREATE DATABASE \(unescaped: url.database)", logger: logger)
        }
        let (jobs, rate, seconds, workerPath, sqlDirectory, peerPython) = (
            self.jobs, self.rate, self.seconds, self.worker, self.sqlDirectory, self.peerPython
        )
        guard ["nghttpd", "simulator"].contains(self.sink) else {
            throw ValidationError("--sink is nghttpd or simulator, not \(self.sink)")
        }
        let nghttpd =
            self.sink == "nghttpd"
            ? try NGHTTPDSink.start(directory: directory, tokens: max(jobs, rate * seconds)) : nil
        defer { nghttpd?.stop() }
        try await simulator.run { simulator in
            let caFile = try nghttpd?.caFile ?? simulator.writeCACertificate(to: directory + "/ca.pem")
            let port = nghttpd?.port ?? simulator.port
            // CPU of the stand-in: nghttpd's process, or this one (the simulator runs here).
            let sinkPID = nghttpd?.process.pid ?? getpid()
            try await withClient(url, logger: logger) { client in
                try await Migrator(client: client, logger: logger).migrate()
                // FCM through the same stand-in: a service account whose token_uri is the stand-in's /token.
                let account = try fcmAccount.write(in: directory + "/fcm", host: "localhost", port: port)
                let environment = [
                    "DATABASE_URL": url.connectionString, "APNS_KEY_PATH": credentials.keyPath,
                    "APNS_KEY_ID": credentials.keyID, "APNS_TEAM_ID": credentials.teamID,
                    "FCM_SERVICE_ACCOUNT_PATH": account,
                ]
                let worker = try ChildProcess.start(
                    workerPath,
                    [
                        "run", "--worker-id", "bench", "--apns-endpoint", "https://localhost:\(port)",
                        "--apns-ca-file", caFile, "--fcm-endpoint", "https://localhost:\(port)", "--fcm-ca-file",
                        caFile,
                        "--log-level", "error",
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
                // Drain: CPU read from /proc over the drain (the worker sat stopped while the jobs were loaded),
                // an EXISTS probe on the partial indexes meanwhile (no count(*) over the table), and the rate
                // from the rows' delivered_at afterwards.
                let clock = ContinuousClock()
                var peakRSS = 0
                var peakAnon = 0
                let before = (
                    worker: cpuMicros(worker.pid), postgres: cpuMicros(named: "postgres"), sink: cpuMicros(sinkPID),
                    machine: machineCPU()
                )
                let switchesBefore = contextSwitches(worker.pid)
                let start = clock.now
                worker.signal(SIGCONT)
                while try await scalar(
                    client,
                    "SELECT CASE WHEN EXISTS (SELECT 1 FROM push.jobs WHERE state = 'pending') OR EXISTS (SELECT 1 FROM push.jobs WHERE state = 'running') THEN 1 ELSE 0 END::int8",
                    logger
                ) == 1 {
                    peakRSS = max(peakRSS, rssKB(worker.pid))
                    peakAnon = max(peakAnon, rssKB(worker.pid, field: "RssAnon"))
                    // Rarely: each probe is Postgres CPU counted against the drain.
                    try await Task.sleep(for: .milliseconds(250))
                    guard clock.now - start < .seconds(600) else {
                        throw ValidationError("drain did not finish in 10 minutes: \(worker.output.suffix(1000))")
                    }
                }
                let after = (
                    worker: cpuMicros(worker.pid), postgres: cpuMicros(named: "postgres"), sink: cpuMicros(sinkPID),
                    machine: machineCPU()
                )
                let switchesPerJob = Double(contextSwitches(worker.pid) - switchesBefore) / Double(jobs)
                let delivered = try await scalar(
                    client,
                    "SELECT count(*) FROM push.jobs WHERE state = 'delivered'",
                    logger
                )
                guard delivered == jobs else {
                    throw ValidationError("\(jobs - delivered) jobs were not delivered: \(worker.output.suffix(1000))")
                }
                let drainSeconds = try await client.query(
                    "SELECT extract(epoch FROM max(delivered_at) - min(delivered_at))::float8 FROM push.jobs",
                    logger: logger
                ).decode(Double.self).reduce(into: 0.0) { $0 = $1 }
                let drainRate = Double(jobs - 1) / drainSeconds
                let perJob = (
                    worker: (after.worker - before.worker) / Double(jobs),
                    postgres: (after.postgres - before.postgres) / Double(jobs),
                    sink: (after.sink - before.sink) / Double(jobs)
                )
                let utilisation =
                    (after.machine.busy - before.machine.busy) / (after.machine.total - before.machine.total)

                // More drains with the same worker and stand-in: Android jobs, and APNs jobs with webhooks that
                // match nothing or dead letters only (none dies here: the hooks' cost to every outcome).
                func drainAgain(
                    _ what: String,
                    insert: String
                ) async throws -> (rate: Double, worker: Double, postgres: Double) {
                    worker.signal(SIGSTOP)
                    try await client.query(
                        "TRUNCATE push.jobs, push.dead_jobs, push.webhook_deliveries",
                        logger: logger
                    )
                    try await client.query(PostgresQuery(unsafeSQL: insert), logger: logger)
                    try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
                    let before = (worker: cpuMicros(worker.pid), postgres: cpuMicros(named: "postgres"))
                    worker.signal(SIGCONT)
                    let start = clock.now
                    while try await scalar(
                        client,
                        "SELECT CASE WHEN EXISTS (SELECT 1 FROM push.jobs WHERE state = 'pending') OR EXISTS (SELECT 1 FROM push.jobs WHERE state = 'running') THEN 1 ELSE 0 END::int8",
                        logger
                    ) == 1 {
                        try await Task.sleep(for: .milliseconds(250))
                        guard clock.now - start < .seconds(600) else {
                            throw ValidationError(
                                "the \(what) drain did not finish in 10 minutes: \(worker.output.suffix(1000))"
                            )
                        }
                    }
                    let after = (worker: cpuMicros(worker.pid), postgres: cpuMicros(named: "postgres"))
                    let delivered = try await scalar(
                        client,
                        "SELECT count(*) FROM push.jobs WHERE state = 'delivered'",
                        logger
                    )
                    guard delivered == jobs else {
                        throw ValidationError(
                            "\(jobs - delivered) \(what) jobs were not delivered: \(worker.output.suffix(1000))"
                        )
                    }
                    let seconds = try await client.query(
                        "SELECT extract(epoch FROM max(delivered_at) - min(delivered_at))::float8 FROM push.jobs",
                        logger: logger
                    ).decode(Double.self).reduce(into: 0.0) { $0 = $1 }
                    return (
                        Double(jobs - 1) / seconds, (after.worker - before.worker) / Double(jobs),
                        (after.postgres - before.postgres) / Double(jobs)
                    )
                }
                let fcm = try await drainAgain(
                    "FCM",
                    insert: """
                        INSERT INTO push.jobs (platform, topic, device_token, payload)
                        SELECT 'fcm', 'com.example.app', 'fKx' || g || ':APA91bH-bench-registration-token',
                               '{"notification":{"title":"Order shipped","body":"Arrives Tuesday"}}'
                          FROM generate_series(1, \(Int64(jobs))) AS g
                        """
                )
                let apnsJobs = """
                    INSERT INTO push.jobs (topic, device_token, payload)
                    SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":{"title":"Order shipped","body":"Arrives Tuesday"}}}'
                      FROM generate_series(1, \(Int64(jobs))) AS g
                    """
                let noHook = try await drainAgain("no-hook", insert: apnsJobs)
                try await client.query(
                    "INSERT INTO push.webhooks (url, events, topic, secret_file) VALUES ('https://hooks.invalid/x', '{delivered,dead}', 'com.example.none', '/nonexistent')",
                    logger: logger
                )
                let hookMatchingNothing = try await drainAgain("hook-matching-nothing", insert: apnsJobs)
                try await client.query(
                    "UPDATE push.webhooks SET events = '{dead}', topic = NULL",
                    logger: logger
                )
                let hookOnDead = try await drainAgain("hook-on-dead", insert: apnsJobs)
                try await client.query("TRUNCATE push.webhooks CASCADE", logger: logger)

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
                while try await scalar(client, "SELECT count(*) FROM push.jobs WHERE state = 'delivered'", logger)
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

                // The peer: the same jobs through PGQueuer + aioapns, on the same cluster and stand-in.
                var peer: PeerPipeline.Figures?
                if let python = peerPython {
                    peer = try await PeerPipeline(
                        python: python,
                        script: URL(fileURLWithPath: sqlDirectory).appendingPathComponent("peer/pgqueuer_aioapns.py")
                            .path,
                        url: server.with(database: "peer_\(getpid())"),
                        sinkPort: port,
                        sinkPID: sinkPID,
                        caFile: caFile,
                        credentials: credentials,
                        directory: directory
                    ).drain(jobs: jobs, server: server, logger: logger)
                }

                // Ceilings, measured in the same run on the same database and simulator.
                try await preloadJobs(client, count: 400_000, logger: logger)
                let sqlCeiling = try runPGBench(
                    url: url,
                    batch: 100,
                    seconds: 10,
                    clients: 8,
                    sqlDirectory: sqlDirectory
                )
                let request = [("apns-push-type", "alert"), ("apns-topic", "com.example.app"), ("apns-priority", "10")]
                    .map { (name: $0.0, value: $0.1) }
                try "{\"aps\":{\"alert\":\"hi\"}}".write(
                    toFile: directory + "/payload.json",
                    atomically: true,
                    encoding: .utf8
                )
                let transportCeiling = try await TransportBenchmark.h2load(
                    port: port,
                    token: String(format: "%064x", 1),
                    payloadFile: directory + "/payload.json",
                    requests: 100_000,
                    connections: 2,
                    streams: 250,
                    headers: request
                )

                print(
                    "database: fresh cluster, fsync on; worker: push-worker run defaults (concurrency 500, batch 250); APNs stand-in: \(nghttpd == nil ? "the simulator (fast mode, in this process)" : "nghttpd")"
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
                        format:
                            "CPU per job      worker %.1f µs   Postgres %.1f µs   stand-in %.1f µs   (machine %.0f %% busy over the drain); worker threads switched %.2f times a job",
                        perJob.worker,
                        perJob.postgres,
                        perJob.sink,
                        utilisation * 100,
                        switchesPerJob
                    )
                )
                print(
                    String(
                        format:
                            "FCM drain        %8.0f jobs/s  (%d platform fcm jobs, same worker and stand-in)  CPU per job: worker %.1f µs (%.2fx APNs'), Postgres %.1f µs",
                        fcm.rate,
                        jobs,
                        fcm.worker,
                        fcm.worker / perJob.worker,
                        fcm.postgres
                    )
                )
                for (label, figures) in [
                    ("no webhook", noHook), ("a hook matching nothing", hookMatchingNothing),
                    ("a hook on dead only", hookOnDead),
                ] {
                    let padded = label.padding(toLength: 24, withPad: " ", startingAt: 0)
                    print(
                        "APNs, \(padded)"
                            + String(
                                format: " %8.0f jobs/s  CPU per job: worker %.1f µs, Postgres %.1f µs",
                                figures.rate,
                                figures.worker,
                                figures.postgres
                            )
                    )
                }
                if let peer {
                    print(
                        String(
                            format:
                                "peer             %8.0f jobs/s  (PGQueuer 1.6 + aioapns 4.0, 2 processes, %.1f s)  push-worker is %.1fx its throughput",
                            peer.rate,
                            peer.seconds,
                            drainRate / peer.rate
                        )
                    )
                    print(
                        String(
                            format:
                                "peer CPU per job  Python %.1f µs   Postgres %.1f µs   stand-in %.1f µs   (peer / push-worker: Python %.1fx the worker, Postgres %.1fx)",
                            peer.python,
                            peer.postgres,
                            peer.sink,
                            peer.python / perJob.worker,
                            peer.postgres / perJob.postgres
                        )
                    )
                } else {
                    print("peer             not measured (bench/e2e.sh passes --peer-python; it needs PyPI once)")
                }
                print(
                    String(
                        format:
                            "SQL ceiling      %8.0f jobs/s  (pgbench claim+record, batch 100, 8 clients) ratio %.2f",
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
}

/// Resident set size of a process in KiB (`VmRSS`, or another /proc/PID/status field), 0 when unreadable.
func rssKB(_ pid: pid_t, field: String = "VmRSS") -> Int {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix(field + ":") })
    else { return 0 }
    return Int(line.split(separator: " ").dropFirst().first ?? "0") ?? 0
}
