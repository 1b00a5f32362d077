import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import PushQueue

/// `push-bench queue`: claim+record throughput of the queue API alone, next to pgbench running the same SQL.
struct QueueBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "queue",
        abstract:
            "Claim+record throughput of JobQueue (one worker) vs pgbench running the same SQL on the same database."
    )

    @Option(help: "Batch sizes to measure.") var batches: [Int] = [1, 100, 500]
    @Option(help: "Jobs drained per measurement at batch size 1 (larger batches drain --jobs).") var singleJobs: Int =
        3_000
    @Option(help: "Jobs drained per measurement at batch sizes above 1.") var jobs: Int = 50_000
    @Option(help: "Seconds pgbench runs per batch size.") var pgbenchSeconds: Int = 10
    @Option(help: "Directory of bench/pgbench-claim-record.sql.") var sqlDirectory: String = "bench"

    func run() async throws {
        let logger = benchLogger()
        try await withBenchDatabase(named: "push_bench", logger: logger) { url, freshCluster in
            print(
                "database: \(url)  (fsync \(freshCluster ? "on, synchronous_commit on" : "as configured on the server"))"
            )
            print("batch  api jobs/s  pgbench jobs/s  api/pgbench")
            try await withClient(url, logger: logger) { client in
                try await Migrator(client: client, logger: logger).migrate()
                let queue = JobQueue(client: client, logger: logger, clock: ContinuousClock())
                for batch in self.batches {
                    let count = batch == 1 ? self.singleJobs : self.jobs
                    try await preloadJobs(client, count: count, logger: logger)
                    let clock = ContinuousClock()
                    let start = clock.now
                    var drained = 0
                    while true {
                        let claimed = try await queue.claim(limit: batch, workerID: "bench", lease: .seconds(60))
                        if claimed.isEmpty { break }
                        let result = try await queue.writeOutcomes(
                            claimed.map {
                                JobOutcome(
                                    jobID: $0.id,
                                    attempt: $0.attempts,
                                    disposition: .delivered,
                                    attemptedAt: .now,
                                    status: 200,
                                    latencyMs: 1
                                )
                            },
                            workerID: "bench"
                        )
                        precondition(result.fenced.isEmpty)
                        drained += claimed.count
                    }
                    let elapsed = clock.now - start
                    let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
                    let apiRate = Double(drained) / seconds

                    // pgbench: enough pending jobs that it never runs dry within its time.
                    try await preloadJobs(
                        client,
                        count: min(max(Int(apiRate * Double(self.pgbenchSeconds) * 1.5), batch * 200), 2_000_000),
                        logger: logger
                    )
                    let pgbenchRate = try runPGBench(
                        url: url,
                        batch: batch,
                        seconds: self.pgbenchSeconds,
                        sqlDirectory: self.sqlDirectory
                    )
                    print(
                        String(
                            format: "%5d  %11.0f  %14.0f  %10.2f",
                            batch,
                            apiRate,
                            pgbenchRate,
                            apiRate / pgbenchRate
                        )
                    )
                }
            }
        }
    }
}
