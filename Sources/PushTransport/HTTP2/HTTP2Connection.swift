import Foundation
import Logging
import NIOCore
import NIOHPACK
import NIOHTTP2
import NIOPosix
import NIOSSL
import PushCore
import Synchronization

/// One TLS + HTTP/2 connection to a provider (APNs, FCM). Requests on it are limited by its
/// ``StreamLimiter``; each has a deadline; a GOAWAY or a lost connection is reported per request as a
/// ``TransportError`` saying whether the peer may have processed it.
final class HTTP2Connection: Sendable {
    let id: Int
    let channel: any Channel
    let exchange: FrameExchange.Handle
    let limiter: StreamLimiter
    let observer: ConnectionObserver
    let authority: String
    /// Who answers ("APNs"), for logs and errors.
    let peer: String
    /// The provider's rule for request headers never to put in the HPACK dynamic table.
    let changesEveryRequest: @Sendable (String) -> Bool
    /// The pool's clock: how long the connection has been idle.
    let clock: any PushClock
    private let lastUsed: Mutex<ContinuousClock.Instant>
    /// Callers waiting on the PING in flight, if one is: an idle connection is checked once, not once
    /// per request that finds it idle (hundreds at a time after a quiet minute: a PING flood).
    private let pingWaiters = Mutex<[CheckedContinuation<Bool, Never>]?>(nil)
    private let retired = Mutex(false)

    private init(
        id: Int,
        channel: any Channel,
        exchange: FrameExchange.Handle,
        limiter: StreamLimiter,
        observer: ConnectionObserver,
        authority: String,
        peer: String,
        changesEveryRequest: @escaping @Sendable (String) -> Bool,
        clock: any PushClock
    ) {
        self.clock = clock
        self.lastUsed = Mutex(clock.now)
        self.id = id
        self.channel = channel
        self.exchange = exchange
        self.limiter = limiter
        self.observer = observer
        self.authority = authority
        self.peer = peer
        self.changesEveryRequest = changesEveryRequest
    }

    /// Whether new requests may use this connection.
    var isUsable: Bool { self.channel.isActive && !self.observer.isDraining }

