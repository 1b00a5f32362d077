public import PushCore
import Synchronization

/// A clock that moves only when a test says so. `sleep(until:)` returns once ``advance(by:)`` has moved it
/// past the deadline; a cancelled sleeper leaves at once with `CancellationError`, as `Task.sleep` does.
public final class ManualClock: MonotonicClock {
    private struct Sleeper {
        var deadline: ContinuousClock.Instant
        var continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var now: ContinuousClock.Instant
        var sleepers: [UInt64: Sleeper] = [:]
        var nextID: UInt64 = 0
    }

    private let state: Mutex<State>

    /// A clock that starts at the continuous clock's present.
    public init() {
        self.state = Mutex(State(now: ContinuousClock.now))
    }

    public var now: ContinuousClock.Instant { self.state.withLock { $0.now } }

    public var minimumResolution: Duration { .zero }

    /// How many callers are asleep on this clock now (a test waits for its subject to be asleep before
    /// moving time).
    public var sleepers: Int { self.state.withLock { $0.sleepers.count } }

    /// The earliest deadline a caller sleeps until, if any.
    public var nextDeadline: ContinuousClock.Instant? {
        self.state.withLock { $0.sleepers.values.map(\.deadline).min() }
    }

    public func sleep(until deadline: ContinuousClock.Instant, tolerance: Duration? = nil) async throws {
        let id = self.state.withLock { state -> UInt64 in
            state.nextID += 1
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let resumeNow = self.state.withLock { state -> Result<Void, any Error>? in
                    if Task.isCancelled { return .failure(CancellationError()) }
                    if deadline <= state.now { return .success(()) }
                    state.sleepers[id] = Sleeper(deadline: deadline, continuation: continuation)
                    return nil
                }
                if let resumeNow { continuation.resume(with: resumeNow) }
            }
        } onCancel: {
            let sleeper = self.state.withLock { $0.sleepers.removeValue(forKey: id) }
            sleeper?.continuation.resume(throwing: CancellationError())
        }
    }

    /// Moves the clock on by `duration` (never back) and wakes every sleeper whose deadline has come.
    public func advance(by duration: Duration) {
        precondition(duration >= .zero, "a monotonic clock does not go back")
        let due = self.state.withLock { state -> [Sleeper] in
            state.now = state.now.advanced(by: duration)
            let now = state.now
            let due = state.sleepers.filter { $0.value.deadline <= now }
            for id in due.keys { state.sleepers[id] = nil }
            return due.values.sorted { $0.deadline < $1.deadline }
        }
        for sleeper in due { sleeper.continuation.resume() }
    }

    /// Waits in real time, up to `limit`, until at least `count` callers sleep on this clock; false if they
    /// never did (the test then fails instead of hanging).
    @discardableResult
    public func waitForSleepers(_ count: Int = 1, within limit: Duration = .seconds(30)) async -> Bool {
        let deadline = ContinuousClock.now + limit
        while self.sleepers < count {
            if ContinuousClock.now > deadline { return false }
            try? await Task.sleep(for: .milliseconds(1))
        }
        return true
    }

    /// Waits in real time, up to `limit`, until `condition` holds of the clock; false if it never did.
    public func wait(within limit: Duration = .seconds(30), until condition: (ManualClock) -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + limit
        while !condition(self) {
            if ContinuousClock.now > deadline { return false }
            try? await Task.sleep(for: .milliseconds(1))
        }
        return true
    }
}
