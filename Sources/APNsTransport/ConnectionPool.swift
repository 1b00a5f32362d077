import Logging
import NIOCore
import NIOSSL
import Synchronization

/// A fixed number of connections to one endpoint for one credential, opened lazily, reopened with
/// exponential backoff after a failed connect, PINGed when idle, replaced after GOAWAY or loss.
final class ConnectionPool: Sendable {
    struct State {
        var slots: [APNsConnection?]
        var connecting: [Bool]
        var nextConnectionID = 0
        var backoff: Duration = .zero
        var retryAt: ContinuousClock.Instant?
        var roundRobin = 0
        var waiters: [CheckedContinuation<Void, Never>] = []
        /// Whether a request has succeeded since the last connect: only then is the backoff reset, so a
        /// peer that accepts and at once sends GOAWAY (or drops) is not reconnected to in a tight loop.
        var succeededSinceConnect = true

        /// A connection left its slot (GOAWAY, closed): if none succeeded since the last connect, the
        /// next connect waits out the backoff.
        mutating func connectionLost(configuration: APNsClient.Configuration) {
            guard !self.succeededSinceConnect else { return }
            self.backoff =
                self.backoff == .zero
                ? configuration.initialReconnectBackoff : min(self.backoff * 2, configuration.maximumReconnectBackoff)
            self.retryAt = .now + self.backoff
        }
    }

    /// What the pool needs of its client (no reference back to it).
    struct Context: Sendable {
        var configuration: APNsClient.Configuration
        var tlsContext: NIOSSLContext
        var group: any EventLoopGroup
        var logger: Logger
    }

    let endpoint: APNsEndpoint
    let context: Context
    private let state: Mutex<State>

    init(endpoint: APNsEndpoint, context: Context) {
        self.endpoint = endpoint
        self.context = context
        let size = max(context.configuration.connectionsPerPool, 1)
        self.state = Mutex(
            State(slots: Array(repeating: nil, count: size), connecting: Array(repeating: false, count: size))
        )
    }

    /// A request succeeded: the endpoint is healthy, reconnects need no backoff.
    func succeeded() {
        self.state.withLock { state in
            guard !state.succeededSinceConnect else { return }
            state.succeededSinceConnect = true
            state.backoff = .zero
            state.retryAt = nil
        }
    }

    var openCount: Int { self.state.withLock { $0.slots.compactMap { $0 }.filter(\.isUsable).count } }

    /// A usable connection: the one with the most free streams, opening an empty slot first.
    func connection() async throws -> APNsConnection {
        while true {
            enum Step {
                case use(APNsConnection)
                case open(Int, id: Int)
                case wait
                case backoff(ContinuousClock.Instant)
            }
            var swept: [APNsConnection] = []
            let step = self.state.withLock { state -> Step in
                for index in state.slots.indices where state.slots[index].map({ !$0.isUsable }) ?? false {
                    swept.append(state.slots[index]!)
                    state.slots[index] = nil
                    state.connectionLost(configuration: self.context.configuration)
                }
                if let retryAt = state.retryAt, retryAt > .now, state.slots.allSatisfy({ $0 == nil }) {
                    return .backoff(retryAt)
                }
                if let empty = state.slots.indices.first(where: { state.slots[$0] == nil && !state.connecting[$0] }),
                    state.retryAt.map({ $0 <= .now }) ?? true
                {
                    state.connecting[empty] = true
                    state.nextConnectionID += 1
                    return .open(empty, id: state.nextConnectionID)
                }
                let open = state.slots.compactMap { $0 }
                if let best = open.max(by: { $0.limiter.available < $1.limiter.available }) {
                    if best.limiter.available > 0 { return .use(best) }
                    state.roundRobin &+= 1
                    return .use(open[state.roundRobin % open.count])
                }
                return .wait
            }
            // A swept connection closes once its processed streams have their answers.
            for connection in swept { connection.retire() }
            switch step {
            case .use(let connection):
                if connection.idleFor > self.context.configuration.idlePingAfter,
                    !(await connection.ping(timeout: .seconds(5)))
                {
                    self.context.logger.info(
                        "idle APNs connection did not answer PING; replacing it",
                        metadata: ["push.connection": "\(connection.id)"]
                    )
                    await self.discard(connection)
                    continue
                }
                return connection
            case .open(let index, let id):
                do {
                    let connection = try await APNsConnection.connect(
                        id: id,
                        host: self.endpoint.host,
                        port: self.endpoint.port,
                        tls: self.context.tlsContext,
                        group: self.context.group,
                        connectTimeout: self.context.configuration.connectTimeout,
                        logger: self.context.logger
                    )
                    let waiters = self.state.withLock { state -> [CheckedContinuation<Void, Never>] in
                        state.slots[index] = connection
                        state.connecting[index] = false
                        state.succeededSinceConnect = false
                        state.retryAt = nil
                        defer { state.waiters.removeAll() }
                        return state.waiters
                    }
                    for waiter in waiters { waiter.resume() }
                    return connection
                } catch {
                    let (waiters, backoff) = self.state.withLock {
                        state -> ([CheckedContinuation<Void, Never>], Duration) in
                        state.connecting[index] = false
                        let configuration = self.context.configuration
                        state.backoff =
                            state.backoff == .zero
                            ? configuration.initialReconnectBackoff
                            : min(state.backoff * 2, configuration.maximumReconnectBackoff)
                        state.retryAt = .now + state.backoff
                        defer { state.waiters.removeAll() }
                        return (state.waiters, state.backoff)
                    }
                    for waiter in waiters { waiter.resume() }
                    self.context.logger.warning(
                        "could not connect to APNs",
                        metadata: [
                            "push.endpoint": "\(self.endpoint.host):\(self.endpoint.port)",
                            "push.retry_in": "\(backoff)", "push.error": "\(error)",
                        ]
                    )
                    if let transport = error as? TransportError { throw transport }
                    throw TransportError(
                        code: .connectFailed,
                        mayHaveBeenProcessed: false,
                        message: "could not connect to \(self.endpoint.host):\(self.endpoint.port): \(error)"
                    )
                }
            case .wait:
                await withCheckedContinuation { continuation in
                    let resumeNow = self.state.withLock { state -> Bool in
                        if state.connecting.contains(true) {
                            state.waiters.append(continuation)
                            return false
                        }
                        return true
                    }
                    if resumeNow { continuation.resume() }
                }
            case .backoff(let until):
                throw TransportError(
                    code: .connectFailed,
                    mayHaveBeenProcessed: false,
                    message:
                        "APNs at \(self.endpoint.host):\(self.endpoint.port) is unreachable; next connect attempt in \(until - .now)"
                )
            }
        }
    }

    /// Takes a connection out of the pool (GOAWAY, PING failure, UnrelatedKeyIdInToken); it closes once
    /// its in-flight requests finish, and its slot reopens on demand.
    func discard(_ connection: APNsConnection) async {
        self.state.withLock { state in
            for index in state.slots.indices where state.slots[index] === connection {
                state.slots[index] = nil
                state.connectionLost(configuration: self.context.configuration)
            }
        }
        connection.retire()
    }

    func closeAll() async {
        let connections = self.state.withLock { state -> [APNsConnection] in
            defer { state.slots = state.slots.map { _ in nil } }
            return state.slots.compactMap { $0 }
        }
        for connection in connections { await connection.close() }
    }
}
