public import Foundation
public import PushCore
import Synchronization

/// A clock that moves only when a test says so. `sleep(until:)` returns once ``advance(by:)`` has moved it
/// past the deadline; a cancelled sleeper leaves at once with `CancellationError`, as `Task.sleep` does. A
/// test waits for its subject to fall asleep with ``waitForSleepers(_:within:)``, woken by the sleep itself
/// (a continuation), not by polling.
public final class ManualClock: PushClock {
    private struct Sleeper {
        var deadline: ContinuousClock.Instant
        var continuation: CheckedContinuation<Void, any Error>
    }

    /// What a waiting test may look at: read under the clock's lock, each time a caller falls asleep, wakes
    /// or leaves.
    public struct Snapshot: Sendable {
        /// The clock's time.
        public let now: ContinuousClock.Instant
        /// How many callers sleep.
        public let sleepers: Int
        /// The earliest deadline a caller sleeps until, if any.
        public let nextDeadline: ContinuousClock.Instant?
    }

    /// A test waiting until `condition` holds.
    private struct Watcher {
        var condition: @Sendable (Snapshot) -> Bool
        var continuation: CheckedContinuation<Bool, Never>
    }

    private struct State {
        var now: ContinuousClock.Instant
        var sleepers: [UInt64: Sleeper] = [:]
        var watchers: [UInt64: Watcher] = [:]
        var nextID: UInt64 = 0

        var snapshot: Snapshot {
            Snapshot(
                now: self.now,
                sleepers: self.sleepers.count,
                nextDeadline: self.sleepers.values.map(\.deadline).min()
            )
        }

        /// The watchers whose condition holds now, removed.
        mutating func satisfiedWatchers() -> [Watcher] {
            guard !self.watchers.isEmpty else { return [] }
            let snapshot = self.snapshot
            let satisfied = self.watchers.filter { $0.value.condition(snapshot) }
            for id in satisfied.keys { self.watchers[id] = nil }
            return Array(satisfied.values)
        }
    }

    private let state: Mutex<State>

    /// A clock that starts at the continuous clock's present.
    /// The instant the clock started at, and the wall time it maps to.
    private let origin: ContinuousClock.Instant
    private let wallOrigin: Date

    /// A clock that starts at the continuous clock's present, and at `wall` (by default the system's) for
    /// its wall time.
    public init(wall: Date = Date()) {
        let origin = ContinuousClock.now
        self.origin = origin
        self.wallOrigin = wall
        self.state = Mutex(State(now: origin))
    }

    public var now: ContinuousClock.Instant { self.state.withLock { $0.now } }

    /// Wall time: the wall time the clock started at, moved as far as ``advance(by:)`` moved it.
    public var wallNow: Date {
        let elapsed = self.now - self.origin
        return self.wallOrigin.addingTimeInterval(
            Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        )
    }

    public var minimumResolution: Duration { .zero }

    /// How many callers are asleep on this clock now.
    public var sleepers: Int { self.state.withLock { $0.sleepers.count } }

    /// The earliest deadline a caller sleeps until, if any.
    public var nextDeadline: ContinuousClock.Instant? {
        self.state.withLock { $0.sleepers.values.map(\.deadline).min() }
    }

    public func sleep(until deadline: ContinuousClock.Instant, tolerance: Duration? = nil) async throws {
        let id = self.newID()
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let (resumeNow, satisfied) = self.state.withLock { state -> (Result<Void, any Error>?, [Watcher]) in
                    if Task.isCancelled { return (.failure(CancellationError()), []) }
                    if deadline <= state.now { return (.success(()), []) }
                    state.sleepers[id] = Sleeper(deadline: deadline, continuation: continuation)
                    return (nil, state.satisfiedWatchers())
                }
                if let resumeNow { continuation.resume(with: resumeNow) }
                for watcher in satisfied { watcher.continuation.resume(returning: true) }
            }
        } onCancel: {
            let (sleeper, satisfied) = self.state.withLock { state in
                (state.sleepers.removeValue(forKey: id), state.satisfiedWatchers())
            }
            sleeper?.continuation.resume(throwing: CancellationError())
            for watcher in satisfied { watcher.continuation.resume(returning: true) }
        }
    }

    /// Moves the clock on by `duration` (never back) and wakes every sleeper whose deadline has come.
    public func advance(by duration: Duration) {
        precondition(duration >= .zero, "a monotonic clock does not go back")
        let (due, satisfied) = self.state.withLock { state -> ([Sleeper], [Watcher]) in
            state.now = state.now.advanced(by: duration)
            let now = state.now
            let due = state.sleepers.filter { $0.value.deadline <= now }
            for id in due.keys { state.sleepers[id] = nil }
            return (due.values.sorted { $0.deadline < $1.deadline }, state.satisfiedWatchers())
        }
        for sleeper in due { sleeper.continuation.resume() }
        for watcher in satisfied { watcher.continuation.resume(returning: true) }
    }

    /// Returns once at least `count` callers sleep on this clock (woken by the sleep that makes it so), or
    /// false after `limit` of real time if they never did (the test then fails instead of hanging).
    @discardableResult
    public func waitForSleepers(_ count: Int = 1, within limit: Duration = .seconds(30)) async -> Bool {
        await self.wait(within: limit) { $0.sleepers >= count }
    }

    /// Returns once `condition` holds of the clock (checked now and each time a caller falls asleep, wakes or
    /// leaves), or false after `limit` of real time. `condition` runs under the clock's lock: it reads only
    /// the snapshot.
    public func wait(
        within limit: Duration = .seconds(30),
        until condition: @escaping @Sendable (Snapshot) -> Bool
    ) async -> Bool {
        let id = self.newID()
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                await withTaskCancellationHandler {
                    await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                        let resumeNow = self.state.withLock { state -> Bool? in
                            if Task.isCancelled { return false }
                            if condition(state.snapshot) { return true }
                            state.watchers[id] = Watcher(condition: condition, continuation: continuation)
                            return nil
                        }
                        if let resumeNow { continuation.resume(returning: resumeNow) }
                    }
                } onCancel: {
                    let watcher = self.state.withLock { $0.watchers.removeValue(forKey: id) }
                    watcher?.continuation.resume(returning: false)
                }
            }
            group.addTask {
                // The one real-time wait: the bound on a test that would otherwise hang.
                try? await Task.sleep(for: limit)
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
    }

    private func newID() -> UInt64 {
        self.state.withLock { state in
            state.nextID += 1
            return state.nextID
        }
    }
}
