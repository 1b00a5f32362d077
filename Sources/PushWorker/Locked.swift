import Synchronization

/// A `Mutex` behind a reference, for state that a closure shares with its owner.
final class Locked<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>

    init(_ value: Value) { self.mutex = Mutex(value) }

    func withLock<Result>(_ body: (inout sending Value) throws -> sending Result) rethrows -> sending Result {
        try self.mutex.withLock(body)
    }
}
