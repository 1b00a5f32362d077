import APNsSimulator
import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import PushProcess
import PushQueue

/// `push-bench recipients`: the real `push-worker run` binary drains the same deliveries two ways, one run,
/// alternated: jobs inserted with their tokens, and jobs naming a recipient that fan out to the device
/// registry when claimed (`--recipients` × `--devices` live tokens). Prints each drain's rate and CPU a
/// delivery, and the ratio; checks that the children are the live devices exactly.
struct RecipientBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "recipients",
        abstract: "Fan-out by recipient against the same deliveries inserted with their tokens, with the real binary."
    )

    @Option(help: "The push-worker binary.") var worker: String
    @Option(help: "Recipients, each with --devices live tokens.") var recipients = 10_000
    @Option(help: "Live device tokens a recipient has.") var devices = 3
    @Option(help: "Drains of each kind, alternated.") var rounds = 2

    func run() async throws {
        let logger = benchLogger()
        let (server, cluster) = try startServer(logger: logger)
        defer { cluster?.stop() }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "push-bench-recipients-\(getpid())"
        )
        .path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let credentials = try SimulatorCredentials.generate(in: directory)
        let simulator = try APNsSimulator(
            configuration: APNsSimulator.Configuration(
                keys: [credentials.keyID: credentials.trustedKey],
                fastMode: true,
                recordRequests: false
            ),
            logger: logger
        )
        let url = server.with(database: "push_recipients_\(getpid())")
        try await withClient(server, logger: logger) { client in
            try await client.query("CREATE DATABASE \(unescaped: url.database)", logger: logger)
        }
        let (workerPath, recipients, devices, rounds) = (self.worker, self.recipients, self.devices, self.rounds)
        let deliveries = recipients * devices
        try await simulator.run { simulator in
            let caFile = try simulator.writeCACertificate(to: directory + "/ca.pem")
            try await withClient(url, logger: logger) { client in
                try await Migrator(client: client, logger: logger).migrate()
                try await client.query(
                    """
                    INSERT INTO push.devices (recipient, topic, token)
                    SELECT 'user:' || r, 'com.example.app', lpad(to_hex(r * 16 + d), 64, '0')
                      FROM generate_series(1, \(Int64(recipients))) AS r, generate_series(1, \(Int64(devices))) AS d
                    """,
                    logger: logger
                )
                let worker = try ChildProcess.start(
                    workerPath,
                    [
                        "run", "--worker-id", "bench", "--apns-endpoint", "https://localhost:\(simulator.port)",
                        "--apns-ca-file", caFile, "--log-level", "error",
                    ],
                    environment: [
                        "DATABASE_URL": url.connectionString, "APNS_KEY_PATH": credentials.keyPath,
                        "APNS_KEY_ID": credentials.keyID, "APNS_TEAM_ID": credentials.teamID,
                    ],
                    outputPath: directory + "/worker.log"
                )
                defer {
                    worker.signal(SIGKILL)
                    _ = worker.wait()
                }
                try await Task.sleep(for: .seconds(3))
                /// One drain: the worker stopped while `insert` runs, then let go; the span from the moment it
                /// is let go (the database's clock) to the last delivery.
                func drain(_ insert: String) async throws -> Figures {
                    worker.signal(SIGSTOP)
                    try await client.query("TRUNCATE push.jobs, push.dead_jobs", logger: logger)
                    let inserting = ContinuousClock.now
                    try await client.query(PostgresQuery(unsafeSQL: insert), logger: logger)
                    let inserted = ContinuousClock.now - inserting
                    try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
                    let start = try await client.query("SELECT clock_timestamp()", logger: logger)
                        .decode(Date.self).reduce(into: Date()) { $0 = $1 }
                    let before = (worker: cpuMicros(worker.pid), postgres: cpuMicros(named: "postgres"))
                    worker.signal(SIGCONT)
                    try await EndToEndBenchmark.waitForDrain(client, worker: worker, what: "drain", logger: logger)
                    let after = (worker: cpuMicros(worker.pid), postgres: cpuMicros(named: "postgres"))
                    let delivered = try await scalar(
                        client,
                        "SELECT count(*) FROM push.jobs WHERE state = 'delivered'",
                        logger
                    )
                    guard delivered == deliveries else {
                        throw ValidationError(
                            "\(deliveries - delivered) deliveries missing: \(worker.output.suffix(800))"
                        )
                    }
                    let end = try await client.query(
                        "SELECT max(delivered_at) FROM push.jobs",
                        logger: logger
                    ).decode(Date.self).reduce(into: Date()) { $0 = $1 }
                    let seconds = end.timeIntervalSince(start)
                    let insertSeconds =
                        Double(inserted.components.seconds) + Double(inserted.components.attoseconds) / 1e18
                    return Figures(
                        rate: Double(deliveries) / seconds,
                        withInsert: Double(deliveries) / (seconds + insertSeconds),
                        worker: (after.worker - before.worker) / Double(deliveries),
                        postgres: (after.postgres - before.postgres) / Double(deliveries)
                    )
                }
                let direct = """
                    INSERT INTO push.jobs (topic, device_token, payload)
                    SELECT 'com.example.app', lpad(to_hex(r * 16 + d), 64, '0'), '{"aps":{"alert":"hi"}}'
                      FROM generate_series(1, \(recipients)) AS r, generate_series(1, \(devices)) AS d
                    """
                let fanned = """
                    INSERT INTO push.jobs (topic, recipient, payload)
                    SELECT 'com.example.app', 'user:' || r, '{"aps":{"alert":"hi"}}' FROM generate_series(1, \(recipients)) AS r
                    """
                var directFigures: [Figures] = []
                var fannedFigures: [Figures] = []
                for _ in 0..<rounds {
                    directFigures.append(try await drain(direct))
                    fannedFigures.append(try await drain(fanned))
                    // The children are the live devices exactly.
                    let off = try await scalar(
                        client,
                        """
                        SELECT (SELECT count(*) FROM (
                                    SELECT p.recipient, c.device_token FROM push.jobs AS c
                                      JOIN push.jobs AS p ON p.id = c.parent_id
                                    EXCEPT ALL SELECT recipient, token FROM push.devices) AS x)
                             + (SELECT count(*) FROM (
                                    SELECT recipient, token FROM push.devices
                                    EXCEPT ALL SELECT p.recipient, c.device_token FROM push.jobs AS c
                                      JOIN push.jobs AS p ON p.id = c.parent_id) AS y)
                        """,
                        logger
                    )
                    guard off == 0 else { throw ValidationError("\(off) children differ from the live devices") }
                }
                func line(_ what: String, _ figures: [Figures]) -> String {
                    let rates = figures.map { String(format: "%.0f (%.0f with the INSERT)", $0.rate, $0.withInsert) }
                        .joined(separator: ", ")
                    let cpu = figures.map { String(format: "%.1f / %.1f", $0.worker, $0.postgres) }
                        .joined(separator: ", ")
                    return "\(what): \(rates) deliveries/s; worker / Postgres CPU µs a delivery \(cpu)"
                }
                let best = (
                    direct: directFigures.map(\.rate).max() ?? 0, fanned: fannedFigures.map(\.rate).max() ?? 0
                )
                let bestWithInsert = (
                    direct: directFigures.map(\.withInsert).max() ?? 0,
                    fanned: fannedFigures.map(\.withInsert).max() ?? 0
                )
                print(
                    "push-bench recipients: \(recipients) recipients x \(devices) live devices = \(deliveries) deliveries"
                )
                print(line("tokens inserted directly", directFigures))
                print(line("recipients fanned out   ", fannedFigures))
                print(
                    String(
                        format: "fan-out / direct drain rate: %.2fx (best of %d each); children = live devices exactly",
                        best.fanned / max(best.direct, 1),
                        rounds
                    )
                )
                print(
                    "from the producer's INSERT to the last delivery (\(deliveries) rows inserted, or \(recipients) recipients' jobs): "
                        + String(format: "%.2fx", bestWithInsert.fanned / max(bestWithInsert.direct, 1))
                )
            }
        }
    }
}

/// One drain's figures: deliveries a second from the worker's start to the last delivery, and counting the
/// producer's INSERT too; CPU a delivery.
struct Figures {
    var rate: Double
    var withInsert: Double
    var worker: Double
    var postgres: Double
}
