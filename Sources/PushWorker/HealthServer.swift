public import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
public import ServiceLifecycle
import Synchronization

/// A small HTTP/1.1 server for probes and scraping: `GET /healthz` (the process is alive), `GET /readyz`
/// (the worker reached Postgres recently and is not draining), `GET /metrics` (Prometheus text).
public struct HealthServer: Sendable {
    /// Where to listen.
    public var host: String
    /// The port; 0 picks a free one (the bound port is passed to `onListening`).
    public var port: Int
    let isReady: @Sendable () -> Bool
    let metrics: @Sendable () -> [UInt8]
    let logger: Logger

    /// - Parameters:
    ///   - isReady: the readiness probe's answer.
    ///   - metrics: the Prometheus exposition text.
    public init(
        host: String,
        port: Int,
        isReady: @escaping @Sendable () -> Bool,
        metrics: @escaping @Sendable () -> [UInt8],
        logger: Logger
    ) {
        self.host = host
        self.port = port
        self.isReady = isReady
        self.metrics = metrics
        self.logger = logger
    }

    /// At most this many connections at once; more are closed at accept (probes and a scraper need a few).
    static let maximumConnections = 32
    /// A connection silent this long is closed.
    static let idleTimeout = TimeAmount.seconds(10)
    /// No connection lives longer than this, however it trickles (slowloris).
    static let connectionLifetime = TimeAmount.seconds(30)

    /// Serves until the task is cancelled.
    public func run(onListening: @Sendable (Int) -> Void = { _ in }) async throws {
        let open = OpenConnections()
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(ChannelOptions.socketOption(.so_reuseaddr), value: 1)
            .serverChannelOption(ChannelOptions.backlog, value: 64)
            .bind(host: self.host, port: self.port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(IdleStateHandler(allTimeout: Self.idleTimeout))
                    try channel.pipeline.syncOperations.addHandler(CloseWhenIdle())
                    channel.eventLoop.scheduleTask(in: Self.connectionLifetime) { channel.close(promise: nil) }
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                    return try NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>(
                        wrappingChannelSynchronously: channel
                    )
                }
            }
        onListening(server.channel.localAddress?.port ?? self.port)
        try await withTaskCancellationHandler {
            try await server.executeThenClose { connections in
                try await withThrowingDiscardingTaskGroup { group in
                    for try await connection in connections {
                        guard open.count.add(1, ordering: .relaxed).newValue <= Self.maximumConnections else {
                            open.count.subtract(1, ordering: .relaxed)
                            try? await connection.channel.close()
                            continue
                        }
                        group.addTask {
                            defer { open.count.subtract(1, ordering: .relaxed) }
                            try? await self.serve(connection)
                        }
                    }
                }
            }
        } onCancel: {
            server.channel.close(promise: nil)
        }
    }

    private func serve(_ connection: NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>) async throws {
        try await connection.executeThenClose { inbound, outbound in
            for try await part in inbound {
                guard case .head(let request) = part else { continue }
                let (status, body, type): (HTTPResponseStatus, [UInt8], String)
                switch (request.method, request.uri.split(separator: "?").first.map(String.init) ?? request.uri) {
                case (.GET, "/healthz"): (status, body, type) = (.ok, Array("ok\n".utf8), "text/plain")
                case (.GET, "/readyz"):
                    (status, body, type) =
                        self.isReady()
                        ? (.ok, Array("ready\n".utf8), "text/plain")
                        : (.serviceUnavailable, Array("not ready\n".utf8), "text/plain")
                case (.GET, "/metrics"): (status, body, type) = (.ok, self.metrics(), "text/plain; version=0.0.4")
                default:
                    (status, body, type) = (.notFound, Array("try /healthz, /readyz or /metrics\n".utf8), "text/plain")
                }
                var headers = HTTPHeaders([("content-type", type), ("content-length", String(body.count))])
                if !request.isKeepAlive { headers.add(name: "connection", value: "close") }
                try await outbound.write(
                    .head(HTTPResponseHead(version: request.version, status: status, headers: headers))
                )
                try await outbound.write(.body(.byteBuffer(ByteBuffer(bytes: body))))
                try await outbound.write(.end(nil))
                if !request.isKeepAlive { return }
            }
        }
    }
}

extension HealthServer {
    /// The server as a service of the group: it answers until the group shuts it down (after the
    /// worker has drained, so `/readyz` says "draining" meanwhile).
    public func service(onListening: @escaping @Sendable (Int) -> Void) -> some Service {
        HealthService(server: self, onListening: onListening)
    }
}

/// ``HealthServer`` in a service group.
struct HealthService: Service {
    let server: HealthServer
    let onListening: @Sendable (Int) -> Void

    func run() async throws {
        let (server, onListening) = (self.server, self.onListening)
        do {
            try await cancelWhenGracefulShutdown { try await server.run(onListening: onListening) }
        } catch is CancellationError {
        } catch {
            server.logger.error(
                "could not serve metrics and health: \(error); use --metrics-port to pick another port or --no-metrics"
            )
            throw error
        }
    }
}

/// Closes a connection when ``IdleStateHandler`` reports it idle.
private final class CloseWhenIdle: ChannelInboundHandler, Sendable {
    typealias InboundIn = NIOAny

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is IdleStateHandler.IdleStateEvent {
            context.close(promise: nil)
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }
}

/// How many connections the health server has open (shared with each connection's task).
private final class OpenConnections: Sendable {
    let count = Atomic<Int>(0)
}
