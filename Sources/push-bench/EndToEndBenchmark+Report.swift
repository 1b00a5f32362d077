import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import PushProcess

/// One drain's throughput and CPU per job.
struct DrainFigures {
    var rate: Double
    var worker: Double
    var postgres: Double
}

extension EndToEndBenchmark {
    /// Waits until no job is pending or running (an EXISTS probe on the partial indexes every 250 ms: each
    /// probe is Postgres CPU counted against the drain, so rarely), calling `during` after each probe; 10
    /// minutes at most.
    static func waitForDrain(
        _ client: PostgresClient,
        worker: ChildProcess.Running,
        what: String,
        logger: Logger,
        during: () -> Void = {}
    ) async throws {
        let clock = ContinuousClock()
        let start = clock.now
        while try await scalar(
            client,
            "SELECT CASE WHEN EXISTS (SELECT 1 FROM push.jobs WHERE state = 'pending') OR EXISTS (SELECT 1 FROM push.jobs WHERE state = 'running') THEN 1 ELSE 0 END::int8",
            logger
        ) == 1 {
            during()
            try await Task.sleep(for: .milliseconds(250))
            guard clock.now - start < .seconds(600) else {
                throw ValidationError("the \(what) did not finish in 10 minutes: \(worker.output.suffix(1000))")
            }
        }
    }

    /// Checks that all `jobs` were delivered and returns the seconds from the first delivery to the last.
    static func deliveredSpan(
        _ client: PostgresClient,
        jobs: Int,
        what: String,
        worker: ChildProcess.Running,
        logger: Logger
    ) async throws -> Double {
        let delivered = try await scalar(client, "SELECT count(*) FROM push.jobs WHERE state = 'delivered'", logger)
        guard delivered == jobs else {
            throw ValidationError("\(jobs - delivered) \(what)jobs were not delivered: \(worker.output.suffix(1000))")
        }
        return try await client.query(
            "SELECT extract(epoch FROM max(delivered_at) - min(delivered_at))::float8 FROM push.jobs",
            logger: logger
        ).decode(Double.self).reduce(into: 0.0) { $0 = $1 }
    }

    /// Another drain by the same worker: the tables emptied, `insert` run, the worker let go.
    static func drainAgain(
        _ what: String,
        insert: String,
        jobs: Int,
        _ client: PostgresClient,
        _ worker: ChildProcess.Running,
        _ logger: Logger
    ) async throws -> DrainFigures {
        worker.signal(SIGSTOP)
        try await client.query("TRUNCATE push.jobs, push.dead_jobs, push.webhook_deliveries", logger: logger)
        try await client.query(PostgresQuery(unsafeSQL: insert), logger: logger)
        try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
        let before = (worker: cpuMicros(worker.pid), postgres: cpuMicros(named: "postgres"))
        worker.signal(SIGCONT)
        try await waitForDrain(client, worker: worker, what: "\(what) drain", logger: logger)
        let after = (worker: cpuMicros(worker.pid), postgres: cpuMicros(named: "postgres"))
        let seconds = try await deliveredSpan(client, jobs: jobs, what: "\(what) ", worker: worker, logger: logger)
        return DrainFigures(
            rate: Double(jobs - 1) / seconds,
            worker: (after.worker - before.worker) / Double(jobs),
            postgres: (after.postgres - before.postgres) / Double(jobs)
        )
    }
}

/// What `push-bench e2e` prints: every figure of one run.
struct EndToEndReport {
    var standIn: String
    var jobs: Int
    var drain: DrainFigures
    var drainSeconds: Double
    var sinkPerJob: Double
    var utilisation: Double
    var switchesPerJob: Double
    var fcm: DrainFigures
    var hooks: [(String, DrainFigures)]
    var peer: PeerPipeline.Figures?
    var sqlCeiling: Double
    var transportCeiling: Double
    /// Enqueue-to-request latencies in milliseconds, sorted.
    var latencies: [Double]
    var rate: Int
    var rss: (idle: Int, peak: Int, idleAnon: Int, peakAnon: Int)

    func percentile(_ p: Double) -> Double {
        self.latencies.isEmpty
            ? .nan : self.latencies[min(Int(Double(self.latencies.count) * p), self.latencies.count - 1)]
    }

    func show() {
        print(
            "database: fresh cluster, fsync on; worker: push-worker run defaults (concurrency 500, batch 250); APNs stand-in: \(self.standIn)"
        )
        print(
            String(
                format: "drain            %8.0f jobs/s  (%d jobs, outcomes written, %.1f s)",
                self.drain.rate,
                self.jobs,
                self.drainSeconds
            )
        )
        print(
            String(
                format:
                    "CPU per job      worker %.1f µs   Postgres %.1f µs   stand-in %.1f µs   (machine %.0f %% busy over the drain); worker threads switched %.2f times a job",
                self.drain.worker,
                self.drain.postgres,
                self.sinkPerJob,
                self.utilisation * 100,
                self.switchesPerJob
            )
        )
        print(
            String(
                format:
                    "FCM drain        %8.0f jobs/s  (%d platform fcm jobs, same worker and stand-in)  CPU per job: worker %.1f µs (%.2fx APNs'), Postgres %.1f µs",
                self.fcm.rate,
                self.jobs,
                self.fcm.worker,
                self.fcm.worker / self.drain.worker,
                self.fcm.postgres
            )
        )
        for (label, figures) in self.hooks {
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
        if let peer = self.peer {
            print(
                String(
                    format:
                        "peer             %8.0f jobs/s  (PGQueuer 1.6 + aioapns 4.0, 2 processes, %.1f s)  push-worker is %.1fx its throughput",
                    peer.rate,
                    peer.seconds,
                    self.drain.rate / peer.rate
                )
            )
            print(
                String(
                    format:
                        "peer CPU per job  Python %.1f µs   Postgres %.1f µs   stand-in %.1f µs   (peer / push-worker: Python %.1fx the worker, Postgres %.1fx)",
                    peer.python,
                    peer.postgres,
                    peer.sink,
                    peer.python / self.drain.worker,
                    peer.postgres / self.drain.postgres
                )
            )
        } else {
            print("peer             not measured (bench/e2e.sh passes --peer-python; it needs PyPI once)")
        }
        print(
            String(
                format:
                    "SQL ceiling      %8.0f jobs/s  (pgbench claim+record, batch 100, 8 clients) ratio %.2f",
                self.sqlCeiling,
                self.drain.rate / self.sqlCeiling
            )
        )
        print(
            String(
                format: "transport ceiling %7.0f req/s   (h2load, 2 connections, 250 streams) ratio %.2f",
                self.transportCeiling,
                self.drain.rate / self.transportCeiling
            )
        )
        print(
            String(
                format: "enqueue->request p50 %.1f ms  p99 %.1f ms  (%d single-row INSERTs at %d/s)",
                self.percentile(0.5),
                self.percentile(0.99),
                self.latencies.count,
                self.rate
            )
        )
        print(
            String(
                format: "worker RSS       idle %.1f MB (before any job), peak under load %.1f MB",
                Double(self.rss.idle) / 1024,
                Double(self.rss.peak) / 1024
            )
        )
        print(
            String(
                format:
                    "  of which anonymous (the worker's own memory, not mapped code) idle %.1f MB, under load %.1f MB",
                Double(self.rss.idleAnon) / 1024,
                Double(self.rss.peakAnon) / 1024
            )
        )
    }
}
