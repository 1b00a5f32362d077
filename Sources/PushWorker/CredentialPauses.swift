import Foundation
import Synchronization

/// Credentials APNs rejected (InvalidProviderToken, Forbidden, no key configured, …): their jobs stay
/// pending until the pause ends, instead of burning through every job of a misconfigured key. Each
/// consecutive rejection doubles the pause, up to a cap; a success ends the streak.
final class CredentialPauses: Sendable {
    struct Pause {
        var until: Date
        var length: Duration
    }

    private let pauses = Mutex<[String: Pause]>([:])
    let initial: Duration
    let maximum: Duration

    init(initial: Duration, maximum: Duration) {
        self.initial = initial
        self.maximum = maximum
    }

    /// Pauses `credential`; returns when the pause ends and whether it was newly paused (log once).
    func pause(_ credential: String, now: Date = Date()) -> (until: Date, isNew: Bool) {
        self.pauses.withLock { pauses in
            if let current = pauses[credential], current.until > now { return (current.until, false) }
            let length = pauses[credential].map { min($0.length * 2, self.maximum) } ?? self.initial
            let until = now.addingTimeInterval(length.seconds)
            pauses[credential] = Pause(until: until, length: length)
            return (until, true)
        }
    }

    /// A send with `credential` succeeded: forget its streak.
    func succeeded(_ credential: String) {
        self.pauses.withLock { pauses in
            if pauses[credential] != nil { pauses[credential] = nil }
        }
    }

    /// Whether `credential` is paused now (a claimed job of it is then held, not sent).
    func isPaused(_ credential: String, now: Date = Date()) -> Bool {
        self.pauses.withLock { $0[credential].map { $0.until > now } ?? false }
    }

    /// Credentials paused right now (the claim leaves their jobs pending).
    func active(now: Date = Date()) -> [String] {
        self.pauses.withLock { pauses in pauses.filter { $0.value.until > now }.map(\.key).sorted() }
    }
}
