import Foundation
import Synchronization

/// At most a few heavy tests at once, whatever the test runner's width: those that start `push-worker`
/// processes, Postgres clusters of their own or a browser. Each such test drives its in-process simulator,
/// its workers and Postgres hard on a machine of two cores; four of them side by side (the runner's default
/// width there) starved each other's timed exchanges past their deadlines (a 10 s request timeout missed, a
/// simulator that read nothing for 2 s). Light tests (unit, one database) run beside them as before.
///
/// `PUSH_HEAVY_TESTS=N` sets the number (default 2). A heavy test inside another (a fixture in a fixture)
/// runs on its parent's permit.
public enum HeavyTestGate {
    @TaskLocal static var holdsPermit = false

    private struct State {
        var free: Int
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private static let state = Mutex(
        State(free: max(1, ProcessInfo.processInfo.environment["PUSH_HEAVY_TESTS"].flatMap(Int.init) ?? 2))
    )

    /// Runs `body` once a permit is free.
    public static func run<T>(_ body: () async throws -> T) async throws -> T {
        if Self.holdsPermit { return try await body() }
        await Self.acquire()
        defer { Self.release() }
        return try await Self.$holdsPermit.withValue(true) { try await body() }
    }

    private static func acquire() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let granted = Self.state.withLock { state -> Bool in
                if state.free > 0 {
                    state.free -= 1
                    return true
                }
                state.waiters.append(continuation)
                return false
            }
            if granted { continuation.resume() }
        }
    }

    private static func release() {
        let next = Self.state.withLock { state -> CheckedContinuation<Void, Never>? in
            if state.waiters.isEmpty {
                state.free += 1
                return nil
            }
            return state.waiters.removeFirst()
        }
        next?.resume()
    }
}
