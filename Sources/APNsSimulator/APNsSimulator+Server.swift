import NIOCore
import NIOHTTP2
import NIOPosix
import NIOSSL

extension APNsSimulator {
    typealias Stream = NIOAsyncChannel<HTTP2Frame.FramePayload, HTTP2Frame.FramePayload>
    typealias Connection = (channel: any Channel, multiplexer: NIOHTTP2Handler.AsyncStreamMultiplexer<Stream>)

    func bind(group: any EventLoopGroup) async throws -> NIOAsyncChannel<Connection, Never> {
        var tls = TLSConfiguration.makeServerConfiguration(
            certificateChain: [.certificate(self.certificates.serverCertificate)],
            privateKey: .privateKey(self.certificates.serverKey)
        )
        tls.applicationProtocols = ["h2"]
        tls.minimumTLSVersion = .tlsv12
        // Certificate-based trust: a client may present a provider certificate issued by this simulator's CA
        // (``APNsSimulator/issueProviderCertificate(bundleID:kind:validFor:)``); one from another CA fails the
        // handshake, as Apple's does.
        tls.certificateVerification = .optionalVerification
        tls.trustRoots = .certificates([self.certificates.caCertificate])
        let sslContext = try NIOSSLContext(configuration: tls)
        let initialStreams = self.configuration.fastMode ? self.configuration.authenticatedMaxStreams : 1
        return try await ServerBootstrap(group: group)
            .serverChannelOption(ChannelOptions.backlog, value: 256)
            .serverChannelOption(ChannelOptions.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(ChannelOptions.socketOption(.tcp_nodelay), value: 1)
            .bind(host: self.configuration.host, port: self.configuration.port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    try sync.addHandler(NIOSSLServerHandler(context: sslContext))
                    var configuration = NIOHTTP2Handler.Configuration()
                    configuration.connection.initialSettings = [
                        HTTP2Setting(parameter: .maxConcurrentStreams, value: initialStreams),
                        HTTP2Setting(parameter: .initialWindowSize, value: 1 << 20),
                        HTTP2Setting(parameter: .maxHeaderListSize, value: 8_192),
                    ]
                    configuration.stream.targetWindowSize = 1 << 20
                    let multiplexer = try sync.configureAsyncHTTP2Pipeline(mode: .server, configuration: configuration)
                    { stream in
                        // Runs as the HEADERS that opens the stream is read, in the connection's frame order.
                        // Only under a GOAWAY fault plan, which reads (and removes) the entry.
                        if self.configuration.faults.goAwayEvery != nil, let parent = stream.parent,
                            let id = try? stream.syncOptions?.getOption(HTTP2StreamChannelOptions.streamID)
                        {
                            let key = SimulatorState.StreamKey(connection: ObjectIdentifier(parent), stream: Int(id))
                            let now = ContinuousClock.now
                            self.state.withLock { $0.streamReadAt[key] = now }
                        }
                        return stream.eventLoop.makeCompletedFuture { try Stream(wrappingChannelSynchronously: stream) }
                    }
                    return (channel, multiplexer)
                }
            }
    }

    func serve(_ server: NIOAsyncChannel<Connection, Never>) async throws {
        try await server.executeThenClose { connections in
            await withDiscardingTaskGroup { group in
                do {
                    for try await connection in connections {
                        group.addTask { await self.serveConnection(connection) }
                    }
                } catch {
                    self.logger.debug("simulator stopped accepting", metadata: ["push.error": "\(error)"])
                }
            }
        }
    }

    func serveConnection(_ connection: Connection) async {
        let id = self.state.withLock { state -> Int in
            state.connectionCount += 1
            state.connections[state.connectionCount] = connection.channel
            return state.connectionCount
        }
        defer {
            let now = self.configuration.now()
            let channel = ObjectIdentifier(connection.channel)
            self.state.withLock {
                _ = $0.connections.removeValue(forKey: id)
                _ = $0.clientCertificates.removeValue(forKey: id)
                // Streams reset or cut before their request was read leave their read time behind.
                if !$0.streamReadAt.isEmpty {
                    $0.streamReadAt = $0.streamReadAt.filter { $0.key.connection != channel }
                }
                if $0.requestsPerConnection.removeValue(forKey: id) == nil, !self.configuration.fastMode {
                    $0.idleCloses.append(now)
                }
            }
        }
        // Connect/disconnect churn: past the limit, a new connection is refused at once.
        if let limit = self.configuration.idleConnectionLimit, !self.configuration.fastMode {
            let now = self.configuration.now()
            let refused = self.state.withLock { state -> Bool in
                state.idleCloses.removeAll { now.timeIntervalSince($0) >= limit.window }
                guard state.idleCloses.count >= limit.count else { return false }
                state.faults.churnRefusals += 1
                // A refused connection is no churn of its own: count it as having had its say.
                state.requestsPerConnection[id] = 0
                return true
            }
            if refused {
                let frame = HTTP2Frame(
                    streamID: .rootStream,
                    payload: .goAway(
                        lastStreamID: .rootStream,
                        errorCode: .enhanceYourCalm,
                        opaqueData: ByteBuffer(string: #"{"reason":"TooManyConnections"}"#)
                    )
                )
                try? await connection.channel.writeAndFlush(frame)
                try? await connection.channel.close()
                return
            }
        }
        await withDiscardingTaskGroup { group in
            do {
                for try await stream in connection.multiplexer.inbound {
                    group.addTask { await self.serveStream(stream, connectionID: id, connection: connection.channel) }
                }
            } catch {
                self.logger.debug(
                    "simulator connection ended",
                    metadata: ["push.connection": "\(id)", "push.error": "\(error)"]
                )
            }
        }
    }

    /// A rejected provider token: the connection is back to one stream until a request succeeds again.
    func deauthenticate(connectionID: Int, channel: any Channel) {
        let was = self.state.withLock { state -> Bool in
            guard state.authenticatedConnections.remove(connectionID) != nil else { return false }
            state.faults.streamLimitDrops += 1
            return true
        }
        guard was, !self.configuration.fastMode else { return }
        let frame = HTTP2Frame(
            streamID: .rootStream,
            payload: .settings(.settings([HTTP2Setting(parameter: .maxConcurrentStreams, value: 1)]))
        )
        channel.writeAndFlush(frame, promise: nil)
    }

    /// After the first success with a valid token on a connection, raise its stream limit (once).
    func authenticate(connectionID: Int, channel: any Channel) {
        let first = self.state.withLock { $0.authenticatedConnections.insert(connectionID).inserted }
        guard first, !self.configuration.fastMode else { return }
        let value = self.state.withLock { $0.announcedMaxStreams } ?? self.configuration.authenticatedMaxStreams
        let frame = HTTP2Frame(
            streamID: .rootStream,
            payload: .settings(.settings([HTTP2Setting(parameter: .maxConcurrentStreams, value: value)]))
        )
        channel.writeAndFlush(frame, promise: nil)
    }
}
