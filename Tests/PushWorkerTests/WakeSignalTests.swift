import Testing

@testable import PushWorker

@Suite("WakeSignal: the claimer's level-triggered wake-up")
struct WakeSignalTests {
    @Test("a wait with no signal falls back to its timeout; signals while nobody waits fold into one")
    func signalSemantics() async throws {
        let signal = WakeSignal()
        #expect(await signal.wait(timeout: .milliseconds(20), clock: ContinuousClock()) == false)
        signal.signal()
        signal.signal()
        signal.signal()
        #expect(await signal.wait(timeout: .seconds(5), clock: ContinuousClock()) == true)
        #expect(
            await signal.wait(timeout: .milliseconds(20), clock: ContinuousClock()) == false,
            "three signals fold into one wake-up"
        )
    }

    @Test("a signal wakes every current waiter")
    func wakesAllWaiters() async throws {
        let signal = WakeSignal()
        let woken = await withTaskGroup(of: Bool.self) { group in
            for _ in 0..<3 {
                group.addTask { await signal.wait(timeout: .seconds(10), clock: ContinuousClock()) }
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
