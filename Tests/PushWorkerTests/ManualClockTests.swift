import PushClockTesting
import PushCore
import PushQueueTesting
import Testing

@Suite("The injected clock: a manual clock wakes its sleepers when moved, and a cancelled sleeper leaves")
struct ManualClockTests {
    @Test("a sleeper wakes once the clock passes its deadline, not before; a later one stays asleep")
    func wakesOnAdvance() async throws {
        let clock = ManualClock()
        let start = clock.now
        let woken = WokenOrder()
        async let short: Void = {
            try await clock.sleep(for: .seconds(5))
            await woken.append("short")
        }()
        async let long: Void = {
            try await clock.sleep(for: .seconds(30))
            await woken.append("long")
        }()
        #expect(await clock.waitForSleepers(2))
        #expect(clock.nextDeadline == start + .seconds(5))
        clock.advance(by: .seconds(4))
        #expect(clock.sleepers == 2, "4 s into a 5 s sleep: still asleep")
        clock.advance(by: .seconds(1))
        try await short
        #expect(clock.sleepers == 1 && clock.now == start + .seconds(5))
        clock.advance(by: .seconds(60))
        try await long
        #expect(await woken.names == ["short", "long"])
        try await clock.sleep(until: start, tolerance: nil)  // a deadline already past returns at once
    }

    @Test("a cancelled sleeper leaves at once with CancellationError and is forgotten")
    func cancellation() async {
        let clock = ManualClock()
        let sleeper = Task { try await clock.sleep(for: .seconds(3600)) }
        #expect(await clock.waitForSleepers(1))
        sleeper.cancel()
        await #expect(throws: CancellationError.self) { try await sleeper.value }
        #expect(clock.sleepers == 0)
        let early = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            try await clock.sleep(for: .seconds(1))
        }
        await #expect(throws: CancellationError.self) { try await early.value }
    }

    actor WokenOrder {
        var names: [String] = []
        func append(_ name: String) { self.names.append(name) }
    }
}
