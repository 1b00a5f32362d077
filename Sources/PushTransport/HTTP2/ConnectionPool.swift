import Logging
import NIOCore
import NIOSSL
import Synchronization

/// A fixed number of connections to one endpoint for one credential, opened lazily, reopened with
/// exponential backoff after a failed connect, PINGed when idle, replaced after GOAWAY or loss.
final class ConnectionPool: Sendable {
    struct State {
        var machine: PoolStateMachine<HTTP2Connection>
        /// Callers waiting for a connect under way to end, by id (a cancelled one is taken out).
        var waiters: [(id: Int, continuation: CheckedContinuation<Void, Never>)] = []
        var nextWaiterID = 0
        /// After ``closeAll()``: a connect still under way closes what it opened instead of keeping it.
        var closed = false
    }

    /// What the pool needs of its client (no reference back to it).
    struct Context: Sendable {
        var configuration: PoolConfiguration
        /// Who answers ("APNs"), for logs and errors.
        var peer: String
        /// The provider's rule for request headers never to HPACK-index.
        var changesEveryRequest: @Sendable (String) -> Bool
        var tlsContext: NIOSSLContext
        /// Whether `tlsContext` carries a client certificate (a certificate credential).
        var clientCertificate = false
        var group: any EventLoopGroup
        var logger: Logger
    }

    let endpoint: PushEndpoint
    let context: Context
    private let state: Mutex<State>

    /// Now, on the pool's clock (the reconnect backoff's).
    private var now: ContinuousClock.Instant { self.context.configuration.clock.now }

    init(endpoint: PushEndpoint, context: Context) {
        self.endpoint = endpoint
        self.context = context
        let configuration = context.configuration
        self.state = Mutex(
            State(
                machine: PoolStateMachine(
                    size: configuration.connectionsPerPool,
                    initialBackoff: configuration.initialReconnectBackoff,
                    maximumBackoff: configuration.maximumReconnectBackoff
                )
            )
        )
    }

    /// The peer answered a request: the endpoint is healthy, reconnects need no backoff.
    func succeeded() {
        self.state.withLock { $0.machine.answered() }
    }

    var openCount: Int { self.state.withLock { $0.machine.openCount } }

    /// Callers waiting for a connect under way (for tests).
    var waitingForConnect: Int { self.state.withLock { $0.waiters.count } }

    /// A usable connection: the one with the most free streams, opening an empty slot first.
    ///
    /// - Parameter waitForNew: `false` for a caller that sends many requests in one task (a batch): an empty
    ///   slot opens in the background while another connection is open and usable, and that one is used now,
    ///   so one handshake (or one failed connect) does not hold up or fail the whole batch.
    func connection(waitForNew: Bool = true) async throws -> HTTP2Connection {
        while true {
            let now = self.now
            let (action, swept, usable) = self.state.withLock { state in
                let (action, swept) = state.machine.next(now: now)
                return (action, swept, state.machine.openCount)
            }
            // A swept connection closes once its processed streams have their answers.
            for connection in swept { connection.retire() }
            switch action {
            case .use(let connection):
                if !(await connection.verifiedIfIdle(
                    after: self.context.configuration.idlePingAfter,
                    timeout: .seconds(5)
                )) {
                    self.context.logger.info(
                        "idle \(self.context.peer) connection did not answer PING; replacing it",
                        metadata: ["push.connection": "\(connection.id)"]
                    )
                    await self.discard(connection)
                    continue
                }
                return connection
            case .open(let slot, let id) where !waitForNew && usable > 0:
                Task { _ = try? await self.open(slot: slot, id: id) }
                continue
            case .open(let slot, let id):
                return try await self.open(slot: slot, id: id)
            case .wait:
                // Until a connect under way ends; a caller cancelled meanwhile leaves at once, unsent.
                let id = self.state.withLock { state in
                    defer { state.nextWaiterID += 1 }
                    return state.nextWaiterID
                }
                await withTaskCancellationHandler {
                    await withCheckedContinuation { continuation in
                        let resumeNow = self.state.withLock { state -> Bool in
                            if state.machine.connecting.contains(true) && !Task.isCancelled {
                                state.waiters.append((id, continuation))
                                return false
                            }
                            return true
                        }
                        if resumeNow { continuation.resume() }
                    }
                } onCancel: {
                    let waiter = self.state.withLock { state -> CheckedContinuation<Void, Never>? in
                        guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                        return state.waiters.remove(at: index).continuation
                    }
                    waiter?.resume()
                }
                if Task.isCancelled { throw TransportError.withdrawn }
            case .unreachable(let until):
                throw TransportError(
                    code: .connectFailed,
                    mayHaveBeenProcessed: false,
                    message:
                        "\(self.context.peer) at \(self.endpoint.host):\(self.endpoint.port) is unreachable; next connect attempt in \(until - self.now)"
                )
            }
        }
    }