    /// Opens a connection: TCP, TLS with ALPN `h2` (checked), then HTTP/2.
    static func connect(
        id: Int,
        peer: String,
        changesEveryRequest: @escaping @Sendable (String) -> Bool,
        host: String,
        port: Int,
        tls: NIOSSLContext,
        proxy: HTTPSProxy? = nil,
        clientCertificate: Bool = false,
        group: any EventLoopGroup,
        connectTimeout: Duration,
        clock: any PushClock,
        logger: Logger
    ) async throws -> HTTP2Connection {
        // Through a CONNECT proxy, TCP goes to the proxy and TLS (verified against `host`) runs in the tunnel.
        let tunnel = proxy.flatMap { $0.applies(to: host) ? $0 : nil }
        let limiter = StreamLimiter()
        let observer = ConnectionObserver(limiter: limiter) { event in
            switch event {
            case .goAway(let last, let code, let reason):
                logger.warning(
                    "\(peer) sent GOAWAY",
                    metadata: [
                        "push.connection": "\(id)", "push.last_stream_id": "\(last)", "push.error_code": "\(code)",
                        "push.reason": "\(reason ?? "-")",
                    ]
                )
            case .maxConcurrentStreams(let value):
                logger.debug(
                    "\(peer) stream limit",
                    metadata: ["push.connection": "\(id)", "push.max_streams": "\(value)"]
                )
            case .closed:
                logger.debug("\(peer) connection closed", metadata: ["push.connection": "\(id)"])
            case .error(let description):
                logger.warning(
                    "\(peer) connection error",
                    metadata: ["push.connection": "\(id)", "push.error": "\(description)"]
                )
            }
        }
        let isIPAddress = (try? SocketAddress(ipAddress: host, port: port)) != nil
        if isIPAddress, let tunnel {
            // TLS checks an IP address against the peer's address, which in a tunnel is the proxy's.
            throw TransportError(
                code: .connectFailed,
                mayHaveBeenProcessed: false,
                message:
                    "\(peer) endpoint \(host) is an IP address, and through proxy \(tunnel) TLS could not verify it: use the endpoint's host name, or add \(host) to NO_PROXY"
            )
        }
        let bootstrap = ClientBootstrap(group: group)
            .connectTimeout(.nanoseconds(connectTimeout.nanoseconds))
            .channelOption(ChannelOptions.socketOption(.tcp_nodelay), value: 1)
        let alpn = group.any().makePromise(of: String?.self)
        let channel: any Channel
        let exchange: FrameExchange.Handle
        do {
            (channel, exchange) = try await bootstrap.connect(
                host: tunnel?.host ?? host,
                port: tunnel?.port ?? port
            ) { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    if let tunnel {
                        try sync.addHandler(
                            ProxyConnectHandler(
                                proxy: tunnel,
                                targetHost: host,
                                targetPort: port,
                                deadline: .nanoseconds(connectTimeout.nanoseconds)
                            )
                        )
                    }
                    try sync.addHandler(NIOSSLClientHandler(context: tls, serverHostname: isIPAddress ? nil : host))
                    try sync.addHandler(ALPNObserver(promise: alpn))
                    try sync.addHandler(FlushCoalescer())
                    // Raw frames: one handler answers every stream of the connection (no stream channels).
                    try sync.addHandler(
                        NIOHTTP2Handler(
                            mode: .client,
                            initialSettings: [
                                HTTP2Setting(parameter: .maxConcurrentStreams, value: 100),
                                HTTP2Setting(parameter: .initialWindowSize, value: 1 << 20),
                                HTTP2Setting(parameter: .enablePush, value: 0),
                            ],
                            // Our request headers are built from values the schema and RequestBuilder have
                            // checked (hex tokens, bundle ids, no control characters): NIO's per-character
                            // validation of every header of every request and answer was 2 % of the worker.
                            headerBlockValidation: .disabled
                        )
                    )
                    try sync.addHandler(observer)
                    let exchange = FrameExchange(peer: peer)
                    try sync.addHandler(exchange)
                    return (channel, FrameExchange.Handle(exchange, eventLoop: channel.eventLoop))
                }
            }
        } catch {
            // The connection never came up: settle the ALPN promise (NIO traps on an abandoned promise).
            alpn.fail(error)
            throw error
        }
        // One deadline from TCP to ALPN: a proxy that answers CONNECT and then stalls, or a TLS peer that
        // never finishes the handshake, fails the connect instead of hanging it.
        let handshakeTimer = channel.eventLoop.scheduleTask(in: .nanoseconds(connectTimeout.nanoseconds)) {
            alpn.fail(
                TransportError(
                    code: .connectFailed,
                    mayHaveBeenProcessed: false,
                    message: "no TLS handshake with \(host):\(port) within \(connectTimeout)"
                )
            )
            channel.close(promise: nil)
        }
        defer { handshakeTimer.cancel() }
        let negotiated: String?
        do {
            negotiated = try await alpn.futureResult.get()
        } catch let timeout as TransportError {
            try? await channel.close()
            throw timeout
        } catch let refusal as ProxyRefusal {
            try? await channel.close()
            throw TransportError(code: .connectFailed, mayHaveBeenProcessed: false, message: "\(refusal)")
        } catch {
            try? await channel.close()
            // The server refused our client certificate (an alert about it): the credential is at fault, not
            // the network. Expired, revoked or from the wrong CA: pause it like a refused key.
            let text = "\(error)".uppercased()
            if clientCertificate && text.contains("ALERT")
                && (text.contains("CERTIFICATE") || text.contains("UNKNOWN_CA") || text.contains("HANDSHAKE_FAILURE"))
            {
                throw TransportError(
                    code: .invalidKey,
                    mayHaveBeenProcessed: false,
                    message:
                        "\(peer) refused the TLS client certificate (\(error)): it may have expired or been revoked, or be for the other environment; `push-worker check-keys --config …` shows its expiry"
                )
            }
            throw TransportError(
                code: .connectFailed,
                mayHaveBeenProcessed: false,
                message:
                    "TLS handshake with \(host):\(port) failed: \(error). Check --apns-ca-file for a private endpoint; TLS verification is never switched off"
            )
        }
        guard negotiated == "h2" else {
            try? await channel.close()
            throw TransportError(
                code: .protocolNotNegotiated,
                mayHaveBeenProcessed: false,
                message:
                    "\(host):\(port) did not negotiate HTTP/2 (ALPN gave \(negotiated ?? "nothing")): point the endpoint at an HTTP/2 server (\(peer) speaks only HTTP/2)"
            )
        }
        let authority = port == 443 ? host : "\(host):\(port)"
        let connection = HTTP2Connection(
            id: id,
            channel: channel,
            exchange: exchange,
            limiter: limiter,
            observer: observer,
            authority: authority,
            peer: peer,
            changesEveryRequest: changesEveryRequest,
            clock: clock
        )
        // Batch requests give their slots back from the event loop. The hook holds the connection until the
        // channel closes (the handler then drops it), so a retired connection still closes once idle. The
        // handshake deadline is over: it must not close the channel while the hook is set.
        handshakeTimer.cancel()
        try? await channel.eventLoop.submit {
            guard channel.isActive else { return }
            exchange.exchange.value.slotsReleased = { count in connection.batchSlotsReleased(count) }
        }.get()
        return connection
    }

    /// Sends PING and waits for the ack: whether an idle connection can still be trusted.
    func ping(timeout: Duration) async -> Bool {
        let data = UInt64.random(in: 1...UInt64.max)
        let frame = HTTP2Frame(streamID: .rootStream, payload: .ping(HTTP2PingData(withInteger: data), ack: false))
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask { await self.observer.awaitPingAck(data) }
            group.addTask {
                try? await Task.sleep(for: timeout)
                self.observer.cancelPing(data)
                return false
            }
            self.channel.writeAndFlush(frame, promise: nil)
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
    }

    /// How long the connection has been idle.
    var idleFor: Duration {
        self.limiter.inFlight > 0 ? .zero : self.clock.now - self.lastUsed.withLock { $0 }
    }

    /// Whether the connection can be trusted after being idle longer than `idleAfter`: one PING for
    /// all callers; a success counts as use, so the next callers do not PING again.
    func verifiedIfIdle(after idleAfter: Duration, timeout: Duration) async -> Bool {
        guard self.idleFor > idleAfter else { return true }
        let first = self.pingWaiters.withLock { waiters -> Bool in
            if waiters == nil {
                waiters = []
                return true
            }
            return false
        }
        guard first else {
            return await withCheckedContinuation { continuation in
                let resumeNow = self.pingWaiters.withLock { waiters -> Bool in
                    guard waiters != nil else { return true }
                    waiters!.append(continuation)
                    return false
                }
                // The PING finished meanwhile and counted as use (or failed and the pool replaces the
                // connection): check the idle time again.
                if resumeNow { continuation.resume(returning: self.idleFor <= idleAfter) }
            }
        }
        let answered = await self.ping(timeout: timeout)
        if answered { self.touch(self.clock.now) }
        let waiters = self.pingWaiters.withLock { waiters in
            defer { waiters = nil }
            return waiters ?? []
        }
        for waiter in waiters { waiter.resume(returning: answered) }
        return answered
    }

    func touch(_ instant: ContinuousClock.Instant) {
        self.lastUsed.withLock { $0 = instant }
    }

    /// Takes the connection out of service: it closes as soon as its in-flight requests finish (now, if
    /// none), so a GOAWAY's processed streams still get their answers.
    func retire() {
        self.retired.withLock { $0 = true }
        self.closeIfRetiredAndIdle()
    }

    func closeIfRetiredAndIdle() {
        if self.retired.withLock({ $0 }) && self.limiter.inFlight == 0 {
            self.limiter.close()
            self.channel.close(promise: nil)
        }
    }

    func close() async {
        self.limiter.close()
        try? await self.channel.close()
    }
}
