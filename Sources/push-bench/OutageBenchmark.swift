import APNsSimulator
import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import PushProcess
import PushQueue

/// `push-bench outages`: the real `push-worker run` binary against the simulator (APNs and FCM, Google's
/// documented answer shapes) through a provider's bad day: APNs answering 503 to everything for a while, one
/// Android device over its own rate, one iOS token sent through FCM to a project without an APNs key, and
/// Google's documented invalid-token answer. Prints what each row measures; run it with two binaries to
/// compare before and after.
struct OutageBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "outages",
        abstract:
            "A provider's bad day with the real binary: an APNs outage, a hot Android device, an iOS token through FCM, FCM's invalid-token answer."
    )

    @Option(help: "The push-worker binary.") var worker: String
    @Option(help: "How long APNs answers 503 to everything, in seconds.") var outage = 20
    @Option(help: "Jobs enqueued before the APNs outage (priorities 10 and 5).") var jobs = 2_000
    @Option(help: "Android jobs sent beside a hot device or an iOS token.") var neighbours = 300

    func run() async throws {
        let logger = benchLogger()
        let (server, cluster) = try startServer(logger: logger)
        defer { cluster?.stop() }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("push-bench-outages-\(getpid())")
            .path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let credentials = try SimulatorCredentials.generate(in: directory)
        let fcmAccount = try SimulatorFCMAccount.make()
        var simulatorConfiguration = APNsSimulator.Configuration(keys: [credentials.keyID: credentials.trustedKey])
        simulatorConfiguration.fcmAccounts = fcmAccount.trusted
        let simulator = try APNsSimulator(configuration: simulatorConfiguration, logger: logger)
        let url = server.with(database: "push_outages_\(getpid())")
        try await withClient(server, logger: logger) { client in
            try await client.query("CREATE DATABASE \(unescaped: url.database)", logger: logger)
        }
        let (workerPath, outage, jobs, neighbours) = (self.worker, self.outage, self.jobs, self.neighbours)
        try await simulator.run { simulator in
            let caFile = try simulator.writeCACertificate(to: directory + "/ca.pem")
            let account = try fcmAccount.write(in: directory + "/fcm", host: "localhost", port: simulator.port)
            try await withClient(url, logger: logger) { client in
                try await Migrator(client: client, logger: logger).migrate()
                /// One worker per row: no pause or health carried from the row before.
                func startWorker(_ name: String) throws -> ChildProcess.Running {
                    try ChildProcess.start(
                        workerPath,
                        [
                            "run", "--worker-id", name, "--apns-endpoint", "https://localhost:\(simulator.port)",
                            "--apns-ca-file", caFile, "--fcm-endpoint", "https://localhost:\(simulator.port)",
                            "--fcm-ca-file", caFile, "--log-level", "warning",
                        ],
                        environment: [
                            "DATABASE_URL": url.connectionString, "APNS_KEY_PATH": credentials.keyPath,
                            "APNS_KEY_ID": credentials.keyID, "APNS_TEAM_ID": credentials.teamID,
                            "FCM_SERVICE_ACCOUNT_PATH": account,
                        ],
                        outputPath: directory + "/\(name).log"
                    )
                }
                func reset() async throws {
                    try await client.query(
                        "TRUNCATE push.jobs, push.dead_jobs, push.invalid_tokens, push.pauses, push.rate_limits",
                        logger: logger
                    )
                    simulator.clearRequests()
                }
                func count(_ sql: String) async throws -> Int { try await scalar(client, sql, logger) }
                let clock = ContinuousClock()

                // 1. APNs answers 503 ServiceUnavailable to everything for `outage` seconds.
                try await reset()
                simulator.setOutage(503)
                try await client.query(
                    """
                    INSERT INTO push.jobs (topic, device_token, payload, priority)
                    SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"hi"}}',
                           CASE WHEN g % 2 = 0 THEN 10 ELSE 5 END
                      FROM generate_series(1, \(Int64(jobs))) AS g
                    """,
                    logger: logger
                )
                var worker = try startWorker("outage")
                let outageStart = Date()
                try await Task.sleep(for: .seconds(outage))
                simulator.setOutage(nil)
                let whileDown = simulator.requests.filter {
                    $0.receivedAt <= outageStart.addingTimeInterval(Double(outage))
                }
                var perSecond: [Int: Int] = [:]
                for request in whileDown {
                    perSecond[Int(request.receivedAt.timeIntervalSince(outageStart)), default: 0] += 1
                }
                let deadDuring = try await count("SELECT count(*) FROM push.dead_jobs")
                let recovered = clock.now
                while try await count("SELECT count(*) FROM push.jobs WHERE state IN ('pending', 'running')") > 0,
                    clock.now - recovered < .seconds(120)
                {
                    try await Task.sleep(for: .milliseconds(250))
                }
                let drained = clock.now - recovered
                print(
                    "APNs 503 for \(outage) s, \(jobs) jobs (priorities 10 and 5): \(whileDown.count) requests while down (\(String(format: "%.0f", Double(whileDown.count) / Double(outage))) a second; the busiest second after the first \(perSecond.filter { $0.key >= 2 }.values.max() ?? 0)), \(deadDuring) dead during the outage; after it \(try await count("SELECT count(*) FROM push.jobs WHERE state = 'delivered'")) delivered, \(try await count("SELECT count(*) FROM push.dead_jobs")) dead, \(try await count("SELECT count(*) FROM push.jobs WHERE state IN ('pending', 'running')")) left, in \(drained); attempts at most \(try await count("SELECT coalesce(max(attempts), 0) FROM push.jobs"))"
                )
                worker.signal(SIGKILL)
                _ = worker.wait()

                // 1b. FCM answers half of its requests 503 (a brownout) for `outage` seconds; Android jobs,
                // priorities 10 and 5.
                try await reset()
                simulator.setOutage(503, share: 0.5)
                try await client.query(
                    """
                    INSERT INTO push.jobs (platform, topic, device_token, payload, priority)
                    SELECT 'fcm', 'com.example.app', 'brown' || g || ':APA91b', '{"data":{"a":"b"}}',
                           CASE WHEN g % 2 = 0 THEN 10 ELSE 5 END
                      FROM generate_series(1, \(Int64(jobs))) AS g
                    """,
                    logger: logger
                )
                worker = try startWorker("brownout")
                try await Task.sleep(for: .seconds(outage))
                simulator.setOutage(nil)
                let brownStart = clock.now
                while try await count("SELECT count(*) FROM push.jobs WHERE state IN ('pending', 'running')") > 0,
                    clock.now - brownStart < .seconds(120)
                {
                    try await Task.sleep(for: .milliseconds(250))
                }
                let dead10 = try await count("SELECT count(*) FROM push.dead_jobs WHERE priority = 10")
                let dead5 = try await count("SELECT count(*) FROM push.dead_jobs WHERE priority = 5")
                let reasons = try await client.query(
                    "SELECT reason || ' after ' || attempts || ' attempts over ' || coalesce(round(extract(epoch FROM (dead_at - first_attempt_at)))::text, '?') || ' s: ' || history::text FROM push.dead_jobs ORDER BY id LIMIT 3",
                    logger: logger
                ).decode(String.self)
                for try await reason in reasons { print("  dead: \(reason.prefix(600))") }
                print(
                    "FCM 503 to half of its requests for \(outage) s, \(jobs) Android jobs: \(dead10) of \(jobs / 2) priority-10 and \(dead5) of \(jobs / 2) priority-5 jobs dead; \(try await count("SELECT count(*) FROM push.jobs WHERE state = 'delivered'")) delivered; \(simulator.requests.count) requests"
                )
                worker.signal(SIGKILL)
                _ = worker.wait()

                /// The time `neighbours` Android jobs of the credential take beside one bad job, sent first.
                func beside(_ token: String, _ what: String) async throws {
                    try await reset()
                    worker = try startWorker("neighbours")
                    defer {
                        worker.signal(SIGKILL)
                        _ = worker.wait()
                    }
                    try await client.query(
                        "INSERT INTO push.jobs (platform, topic, device_token, payload) VALUES ('fcm', 'com.example.app', \(token), '{\"data\":{\"a\":\"b\"}}')",
                        logger: logger
                    )
                    let first = clock.now
                    while simulator.requests.filter({
                        $0.body.count > 0 && String(decoding: $0.body, as: UTF8.self).contains(token)
                    }).isEmpty,
                        clock.now - first < .seconds(30)
                    {
                        try await Task.sleep(for: .milliseconds(50))
                    }
                    try await Task.sleep(for: .milliseconds(200))
                    try await client.query(
                        """
                        INSERT INTO push.jobs (platform, topic, device_token, payload)
                        SELECT 'fcm', 'com.example.app', 'neighbour' || g || ':APA91b', '{"data":{"a":"b"}}'
                          FROM generate_series(1, \(Int64(neighbours))) AS g
                        """,
                        logger: logger
                    )
                    let start = clock.now
                    while try await count(
                        "SELECT count(*) FROM push.jobs WHERE device_token LIKE 'neighbour%' AND state = 'delivered'"
                    ) < neighbours, clock.now - start < .seconds(120) {
                        try await Task.sleep(for: .milliseconds(50))
                    }
                    let took = clock.now - start
                    var culprit = ""
                    for try await (state, reason, trap) in try await client.query(
                        "SELECT state, coalesce(reason, '-'), coalesce(array_to_string(trap_ids, ','), '-') FROM push.jobs WHERE device_token = \(token) UNION ALL SELECT 'dead', reason, array_to_string(trap_ids, ',') FROM push.dead_jobs WHERE device_token = \(token)",
                        logger: logger
                    ).decode((String, String, String).self) {
                        culprit = "\(state) (\(reason), \(trap))"
                    }
                    print(
                        "\(what): \(neighbours) Android neighbours of the same credential delivered in \(took); the culprit's job \(culprit)"
                    )
                }
                // 2. A device over its own rate: QUOTA_EXCEEDED every time, no Retry-After.
                simulator.script("hot:APA91b", .respond(status: 429, reason: "QUOTA_EXCEEDED"))
                try await beside("hot:APA91b", "one hot device (QUOTA_EXCEEDED every time)")
                // 3. An iOS token through FCM, the project without an APNs key.
                simulator.script("ios:APA91b", .respond(status: 401, reason: "THIRD_PARTY_AUTH_ERROR"))
                try await beside("ios:APA91b", "one iOS token through FCM (THIRD_PARTY_AUTH_ERROR)")

                // 4. Google's documented invalid-token answer.
                try await reset()
                simulator.script("invalid:APA91b", .respond(status: 400, reason: "INVALID_ARGUMENT"))
                worker = try startWorker("invalid")
                defer {
                    worker.signal(SIGKILL)
                    _ = worker.wait()
                }
                try await client.query(
                    "INSERT INTO push.jobs (platform, topic, device_token, payload) VALUES ('fcm', 'com.example.app', 'invalid:APA91b', '{\"data\":{\"a\":\"b\"}}')",
                    logger: logger
                )
                let sent = clock.now
                while try await count("SELECT count(*) FROM push.dead_jobs") == 0, clock.now - sent < .seconds(30) {
                    try await Task.sleep(for: .milliseconds(100))
                }
                print(
                    "FCM's documented invalid-token answer (INVALID_ARGUMENT, \"The registration token is not a valid FCM registration token\", only FcmError): \(try await count("SELECT count(*) FROM push.invalid_tokens WHERE platform = 'fcm'")) push.invalid_tokens row(s); dead letter trap \(try await client.query("SELECT coalesce(array_to_string(trap_ids, ','), '-') FROM push.dead_jobs", logger: logger).decode(String.self).reduce(into: "") { $0 = $1 })"
                )
            }
        }
    }
}
