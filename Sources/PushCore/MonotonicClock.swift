import Synchronization

/// The clock the worker's timers read: pauses, the outcome writer's batching and backoff, the connection
/// pool's reconnect backoff, the heartbeat's freshness. Monotonic, so a wall-clock step neither ends nor
/// stretches a wait. `ContinuousClock` in production; tests pass a ``ManualClock`` and move time by hand
/// instead of sleeping (as postgres-nio's `ConnectionPool` takes its `Clock`).
///
/// Its instants are `ContinuousClock`'s, so the state machines that store them (`PoolStateMachine`,
/// `WorkerLiveness`, `Pauses`) need no generic parameter. What is written to Postgres or into a JWT (`iat`)
/// is wall time and stays `Date`: those instants are read by other machines.
public protocol MonotonicClock: Clock, Sendable
where Instant == ContinuousClock.Instant, Duration == Swift.Duration {}

extension ContinuousClock: MonotonicClock {}

extension MonotonicClock {
    /// Sleeps `duration` on this clock.
    public func sleep(for duration: Duration) async throws {
        try await self.sleep(until: self.now.advanced(by: duration), tolerance: nil)
    }
}

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

    /// Moves the clock on by `duration` and wakes every sleeper whose deadline has come.
    public func advance(by duration: Duration) {
        let due = self.state.withLock { state -> [Sleeper] in
            state.now = state.now.advanced(by: duration)
            let now = state.now
            let due = state.sleepers.filter { $0.value.deadline <= now }
            for id in due.keys { state.sleepers[id] = nil }
            return due.values.sorted { $0.deadline < $1.deadline }
        }
        for sleeper in due { sleeper.continuation.resume() }
    }

    /// Waits (in real time, briefly yielding) until at least `count` callers sleep on this clock.
    public func waitForSleepers(_ count: Int = 1) async {
        while self.sleepers < count { try? await Task.sleep(for: .milliseconds(1)) }
    }
}
