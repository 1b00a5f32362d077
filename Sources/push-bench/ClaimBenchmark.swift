import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import PushQueue

/// `push-bench claim`: the time of one 250-job claim with an empty backlog, next to the same claim with a
/// large backlog that is not due, and one that belongs to a paused credential. The claim reads one range
/// per (credential, priority), so neither backlog should cost more than 2× the empty-queue claim.
struct ClaimBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "claim",
        abstract:
            "Claim time with an empty backlog vs 500,000 jobs not yet due vs 300,000 of a paused credential, and after draining them."
    )

    @Option(help: "Jobs claimed per claim.") var batch: Int = 250
    @Option(help: "Claims measured per case (the median is printed).") var rounds: Int = 40
    @Option(help: "Backlog of priority-10 jobs due next week.") var notDue: Int = 500_000
    @Option(help: "Backlog of due jobs of a paused credential.") var paused: Int = 300_000

    func run() async throws {
        let logger = benchLogger()
        try await withBenchDatabase(named: "push_bench_claim", logger: logger) { url, _ in
            print("database: \(url)")
            // The worker's session settings, as `push-worker run` connects.
            try await withClient(url, logger: logger, workerSession: true) { client in
                try await Migrator(client: client, logger: logger).migrate()
                let queue = JobQueue(client: client, logger: logger, clock: ContinuousClock(), preparedStatements: true)

                /// Median milliseconds of `rounds` claims, each of `batch` due priority-5 jobs inserted just before.
                func measure(excluding: [String]) async throws -> Double {
                    let samples = try await claimSamples(
                        client,
                        queue,
                        rounds: self.rounds,
                        batch: self.batch,
                        excluding: excluding,
                        logger: logger
                    )
                    return samples.sorted()[samples.count / 2]
                }

                try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
                let empty = try await measure(excluding: [])
                try await client.query(
                    """
                    INSERT INTO push.jobs (topic, device_token, payload, priority, run_at)
                    SELECT 'com.example.app', lpad(to_hex(g), 64, 'a'), '{"aps":{}}', 10, now() + interval '7 days'
                      FROM generate_series(1, \(Int64(self.notDue))) AS g
                    """,
                    logger: logger
                )
                try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
                let notDue = try await measure(excluding: [])
                try await client.query(
                    """
                    INSERT INTO push.jobs (topic, device_token, payload, priority, credential)
                    SELECT 'com.example.app', lpad(to_hex(g), 64, 'b'), '{"aps":{}}', 10, 'paused'
                      FROM generate_series(1, \(Int64(self.paused))) AS g
                    """,
                    logger: logger
                )
                try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
                let withPaused = try await measure(excluding: ["paused"])
                // After a drain: the backlogs deleted and vacuumed; the heap keeps its size, the statistics
                // say "small", which is when a planner likes a sequential scan.
                try await client.query("DELETE FROM push.jobs", logger: logger)
                try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
                let drained = try await measure(excluding: [])
                print("claim of \(self.batch), median of \(self.rounds)       ms     × empty")
                print(String(format: "empty backlog                     %7.2f   %5.2f", empty, 1.0))
                print(
                    String(format: "+ %7d not due (next week)     %7.2f   %5.2f", self.notDue, notDue, notDue / empty)
                )
                print(
                    String(
                        format: "+ %7d of a paused credential %7.2f   %5.2f",
                        self.paused,
                        withPaused,
                        withPaused / empty
                    )
                )
                print(String(format: "after draining them (bloated heap) %7.2f   %5.2f", drained, drained / empty))
            }
        }
    }
}
