import Foundation
import Synchronization
import Testing

/// At most a few heavy tests at once, whatever the test runner's width: those that start `push-worker`
/// processes, Postgres clusters of their own or a browser. Each such test drives its in-process simulator,
/// its workers and Postgres hard on a machine of two cores; four of them side by side (the runner's default
/// width there) starved each other's timed exchanges past their deadlines (a 10 s request timeout missed, a
/// simulator that read nothing for 2 s). Light tests (unit, one database) run beside them as before.
///
/// `PUSH_HEAVY_TESTS=N` sets the number (default 3: the heavy tests mostly wait on timers, children and
/// sockets; at 3 the machine's two cores were busy a third of the run, and five runs passed). A heavy test inside another (a fixture in a fixture)
/// runs on its parent's permit.
public enum HeavyTestGate {
    @TaskLocal static var holdsPermit = false

    private struct State {
        var free: Int
        /// Waiting tests in arrival order, each with the permits it needs (the head is served first).
        var waiters: [(count: Int, continuation: CheckedContinuation<Void, Never>)] = []
    }

    /// The number of permits.
    public static let permits = max(1, ProcessInfo.processInfo.environment["PUSH_HEAVY_TESTS"].flatMap(Int.init) ?? 3)

    /// `PUSH_HEAVY_TESTS_TRACE=1` prints each heavy test's wait for its permit and how long it held it.
    static let trace = ProcessInfo.processInfo.environment["PUSH_HEAVY_TESTS_TRACE"] == "1"

    private static let state = Mutex(State(free: Self.permits))

    /// Runs `body` once a permit is free; `exclusive`: once every permit is, so no other heavy test runs
    /// beside it (the failover formation: under a neighbour's load pg_auto_failover let its primary commit
    /// without the standby, and the planned switchover lost the commits of 821 claims and outcomes).
    public static func run<T>(exclusive: Bool = false, _ body: () async throws -> T) async throws -> T {
        if Self.holdsPermit { return try await body() }
        let count = exclusive ? Self.permits : 1
        let arrived = ContinuousClock.now
        await Self.acquire(count)
        let granted = ContinuousClock.now
        defer {
            Self.release(count)
            if Self.trace {
                let name = Test.current?.displayName ?? Test.current?.name ?? "?"
                print("heavy test: waited \(granted - arrived), held \(ContinuousClock.now - granted): \(name)")
            }
        }
        return try await Self.$holdsPermit.withValue(true) { try await body() }
    }

    /// Runs `prepare` on one permit and, meanwhile, waits for the others; then `body` with every permit. The
    /// slow set-up of an exclusive test (a formation of clusters) overlaps the drain of the tests still
    /// running, instead of the permits standing idle while it waits for all of them. One test at most may
    /// use it (two would each hold one permit and wait for the other's).
    public static func run<P: Sendable, T>(
        preparing prepare: @escaping @Sendable () async throws -> P,
        exclusive body: (P) async throws -> T
    ) async throws -> T {
        if Self.holdsPermit { return try await body(try await prepare()) }
        let arrived = ContinuousClock.now
        await Self.acquire(1)
        let rest = Task { await Self.acquire(Self.permits - 1) }
        let prepared: Result<P, any Error>
        do {
            prepared = .success(try await Self.$holdsPermit.withValue(true) { try await prepare() })
        } catch {
            prepared = .failure(error)
        }
        await rest.value
        let granted = ContinuousClock.now
        defer {
            Self.release(Self.permits)
            if Self.trace {
                let name = Test.current?.displayName ?? Test.current?.name ?? "?"
                print(
                    "heavy test: waited \(granted - arrived) (preparing meanwhile), held \(ContinuousClock.now - granted) exclusively: \(name)"
                )
            }
        }
        let value = try prepared.get()
        return try await Self.$holdsPermit.withValue(true) { try await body(value) }
    }

    private static func acquire(_ count: Int) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let granted = Self.state.withLock { state -> Bool in
                if state.waiters.isEmpty && state.free >= count {
                    state.free -= count
                    return true
                }
                state.waiters.append((count, continuation))
                return false
            }
            if granted { continuation.resume() }
        }
    }

    private static func release(_ count: Int) {
        let next = Self.state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.free += count
            var granted: [CheckedContinuation<Void, Never>] = []
            while let head = state.waiters.first, head.count <= state.free {
                state.free -= head.count
                granted.append(head.continuation)
                state.waiters.removeFirst()
            }
            return granted
        }
        for continuation in next { continuation.resume() }
    }
}

/// Runs blocking work (a socket, a child process, `initdb`) on a Dispatch thread, never on the concurrency
/// pool: two blocked pool threads on a 2-core machine stall every other test's async work, in-process
/// simulators and servers included.
public func offPool<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        DispatchQueue.global().async { continuation.resume(with: Result { try body() }) }
    }
}
