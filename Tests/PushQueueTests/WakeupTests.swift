import Foundation
import PostgresNIO
import PushQueue
import PushQueueTesting
import Testing

@Suite("Wake-ups: LISTEN with a polling fallback")
struct WakeupTests {
    @Test("LISTEN wakes a waiting claimer within milliseconds of a plain-SQL INSERT from another connection")
    func listenWakesClaimer() async throws {
        try await TestPostgres.withDatabase { db in
            let signal = WakeSignal()
            let listening = WakeSignal()
            let listener = JobNotificationListener(
                configuration: try db.url.connectionConfiguration(),
                signal: signal,
                logger: db.logger,
                onListening: { listening.signal() }
            )
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { await listener.run() }
                #expect(await listening.wait(timeout: .seconds(10)))
                // The listener signals once on connect (to catch up); consume that.
                #expect(await signal.wait(timeout: .seconds(1)))

                let clock = ContinuousClock()
                async let woken: (Bool, Duration) = {
                    let start = clock.now
                    let notified = await signal.wait(timeout: .seconds(10))
                    return (notified, clock.now - start)
                }()
                try await Task.sleep(for: .milliseconds(50))
                let insertedAt = clock.now
                // Another connection, plain SQL: psql if present, else a second client connection.
                try await db.execute(
                    "INSERT INTO push.jobs (topic, device_token, payload) VALUES ('com.example.app', 'ab', '{\"aps\":{}}')"
                )
                let (notified, _) = await woken
                let latency = clock.now - insertedAt
                #expect(notified, "woken by NOTIFY, not by the poll timeout")
                #expect(latency < .seconds(2))
                print("LISTEN wake-up latency after INSERT returned: \(latency)")
                let jobs = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(30))
                #expect(jobs.count == 1)
                group.cancelAll()
            }
        }
    }

    @Test("a wait with no signal falls back to its timeout; signals while nobody waits fold into one")
    func signalSemantics() async throws {
        let signal = WakeSignal()
        #expect(await signal.wait(timeout: .milliseconds(20)) == false)
        signal.signal()
        signal.signal()
        signal.signal()
        #expect(await signal.wait(timeout: .seconds(5)) == true)
        #expect(await signal.wait(timeout: .milliseconds(20)) == false, "three signals fold into one wake-up")
    }

    @Test("a signal wakes every current waiter")
    func wakesAllWaiters() async throws {
        let signal = WakeSignal()
        let woken = await withTaskGroup(of: Bool.self) { group in
            for _ in 0..<3 {
                group.addTask { await signal.wait(timeout: .seconds(10)) }
            }
            // Signal until every waiter has returned (each signal wakes all current waiters; early ones
            // that arrive before a waiter registers are kept for it).
            var results: [Bool] = []
            while results.count < 3 {
                signal.signal()
                if let result = await group.next() { results.append(result) }
            }
            return results
        }
        #expect(woken == [true, true, true])
    }
}
