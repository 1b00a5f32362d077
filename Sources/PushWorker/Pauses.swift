import PushCore
import Synchronization

/// Things the worker holds back for a while after a refusal, keyed by what was refused: credentials APNs
/// rejected (InvalidProviderToken, Forbidden, no key configured, …), a credential's topics (TopicDisallowed),
/// endpoints that could not be reached. Their jobs stay pending until the pause ends, instead of burning
/// through every job of a misconfigured key. Each consecutive refusal doubles the pause, up to a cap; a
/// success ends the streak. On the worker's monotonic clock: a wall-clock step neither ends nor stretches a pause.
final class Pauses<Key: Hashable & Sendable>: Sendable {
    struct Pause {
        var until: ContinuousClock.Instant
        var length: Duration
        /// The peer said how long (a spent quota's Retry-After): a success of a request written before it
        /// does not lift it.
        var fixed = false
    }

    private let pauses = Mutex<[Key: Pause]>([:])
    let initial: Duration
    let maximum: Duration
    let clock: any PushClock

    init(initial: Duration, maximum: Duration, clock: any PushClock) {
        self.initial = initial
        self.maximum = maximum
        self.clock = clock
    }

    /// Pauses `key`; returns how long and whether it was newly paused (log once).
    func pause(_ key: Key) -> (length: Duration, isNew: Bool) {
        let now = self.clock.now
        return self.pauses.withLock { pauses in
            if let current = pauses[key], current.until > now { return (current.until - now, false) }
            let length = pauses[key].map { min($0.length * 2, self.maximum) } ?? self.initial
            pauses[key] = Pause(until: now + length, length: length)
            return (length, true)
        }
    }

    /// Pauses `key` for exactly `length` (the peer said how long: FCM's `Retry-After` for a spent quota),
    /// extending a shorter pause; `isNew` when it was not paused. Only time lifts it.
    func pause(_ key: Key, for length: Duration) -> (length: Duration, isNew: Bool) {
        let now = self.clock.now
        return self.pauses.withLock { pauses in
            let current = pauses[key].flatMap { $0.until > now ? $0 : nil }
            let until = max(current?.until ?? now, now + length)
            pauses[key] = Pause(until: until, length: current?.length ?? self.initial, fixed: true)
            return (until - now, current == nil)
        }
    }

    /// A send with `key` succeeded: forget its streak, and lift its pause unless the peer fixed its length
    /// (answers of requests written before a spent quota's 429 still arrive as 200s).
    func succeeded(_ key: Key) {
        self.pauses.withLock { pauses in
            if let pause = pauses[key], !pause.fixed || pause.until <= self.clock.now { pauses[key] = nil }
        }
    }

    /// Whether `key` is paused now (a claimed job of it is then held, not sent).
    func isPaused(_ key: Key) -> Bool {
        let now = self.clock.now
        return self.pauses.withLock { $0[key].map { $0.until > now } ?? false }
    }

    /// Keys paused right now (the claim leaves their jobs pending).
    func active() -> [Key] {
        let now = self.clock.now
        return self.pauses.withLock { pauses in pauses.filter { $0.value.until > now }.map(\.key) }
    }
}
