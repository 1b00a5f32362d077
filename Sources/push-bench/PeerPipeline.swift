import APNsSimulator
import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import PushProcess
import PushQueue
import Synchronization

/// The comparison in `push-bench e2e --peer-python`: what a Python team builds from PyPI (PGQueuer 1.6 and
/// aioapns 4.0, `bench/peer/pgqueuer_aioapns.py`), two processes, draining the same number of jobs from the
/// same Postgres cluster to the same stand-in, measured the way push-worker is: CPU per job from /proc over
/// the drain (the processes started, connected and then frozen while the jobs were loaded), and the rate
/// from the finished jobs' log timestamps.
struct PeerPipeline {
    let python: String
    let script: String
    let url: DatabaseURL
    let sinkPort: Int
    let sinkPID: pid_t
    let caFile: String
    let credentials: SimulatorCredentials
    let directory: String

    struct Figures {
        var rate: Double
        var seconds: Double
        var python: Double
        var postgres: Double
        var sink: Double
    }

    func drain(jobs: Int, server: DatabaseURL, logger: Logger) async throws -> Figures {
        try await withClient(server, logger: logger) { client in
            try await client.query("CREATE DATABASE \(unescaped: self.url.database)", logger: logger)
        }
        // Installs PGQueuer's schema (an empty queue), so the workers can start before the jobs exist.
        try self.enqueue(0)
        let workers = try (0..<2).map { n in
            try ChildProcess.start(
                self.python,
                [
                    self.script, "work", "--dsn", self.url.connectionString, "--port", String(self.sinkPort),
                    "--ca", self.caFile, "--key", self.credentials.keyPath, "--key-id", self.credentials.keyID,
                    "--team-id", self.credentials.teamID,
                ],
                environment: [:],
                outputPath: self.directory + "/peer-\(n).log"
            )
        }
        defer {
            for worker in workers {
                worker.signal(SIGKILL)
                _ = worker.wait()
            }
        }
        try await Task.sleep(for: .seconds(3))
        for worker in workers { worker.signal(SIGSTOP) }
        try self.enqueue(jobs)
        let figures = Mutex(Figures(rate: 0, seconds: 0, python: 0, postgres: 0, sink: 0))
        try await withClient(self.url, logger: logger) { client in
            let before = (
                python: workers.reduce(0) { $0 + cpuMicros($1.pid) }, postgres: cpuMicros(named: "postgres"),
                sink: cpuMicros(self.sinkPID)
            )
            let clock = ContinuousClock()
            let start = clock.now
            for worker in workers { worker.signal(SIGCONT) }
            while try await scalar(client, "SELECT (EXISTS (SELECT 1 FROM pgqueuer))::int::int8", logger) == 1 {
                try await Task.sleep(for: .milliseconds(250))
                guard clock.now - start < .seconds(900) else {
                    throw ValidationError("the peer did not drain in 15 minutes: \(workers[0].output.suffix(1000))")
                }
            }
            let after = (
                python: workers.reduce(0) { $0 + cpuMicros($1.pid) }, postgres: cpuMicros(named: "postgres"),
                sink: cpuMicros(self.sinkPID)
            )
            let successful = try await scalar(
                client,
                "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'",
                logger
            )
            guard successful == jobs else {
                throw ValidationError(
                    "the peer finished \(successful) of \(jobs) jobs successfully: \(workers[0].output.suffix(1000))"
                )
            }
            let seconds = try await client.query(
                "SELECT extract(epoch FROM max(created) - min(created))::float8 FROM pgqueuer_log WHERE status = 'successful'",
                logger: logger
            ).decode(Double.self).reduce(into: 0.0) { $0 = $1 }
            let measured = Figures(
                rate: Double(jobs - 1) / seconds,
                seconds: seconds,
                python: (after.python - before.python) / Double(jobs),
                postgres: (after.postgres - before.postgres) / Double(jobs),
                sink: (after.sink - before.sink) / Double(jobs)
            )
            figures.withLock { $0 = measured }
        }
        return figures.withLock { $0 }
    }

    private func enqueue(_ jobs: Int) throws {
        let result = try ChildProcess.run(
            self.python,
            [self.script, "enqueue", "--dsn", self.url.connectionString, "--jobs", String(jobs)],
            limit: .seconds(3_600)
        )
        guard result.status == 0 else {
            throw ValidationError("the peer's enqueue failed: \(result.output.suffix(2000))")
        }
    }
}
