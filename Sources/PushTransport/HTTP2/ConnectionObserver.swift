import NIOCore
import NIOHTTP2
import NIOSSL
import NIOTLS
import Synchronization

/// Watches one APNs connection from inside its pipeline: the negotiated ALPN protocol, the peer's
/// SETTINGS (max concurrent streams), PING acks, GOAWAY, and the connection closing.
final class ConnectionObserver: ChannelInboundHandler, Sendable {
    typealias InboundIn = HTTP2Frame

    struct State {
        var goAwayLastStreamID: HTTP2StreamID?
        var goAwayReason: String?
        var pingWaiters: [UInt64: CheckedContinuation<Bool, Never>] = [:]
        var closed = false
    }

    let limiter: StreamLimiter
    let onEvent: @Sendable (ConnectionEvent) -> Void
    private let state = Mutex(State())

    init(limiter: StreamLimiter, onEvent: @escaping @Sendable (ConnectionEvent) -> Void) {
        self.limiter = limiter
        self.onEvent = onEvent
    }

    /// The last stream id APNs processed, once it sent GOAWAY.
    var goAwayLastStreamID: HTTP2StreamID? { self.state.withLock { $0.goAwayLastStreamID } }
    /// Whether GOAWAY arrived or the connection closed: no new requests go here.
    var isDraining: Bool { self.state.withLock { $0.goAwayLastStreamID != nil || $0.closed } }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = self.unwrapInboundIn(data)
        switch frame.payload {
        case .settings(.settings(let settings)):
            for setting in settings where setting.parameter == .maxConcurrentStreams {
                self.limiter.updatePeerMaxStreams(setting.value)
                self.onEvent(.maxConcurrentStreams(setting.value))
            }
        case .goAway(let lastStreamID, let errorCode, let opaqueData):
            let reason = opaqueData.map { String(buffer: $0) }
            self.state.withLock {
                $0.goAwayLastStreamID = lastStreamID
                $0.goAwayReason = reason
            }
            self.limiter.close()
            self.onEvent(.goAway(lastStreamID: Int(lastStreamID), errorCode: "\(errorCode)", reason: reason))
        case .ping(let data, ack: true):
            let waiter = self.state.withLock { $0.pingWaiters.removeValue(forKey: data.integer) }
            waiter?.resume(returning: true)
        default:
            break
        }
        context.fireChannelRead(data)
    }

    func channelInactive(context: ChannelHandlerContext) {
        let waiters = self.state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            state.closed = true
            defer { state.pingWaiters.removeAll() }
            return Array(state.pingWaiters.values)
        }
        for waiter in waiters { waiter.resume(returning: false) }
        self.limiter.close()
        self.onEvent(.closed)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // Stream-level errors surface here too; the HTTP/2 handler closes the connection itself when the
        // error is fatal to it, so only report.
        self.onEvent(.error("\(error)"))
        context.fireErrorCaught(error)
    }

    /// Registers a PING and returns whether its ack arrived; the caller writes the frame.
    func awaitPingAck(_ data: UInt64) async -> Bool {
        await withCheckedContinuation { continuation in
            let closed = self.state.withLock { state -> Bool in
                if state.closed { return true }
                state.pingWaiters[data] = continuation
                return false
            }
            if closed { continuation.resume(returning: false) }
        }
    }

    /// Drops a PING waiter that timed out.
    func cancelPing(_ data: UInt64) {
        let waiter = self.state.withLock { $0.pingWaiters.removeValue(forKey: data) }
        waiter?.resume(returning: false)
    }
}

/// What a connection reports to its owner's log.
enum ConnectionEvent: Sendable {
    case maxConcurrentStreams(Int)
    case goAway(lastStreamID: Int, errorCode: String, reason: String?)
    case closed
    case error(String)
}

/// Captures the ALPN protocol the TLS handshake negotiated.
final class ALPNObserver: ChannelInboundHandler, Sendable {
    typealias InboundIn = NIOAny
    let promise: EventLoopPromise<String?>

    init(promise: EventLoopPromise<String?>) { self.promise = promise }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case TLSUserEvent.handshakeCompleted(let negotiated) = event {
            self.promise.succeed(negotiated)
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.promise.fail(ChannelError.ioOnClosedChannel)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        self.promise.fail(error)
        context.fireErrorCaught(error)
    }
}
