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
                worker.signal(SIGCONT)
                try await Self.waitForDrain(client, worker: worker, what: "drain", logger: logger) {
                    peakRSS = max(peakRSS, rssKB(worker.pid))
                    peakAnon = max(peakAnon, rssKB(worker.pid, field: "RssAnon"))
                }
                let after = (
                    worker: cpuMicros(worker.pid), postgres: cpuMicros(named: "postgres"), sink: cpuMicros(sinkPID),
                    machine: machineCPU()
                )
                let switchesPerJob = Double(contextSwitches(worker.pid) - switchesBefore) / Double(jobs)
                let drainSeconds = try await Self.deliveredSpan(
                    client,
                    jobs: jobs,
                    what: "",
                    worker: worker,
                    logger: logger
                )
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
                func drainAgain(_ what: String, insert: String) async throws -> DrainFigures {
                    try await EndToEndBenchmark.drainAgain(what, insert: insert, jobs: jobs, client, worker, logger)
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

                EndToEndReport(
                    standIn: nghttpd == nil ? "the simulator (fast mode, in this process)" : "nghttpd",
                    jobs: jobs,
                    drain: DrainFigures(rate: drainRate, worker: perJob.worker, postgres: perJob.postgres),
                    drainSeconds: drainSeconds,
                    sinkPerJob: perJob.sink,
                    utilisation: utilisation,
                    switchesPerJob: switchesPerJob,
                    fcm: fcm,
                    hooks: [
                        ("no webhook", noHook), ("a hook matching nothing", hookMatchingNothing),
                        ("a hook on dead only", hookOnDead),
                    ],
                    peer: peer,
                    sqlCeiling: sqlCeiling,
                    transportCeiling: transportCeiling,
                    latencies: latencies,
                    rate: rate,
                    rss: (idleRSS, peakRSS, idleAnon, peakAnon)
                ).show()
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
