import Foundation
import PostgresNIO
import PushQueue
import PushQueueTesting
import Testing

@Suite("Wake-ups: LISTEN with a polling fallback")
struct WakeupTests {
    @Test(
        "LISTEN wakes a waiting claimer within milliseconds of a plain-SQL INSERT from another connection (printed; under 2 s with other tests running)"
    )
    func listenWakesClaimer() async throws {
        try await TestPostgres.withDatabase { db in
            let (notifications, notify) = AsyncStream<Void>.makeStream()
            let (listenings, listened) = AsyncStream<Void>.makeStream()
            let listener = JobNotificationListener(
                configuration: try db.url.connectionConfiguration(),
                logger: db.logger,
                clock: ContinuousClock(),
                onListening: { listened.yield() }
            )
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { await listener.run { notify.yield() } }
                var listening = listenings.makeAsyncIterator()
                var catchUp = notifications.makeAsyncIterator()
                #expect(await listening.next() != nil)
                // The listener calls once on connect (to catch up); consume that.
                #expect(await catchUp.next() != nil)

                let clock = ContinuousClock()
                // Woken by the NOTIFY, or given up on after 10 s (a lost NOTIFY fails here, not hangs).
                async let woken: (Bool, Duration) = withTaskGroup(of: Bool.self) { group in
                    let start = clock.now
                    group.addTask {
                        var iterator = notifications.makeAsyncIterator()
                        return await iterator.next() != nil
                    }
                    group.addTask {
                        try? await Task.sleep(for: .seconds(10))
                        return false
                    }
                    let notified = await group.next() ?? false
                    group.cancelAll()
                    return (notified, clock.now - start)
                }
                try await Task.sleep(for: .milliseconds(50))
                // Another connection, plain SQL: psql if present, else a second client connection.
                try await db.execute(
                    "INSERT INTO push.jobs (topic, device_token, payload) VALUES ('com.example.app', repeat('ab', 64 / length('ab')), '{\"aps\":{}}')"
                )
                let insertedAt = clock.now
                let (notified, _) = await woken
                let latency = clock.now - insertedAt
                #expect(notified, "woken by NOTIFY within 10 s")
                // Milliseconds on a quiet machine (the figure is printed); the bound allows for the tests
                // that run beside this one.
                #expect(latency < .seconds(2))
                print("LISTEN wake-up latency after INSERT returned: \(latency)")
                let jobs = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(30))
                #expect(jobs.count == 1)
                group.cancelAll()
            }
        }
    }
}
