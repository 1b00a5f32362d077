import Foundation
import Synchronization
import Testing

/// At most a few heavy tests at once, whatever the test runner's width: those that start `push-worker`
/// processes, Postgres clusters of their own or a browser. Each such test drives its in-process simulator,
/// its workers and Postgres hard on a machine of two cores; four of them side by side (the runner's default
/// width there) starved each other's timed exchanges past their deadlines (a 10 s request timeout missed, a
/// simulator that read nothing for 2 s). Light tests (unit, one database) run beside them as before.
///
/// `PUSH_HEAVY_TESTS=N` sets the number (default 4 with the release `push-worker`, 3 with the debug one: the
/// heavy tests mostly wait on timers, children and sockets; at 4 with the release build the two cores were
/// busy two thirds of the run; at 5 a light transport test's 5 s deadlines and a fleet seed's rate floor
/// failed under the load).
/// A heavy test inside another (a fixture in a fixture) runs on its parent's permit.
///
/// Waiting tests are served longest first (`expected`: about how long the test takes alone), then in arrival
/// order: the run's last minutes are short tests filling the permits, not one long test started last while the
/// other permits stand idle (longest-processing-time-first scheduling). Tests that mostly wait (a 15 s
/// Postgres outage, a 30 s steady stream: `mostlyWaiting`) go before every other: the run's first minute is
/// also some 300 light tests using both cores, which a waiting test does not mind and a busy one (the fleet
/// seeds: three workers and thousands of jobs) is slowed by, a third longer when started with them.
public enum HeavyTestGate {
    @TaskLocal static var holdsPermit = false

    private struct State {
        var free: Int
        /// Waiting tests, longest expected first and then in arrival order, each with the permits it needs (the
        /// head is served first).
        var waiters: [(count: Int, order: Order, continuation: CheckedContinuation<Void, Never>)] = []
    }

    /// The number of permits.
    public static let permits = max(
        1,
        ProcessInfo.processInfo.environment["PUSH_HEAVY_TESTS"].flatMap(Int.init)
            ?? (ReleaseBuild.pushWorker.release ? 4 : Self.debugPermits)
    )

    /// The default with the debug `push-worker` (about four times the release build's CPU): as before the
    /// release build was used, when 4 starved timed exchanges.
    static let debugPermits = 3

    /// `PUSH_HEAVY_TESTS_TRACE=1` prints each heavy test's wait for its permit and how long it held it.
    static let trace = ProcessInfo.processInfo.environment["PUSH_HEAVY_TESTS_TRACE"] == "1"

    private static let state = Mutex(State(free: Self.permits))

    /// When the first heavy test arrived (the trace's origin).
    private static let firstUse = ContinuousClock.now

    /// Runs `body` once a permit is free; `exclusive`: once every permit is, so no other heavy test runs
    /// beside it (the failover formation: under a neighbour's load pg_auto_failover let its primary commit
    /// without the standby, and the planned switchover lost the commits of 821 claims and outcomes).
    /// `expected`: about how long the test takes alone; longer ones are let in first. `mostlyWaiting`: it
    /// spends most of that on timers, not CPU; such tests are let in before all others.
    public static func run<T>(
        exclusive: Bool = false,
        expected: Duration = .seconds(5),
        mostlyWaiting: Bool = false,
        _ body: () async throws -> T
    ) async throws -> T {
        if Self.holdsPermit { return try await body() }
        let count = exclusive ? Self.permits : 1
        _ = Self.firstUse
        let arrived = ContinuousClock.now
        await Self.acquire(count, Order(mostlyWaiting: mostlyWaiting, expected: expected))
        let granted = ContinuousClock.now
        defer {
            Self.release(count)
            if Self.trace {
                let name = Test.current?.displayName ?? Test.current?.name ?? "?"
                print(
                    "heavy test: waited \(granted - arrived), held \(ContinuousClock.now - granted) (from \(granted - Self.firstUse)): \(name)"
                )
            }
        }
        return try await Self.$holdsPermit.withValue(true) { try await body() }
    }

    /// Runs `prepare` on one permit and, meanwhile, waits for the others; then `body` with every permit. The
    /// slow set-up of an exclusive test (a formation of clusters) overlaps the drain of the tests still
    /// running, instead of the permits standing idle while it waits for all of them. One test at most may
    /// use it (two would each hold one permit and wait for the other's).
    ///
    /// It is let in after every other waiting test: the tests it waits for are then the run's last, short
    /// ones. Let in among the long ones, the permits stood idle while the longest of them finished (a
    /// minute with three permits idle, 2026-11-29).
    public static func run<P: Sendable, T>(
        preparing prepare: @escaping @Sendable () async throws -> P,
        exclusive body: (P) async throws -> T
    ) async throws -> T {
        if Self.holdsPermit { return try await body(try await prepare()) }
        let arrived = ContinuousClock.now
        // The run's first heavy tests arrive within its first seconds (later if the test cluster's initdb holds
        // the concurrency pool's threads): behind them, not before them (a permit granted at once would hold a
        // prepared formation idle for the whole run). Run alone, the test starts 10 s late.
        try? await Task.sleep(until: Self.firstUse + .seconds(10))
        await Self.acquire(1, .last)
        let rest = Task { await Self.acquire(Self.permits - 1, .last) }
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

    /// Where a waiting test goes in the queue: those that mostly wait first, then the longest expected.
    struct Order: Sendable {
        var mostlyWaiting: Bool
        var expected: Duration

        /// After every other waiter (the exclusive test).
        static let last = Order(mostlyWaiting: false, expected: .zero)

        /// Whether a test with this order is let in before one with `other`.
        func precedes(_ other: Order) -> Bool {
            self.mostlyWaiting != other.mostlyWaiting ? self.mostlyWaiting : self.expected > other.expected
        }
    }

    private static func acquire(_ count: Int, _ order: Order) async {
        // Nothing to wait for (the exclusive test's rest with a single permit): queued, it would wait behind
        // tests that need the permit it holds.
        guard count > 0 else { return }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let granted = Self.state.withLock { state -> Bool in
                if state.waiters.isEmpty && state.free >= count {
                    state.free -= count
                    return true
                }
                // Before the first waiter it precedes: after those that go as early, so arrival order breaks ties.
                let at = state.waiters.firstIndex { order.precedes($0.order) } ?? state.waiters.endIndex
                state.waiters.insert((count, order, continuation), at: at)
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
