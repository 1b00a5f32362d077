import Logging
import PostgresNIO
import PushClockTesting
import PushCore
import PushQueue
import PushQueueTesting
import Testing

@testable import PushWorker

@Suite("The outcome writer on the injected clock, against a real Postgres")
struct OutcomeWriterClockTests {
    @Test(
        "an outcome waits the batching interval on the worker's clock, not the wall's; its wait shows in the backlog gauge; then it is written"
    )
    func batchingInterval() async throws {
        try await TestPostgres.withDatabase { db in
            try await db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{}}' FROM generate_series(1, 3) g
                """
            )
            let jobs = try await db.queue.claim(limit: 3, workerID: "w", lease: .seconds(300))
            #expect(jobs.count == 3)
            let clock = ManualClock()
            let writer = OutcomeWriter(
                queue: db.queue,
                workerID: "w",
                batchSize: 10,
                interval: .seconds(5),
                logger: db.logger,
                metrics: WorkerMetrics(),
                clock: clock
            ) { _ in }
            let running = Task { await writer.run() }
            // Idle: the writer waits for a signal (its 1 s poll on the same clock).
            #expect(await clock.waitForSleepers(1), "the idle writer waits on the injected clock")
            for job in jobs {
                writer.add(
                    JobOutcome(
                        jobID: job.id,
                        attempt: job.attempts,
                        disposition: .delivered,
                        attemptedAt: .now,
                        status: 200
                    )
                )
            }
            // Woken by the first outcome, it waits the 5 s interval for more, on the injected clock.
            let waiting = await clock.wait { $0.nextDeadline == $0.now + .seconds(5) }
            try #require(waiting, "the writer waits its 5 s interval on the injected clock")
            clock.advance(by: .seconds(3))
            #expect(writer.oldestWaiting == .seconds(3), "the backlog gauge reads the same clock")
            // Real time passes, the worker's does not: nothing is written.
            try await Task.sleep(for: .milliseconds(200))
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == 0)
            #expect(writer.pending == 3)
            clock.advance(by: .seconds(2))
            let deadline = ContinuousClock.now + .seconds(30)
            // Written: the rows committed, and the writer done with its bookkeeping (it clears its in-flight mark
            // just after the commit is visible).
            while try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") < 3
                || writer.oldestWaiting != .zero,
                ContinuousClock.now < deadline
            {
                try await Task.sleep(for: .milliseconds(10))
            }
            #expect(try await db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == 3)
            #expect(writer.pending == 0 && writer.oldestWaiting == .zero)
            writer.stop(giveUpAfter: .seconds(5))
            await running.value
        }
    }
}
