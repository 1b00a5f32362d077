public import PostgresNIO
import Synchronization

/// The pooled client of the database host in use, and how to open the LISTEN connection to it; switched to
/// another host while running (a failover moved the primary, or a renewed password) without a restart, so a
/// worker keeps its held jobs and the outcomes it has not written yet.
///
/// Every statement takes ``client`` when it starts: once switched, new statements go to the new host, and the
/// old client is shut down, which fails the statements still waiting in its pool (they are retried by their
/// loops, on the new client). A client built with ``init(_:listener:host:)`` and never switched is a plain
/// holder: tests and one-shot commands run their client themselves.
public final class PrimaryClient: Sendable {
    struct State {
        var client: PostgresClient
        var listener: PostgresConnection.Configuration?
        var host: String
        var generation = 0
        /// Each client's `run()`, while ``run()`` runs.
        var running: [Int: Task<Void, Never>] = [:]
        var isRunning = false
        var switchHandlers: [@Sendable () -> Void] = []
        var beforeSwitch: [@Sendable (PostgresClient) async -> Void] = []
    }
    private let state: Mutex<State>

    /// - Parameters:
    ///   - client: the pooled client of the host in use.
    ///   - listener: how to open the LISTEN connection to the same host.
    ///   - host: that host, `host:port`, for logs and to tell a switch to another host.
    public init(_ client: PostgresClient, listener: PostgresConnection.Configuration? = nil, host: String = "") {
        self.state = Mutex(State(client: client, listener: listener, host: host))
    }

    /// The client new statements run on.
    public var client: PostgresClient { self.state.withLock { $0.client } }
    /// How to open the LISTEN connection to the host in use.
    public var listenerConfiguration: PostgresConnection.Configuration? { self.state.withLock { $0.listener } }
    /// The host in use, `host:port`.
    public var host: String { self.state.withLock { $0.host } }
    /// How many times the client was switched.
    public var switches: Int { self.state.withLock { $0.generation } }

    /// Called after each switch (the LISTEN connection closes its connection to the old host with it).
    public func onSwitch(_ handler: @escaping @Sendable () -> Void) {
        self.state.withLock { $0.switchHandlers.append(handler) }
    }

    /// Called with the new client, running but not yet in use, before each switch: the worker returns there the
    /// jobs it does not hold, before any claim of its own can go through it.
    public func beforeSwitch(_ hook: @escaping @Sendable (PostgresClient) async -> Void) {
        self.state.withLock { $0.beforeSwitch.append(hook) }
    }

    /// Runs the client in use, and each one switched to, until cancelled; then shuts them down and returns.
    public func run() async {
        self.state.withLock { state in
            state.isRunning = true
            let client = state.client
            state.running[state.generation] = Self.start(client)
        }
        await withTaskCancellationHandler {
            while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
        } onCancel: {
            for task in self.state.withLock({ Array($0.running.values) }) { task.cancel() }
        }
        let tasks = self.state.withLock { state in
            state.isRunning = false
            defer { state.running = [:] }
            return Array(state.running.values)
        }
        for task in tasks {
            task.cancel()
            await task.value
        }
    }

    /// A client's `run()` in a task of its own, detached: a switch is made from the worker's task, and a
    /// client started there would inherit the worker's graceful shutdown (postgres-nio's `run()` stops on
    /// it) and close while the worker still writes its last outcomes. Cancelled by ``run()`` or a switch.
    private static func start(_ client: PostgresClient) -> Task<Void, Never> {
        Task.detached { await client.run() }
    }

    /// Makes `client` the one new statements run on (started here when ``run()`` runs) and shuts the old
    /// one down; the LISTEN connection reconnects with `listener`.
    public func switchTo(_ client: PostgresClient, listener: PostgresConnection.Configuration?, host: String) async {
        let (started, hooks) = self.state.withLock { state in
            (state.isRunning ? Self.start(client) : nil, state.beforeSwitch)
        }
        for hook in hooks { await hook(client) }
        let (old, handlers) = self.state.withLock { state -> (Task<Void, Never>?, [@Sendable () -> Void]) in
            let old = state.running.removeValue(forKey: state.generation)
            state.generation += 1
            state.client = client
            state.listener = listener
            state.host = host
            if let started { state.running[state.generation] = started }
            return (old, state.switchHandlers)
        }
        old?.cancel()
        for handler in handlers { handler() }
    }
}
