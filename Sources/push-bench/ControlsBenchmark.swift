import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import PushQueue

/// `push-bench controls`: what the fleet-wide controls cost the claim. The same 250-job claim is timed with
/// the controls unused, then with 10 paused credentials holding a backlog, 5 rate limits whose schedules are
/// full with due jobs waiting, and every claimed job carrying a coalesce key; and the one claim that meets
/// a 50 keys × 1,000 jobs coalesced backlog and supersedes all but 50.
struct ControlsBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "controls",
        abstract:
            "Claim time with pauses, rate limits and coalesce keys in use, next to the plain claim on the same table."
    )

    @Option(help: "Jobs claimed per claim.") var batch: Int = 250
    @Option(help: "Claims measured per case (the median is printed).") var rounds: Int = 40
    @Option(help: "Pending jobs of each of the 10 paused credentials.") var pausedBacklog: Int = 10_000
    @Option(help: "Due jobs waiting behind each of the 5 full rate limits.") var limitedBacklog: Int = 1_000
    @Option(help: "Jobs per key in the coalesced backlog (50 keys).") var perKey: Int = 1_000

    func run() async throws {
        let logger = benchLogger()
        try await withBenchDatabase(named: "push_bench_controls", logger: logger) { url, _ in
            print("database: \(url)")
            try await withClient(url, logger: logger, workerSession: true) { client in
                try await Migrator(client: client, logger: logger).migrate()
                let queue = JobQueue(client: client, logger: logger, clock: ContinuousClock(), preparedStatements: true)

                /// Milliseconds of one claim of up to `batch`.
                func timedClaim() async throws -> (ms: Double, batch: JobQueue.ClaimBatch) {
                    let clock = ContinuousClock()
                    let start = clock.now
                    let batch = try await queue.claimBatch(limit: self.batch, workerID: "bench", lease: .seconds(60))
                    let elapsed = clock.now - start
                    return (
                        Double(elapsed.components.attoseconds) / 1e15 + Double(elapsed.components.seconds) * 1000, batch
                    )
                }

                /// Median of `rounds` claims, each of `batch` due jobs inserted just before (with coalesce keys
                /// when `keyed`).
                func measure(keyed: Bool) async throws -> Double {
                    var samples: [Double] = []
                    for round in 0..<self.rounds {
                        try await client.query(
                            """
                            INSERT INTO push.jobs (topic, device_token, payload, priority, coalesce_key)
                            SELECT 'com.example.app', lpad(to_hex(g), 64, 'c'), '{"aps":{}}', 5,
                                   CASE WHEN \(keyed) THEN 'activity-' || \(Int64(round)) || '-' || g END
                              FROM generate_series(1, \(Int64(self.batch))) AS g
                            """,
                            logger: logger
                        )
                        let (ms, claimed) = try await timedClaim()
                        precondition(claimed.jobs.count == self.batch, "claimed \(claimed.jobs.count)")
                        samples.append(ms)
                        try await client.query("DELETE FROM push.jobs WHERE state = 'running'", logger: logger)
                    }
                    return samples.sorted()[samples.count / 2]
                }

                try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
                let plain = try await measure(keyed: false)

                // 10 paused credentials with a backlog each.
                try await client.query(
                    """
                    INSERT INTO push.jobs (topic, device_token, payload, credential)
                    SELECT 'com.example.app', lpad(to_hex(g), 64, 'b'), '{"aps":{}}', 'paused-' || (g % 10)
                      FROM generate_series(1, \(Int64(self.pausedBacklog * 10))) AS g
                    """,
                    logger: logger
                )
                for n in 0..<10 {
                    try await queue.operations.pause(credential: "paused-\(n)", topic: nil, reason: "bench")
                }
                try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
                let paused = try await measure(keyed: false)

                // 5 rate limits, each with its schedule full and due jobs waiting (older than the batch).
                for n in 0..<5 {
                    try await queue.operations.setRateLimit(
                        credential: nil,
                        topic: "com.example.limited\(n)",
                        perSecond: 0.001,
                        burst: 1
                    )
                }
                try await client.query(
                    """
                    INSERT INTO push.jobs (topic, device_token, payload, priority, run_at)
                    SELECT 'com.example.limited' || (g % 5), lpad(to_hex(g), 64, 'd'), '{"aps":{}}', 5,
                           now() - interval '1 hour'
                      FROM generate_series(1, \(Int64(self.limitedBacklog * 5))) AS g
                    """,
                    logger: logger
                )
                // Fill each schedule: the first claim takes one job per limit.
                _ = try await queue.claimBatch(limit: 5, workerID: "bench", lease: .seconds(60))
                try await client.query("DELETE FROM push.jobs WHERE state = 'running'", logger: logger)
                try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
                let limited = try await measure(keyed: false)
                let keyed = try await measure(keyed: true)

                // The one claim that meets a coalesced backlog: 50 keys × perKey due jobs.
                try await client.query(
                    """
                    INSERT INTO push.jobs (topic, device_token, payload, coalesce_key)
                    SELECT 'com.example.app', lpad(to_hex(g), 64, 'e'), '{"aps":{}}', 'key-' || (g % 50)
                      FROM generate_series(1, \(Int64(self.perKey * 50))) AS g
                    """,
                    logger: logger
                )
                try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
                let (coalescing, first) = try await timedClaim()
                let (after, _) = try await timedClaim()

                print("claim of \(self.batch), median of \(self.rounds)                      ms     × plain")
                print(String(format: "plain (no pauses, limits or keys)                 %7.2f   %5.2f", plain, 1.0))
                print(
                    String(
                        format: "+ 10 paused credentials × %6d jobs             %7.2f   %5.2f",
                        self.pausedBacklog,
                        paused,
                        paused / plain
                    )
                )
                print(
                    String(
                        format: "+ 5 full rate limits × %5d due jobs waiting      %7.2f   %5.2f",
                        self.limitedBacklog,
                        limited,
                        limited / plain
                    )
                )
                print(
                    String(
                        format: "+ every claimed job with a coalesce key           %7.2f   %5.2f",
                        keyed,
                        keyed / plain
                    )
                )
                print(
                    String(
                        format:
                            "one claim over 50 keys × %5d coalesced jobs     %7.2f   %5.2f   (claimed %d, superseded %d)",
                        self.perKey,
                        coalescing,
                        coalescing / plain,
                        first.jobs.count,
                        first.superseded
                    )
                )
                print(
                    String(
                        format: "the claim after it                                %7.2f   %5.2f",
                        after,
                        after / plain
                    )
                )
            }
        }
    }
}
