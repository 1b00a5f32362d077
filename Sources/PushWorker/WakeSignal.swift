import PushCore
import Synchronization

/// A level-triggered wake-up for the claimer: `signal()` from the LISTEN connection (or anyone), `wait`
/// in the claim loop. Signals while nobody waits are folded into one, so a burst of NOTIFYs costs one
/// claim round (debounce by construction).
final class WakeSignal: Sendable {
    private struct State {
        var pending = false
        var waiters: [UInt64: CheckedContinuation<Bool, Never>] = [:]
        var nextID: UInt64 = 0
    }

    private let state = Mutex(State())

    /// Creates a signal with nothing pending.
    init() {}

    /// Wakes every waiter, or the next one to wait if none is waiting now.
    func signal() {
        let waiters = self.state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            if state.waiters.isEmpty {
                state.pending = true
                return []
            }
            defer { state.waiters.removeAll() }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume(returning: true) }
    }

    /// Waits for a signal or until `timeout` passes (the polling fallback), whichever is first.
    ///
    /// - Returns: `true` when woken by a signal, `false` on timeout or cancellation.
    func wait(timeout: Duration, clock: any PushClock) async -> Bool {
        if self.state.withLock({ state in
            defer { state.pending = false }
            return state.pending
        }) {
            return true
        }
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask { await self.waitForSignal() }
            group.addTask {
                try? await clock.sleep(for: timeout)
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
    }

    private func waitForSignal() async -> Bool {
        let id = self.state.withLock { state -> UInt64 in
            state.nextID += 1
            return state.nextID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let resumeNow = self.state.withLock { state -> Bool? in
                    if Task.isCancelled { return false }
                    if state.pending {
                        state.pending = false
                        return true
                    }
                    state.waiters[id] = continuation
                    return nil
                }
                if let resumeNow { continuation.resume(returning: resumeNow) }
            }
        } onCancel: {
            let waiter = self.state.withLock { $0.waiters.removeValue(forKey: id) }
            waiter?.resume(returning: false)
        }
    }
}