    /// Connects into `slot`; wakes the callers waiting for a connect either way.
    private func open(slot: Int, id: Int) async throws -> HTTP2Connection {
        do {
            let connection = try await HTTP2Connection.connect(
                id: id,
                peer: self.context.peer,
                changesEveryRequest: self.context.changesEveryRequest,
                host: self.endpoint.host,
                port: self.endpoint.port,
                tls: self.context.tlsContext,
                proxy: self.context.configuration.httpsProxy,
                clientCertificate: self.context.clientCertificate,
                group: self.context.group,
                connectTimeout: self.context.configuration.connectTimeout,
                clock: self.context.configuration.clock,
                logger: self.context.logger
            )
            let (waiters, closed) = self.state.withLock { state -> ([CheckedContinuation<Void, Never>], Bool) in
                if !state.closed { state.machine.connected(connection, slot: slot) }
                defer { state.waiters.removeAll() }
                return (state.waiters.map(\.continuation), state.closed)
            }
            for waiter in waiters { waiter.resume() }
            if closed {
                await connection.close()
                throw ClientClosed()
            }
            return connection
        } catch is ClientClosed {
            throw TransportError(code: .shutdown, mayHaveBeenProcessed: false, message: "the client is shutting down")
        } catch {
            let now = self.now
            let (waiters, backoff) = self.state.withLock {
                state -> ([CheckedContinuation<Void, Never>], Duration) in
                let backoff = state.machine.connectFailed(slot: slot, now: now)
                defer { state.waiters.removeAll() }
                return (state.waiters.map(\.continuation), backoff)
            }
            for waiter in waiters { waiter.resume() }
            self.context.logger.warning(
                "could not connect to \(self.context.peer)",
                metadata: [
                    "push.endpoint": "\(self.endpoint.host):\(self.endpoint.port)",
                    "push.retry_in": "\(backoff)", "push.error": "\(error)",
                ]
            )
            if let transport = error as? TransportError { throw transport }
            let via = self.context.configuration.httpsProxy.flatMap {
                $0.applies(to: self.endpoint.host) ? " through proxy \($0)" : nil
            }
            throw TransportError(
                code: .connectFailed,
                mayHaveBeenProcessed: false,
                message:
                    "could not connect to \(self.endpoint.host):\(self.endpoint.port)\(via ?? ""): \(error)"
            )
        }
    }

    /// A connect that finished after ``closeAll()``.
    private struct ClientClosed: Error {}

    /// Takes a connection out of the pool (GOAWAY, PING failure, UnrelatedKeyIdInToken); it closes once
    /// its in-flight requests finish, and its slot reopens on demand.
    func discard(_ connection: HTTP2Connection) async {
        let now = self.now
        _ = self.state.withLock { $0.machine.discard(connection, now: now) }
        connection.retire()
    }

    func closeAll() async {
        let connections = self.state.withLock { state in
            state.closed = true
            return state.machine.closeAll()
        }
        for connection in connections { await connection.close() }
    }
}
