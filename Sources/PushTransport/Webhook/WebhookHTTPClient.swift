import Foundation
public import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
public import PushCore
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// POSTs webhook deliveries over HTTP/1.1 (TLS for `https://`), one connection per POST, and trusts the
/// receiver with nothing: the host is resolved here and every address it gives is checked (a loopback,
/// private or link-local one refuses the POST unless `allowPrivate`), the connection goes to the checked
/// address (no second lookup to rebind), a redirect is an answer (never followed), and the whole exchange
/// has one deadline. Only the status and a few headers are read; the body is cut at 512 bytes.
///
/// An https:// receiver is reached through the HTTP CONNECT proxy (`--https-proxy`, `HTTPS_PROXY`) unless
/// `NO_PROXY` names it; the host is still resolved and checked here, and the tunnel is asked for the checked
/// address (`CONNECT 203.0.113.7:443`), never the name: the proxy's own lookup cannot lead the POST into the
/// network it sits in. TLS runs inside the tunnel, verified against the host name (an https:// hook given as
/// an IP address cannot be verified through a tunnel, and is refused). Plain http:// receivers connect
/// directly, as curl treats `HTTPS_PROXY`.
public struct WebhookHTTPClient: Sendable {
    /// The receiver's answer.
    public struct Answer: Sendable, Hashable {
        public var status: Int
        public var retryAfter: String?
        public var location: String?
        /// The start of the body, printable ASCII only, for the delivery's `last_error`.
        public var bodyPrefix: String
    }

    /// Why no answer came.
    public struct Failure: Error, Sendable, CustomStringConvertible {
        public enum Kind: Sendable { case refusedAddress, badURL, resolve, connect, timeout, tls, closed }
        public var kind: Kind
        public var description: String
    }

    let group: any EventLoopGroup
    let allowPrivate: Bool
    let timeout: Duration
    /// The process's clock: each POST's deadline.
    let clock: any PushClock
    let tls: NIOSSLContext
    let proxy: HTTPSProxy?
    /// Host lookups (getaddrinfo blocks a thread for as long as the resolver takes): a pool of their own, so a
    /// hook whose name server never answers holds only lookups, never another hook's connection or NIO's
    /// shared pool. Lookups still queued when their POST's deadline passed are skipped.
    let resolver: NIOThreadPool
    /// Lookups under way, by `host:port`: POSTs to one host share one lookup, so a host whose name server
    /// hangs holds one resolver thread, not one per POST.
    let lookups = LookupTable()

    /// - Parameters:
    ///   - allowPrivate: reach loopback and private addresses (`--webhooks-allow-private`).
    ///   - caFile: a PEM file of extra roots to trust (a receiver with a private CA); the system's are kept.
    ///   - timeout: connect, TLS, request and answer together.
    ///   - proxy: the CONNECT proxy to reach receivers through (hosts its `NO_PROXY` names connect directly).
    public init(
        group: any EventLoopGroup,
        allowPrivate: Bool,
        caFile: String? = nil,
        timeout: Duration = .seconds(10),
        proxy: HTTPSProxy? = nil,
        clock: any PushClock
    ) throws {
        self.clock = clock
        self.group = group
        self.allowPrivate = allowPrivate
        self.timeout = timeout
        self.proxy = proxy
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.minimumTLSVersion = .tlsv12
        configuration.applicationProtocols = ["http/1.1"]
        if let caFile {
            do {
                configuration.additionalTrustRoots = [.certificates(try NIOSSLCertificate.fromPEMFile(caFile))]
            } catch {
                throw Failure(
                    kind: .tls,
                    description: "--webhooks-ca-file \(caFile) is not a readable PEM certificate file: \(error)"
                )
            }
        }
        self.tls = try NIOSSLContext(configuration: configuration)
        self.resolver = NIOThreadPool(numberOfThreads: 8)
        self.resolver.start()
    }

    /// The parts of a hook's URL a POST needs.
    public struct Target: Sendable, Hashable, CustomStringConvertible {
        public var secure: Bool
        public var host: String
        public var port: Int
        /// Path and query, as sent.
        public var pathAndQuery: String

        /// `scheme://host:port/path`, without the query (which may carry a receiver's token).
        public var description: String {
            let path = self.pathAndQuery.split(separator: "?", maxSplits: 1).first.map(String.init) ?? "/"
            return
                "\(self.secure ? "https" : "http")://\(self.host.contains(":") ? "[\(self.host)]" : self.host):\(self.port)\(path)"
        }

        public init(url: String) throws(Failure) {
            guard let parsed = URLComponents(string: url), let scheme = parsed.scheme?.lowercased(),
                scheme == "http" || scheme == "https", var host = parsed.host, !host.isEmpty
            else {
                throw Failure(
                    kind: .badURL,
                    description: "the hook's URL is not an http:// or https:// URL with a host"
                )
            }
            if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
            guard parsed.user == nil, parsed.password == nil else {
                throw Failure(
                    kind: .badURL,
                    description: "the hook's URL carries a user or password: put a secret in --secret-file, not the URL"
                )
            }
            self.secure = scheme == "https"
            self.host = host
            self.port = parsed.port ?? (self.secure ? 443 : 80)
            let path = parsed.percentEncodedPath.isEmpty ? "/" : parsed.percentEncodedPath
            self.pathAndQuery = path + (parsed.percentEncodedQuery.map { "?" + $0 } ?? "")
        }
    }

    /// POSTs `body` to `url` with `headers` (plus Host, Content-Type, Content-Length, Connection: close).
    public func post(url: String, headers: [(String, String)], body: [UInt8]) async throws(Failure) -> Answer {
        let target = try Target(url: url)
        let deadline = self.clock.now + self.timeout
        let addresses = try await self.resolve(target, deadline: deadline)
        let tls = target.secure ? self.tls : nil
        let serverName = IPAddressLiteral.isLiteral(target.host) ? nil : target.host
        // As curl reads HTTPS_PROXY: for https:// receivers (a plain http:// one connects directly).
        let tunnel = target.secure ? self.proxy.flatMap { $0.applies(to: target.host) ? $0 : nil } : nil
        var proxyAddresses: [SocketAddress?] = [nil]
        if let tunnel {
            guard serverName != nil else {
                // TLS checks an IP address against the peer's address, which in a tunnel is the proxy's.
                throw Failure(
                    kind: .tls,
                    description:
                        "\(target) is an IP address, and through proxy \(tunnel) TLS could not verify it: give the hook the receiver's host name, or add \(target.host) to NO_PROXY"
                )
            }
            // Looked up here, once (not by NIO's Happy Eyeballs, which would try several connections at once).
            do {
                proxyAddresses = try await self.lookupShared(host: tunnel.host, port: tunnel.port, deadline: deadline)
            } catch {
                throw Failure(kind: .connect, description: "proxy \(tunnel): \(error.description)")
            }
        }
        // Each checked address in turn (a dead AAAA record must not fail every delivery), through each of the
        // proxy's addresses when there is one, within the deadline; each connection its own promises, so a failed
        // one never answers for the next.
        let attempts = addresses.flatMap { address in proxyAddresses.map { (address, $0) } }
        var connected: (channel: any Channel, promise: EventLoopPromise<Answer>)?
        var lastError: (any Error)?
        for (index, (address, proxyAddress)) in attempts.enumerated() where self.clock.now < deadline {
            let promise = self.group.next().makePromise(of: Answer.self)
            // An address that drops the SYN must leave time for the next: each gets its share of what is left
            // (at least a second), the last all of it.
            let remaining = TimeAmount(deadline - self.clock.now)
            let left = Int64(attempts.count - index)
            let share = max(
                min(remaining, max(TimeAmount.nanoseconds(remaining.nanoseconds / left), .seconds(1))),
                .milliseconds(1)
            )
            let tunnelUp = tunnel.map { _ in self.group.next().makePromise(of: Void.self) }
            do {
                let channel = try await ClientBootstrap(group: self.group)
                    .connectTimeout(share)
                    .channelInitializer { channel in
                        channel.eventLoop.makeCompletedFuture {
                            if let tunnel, let tunnelUp {
                                try channel.pipeline.syncOperations.addHandler(
                                    ProxyConnectHandler(
                                        proxy: tunnel,
                                        targetHost: address.ipAddress ?? target.host,
                                        targetPort: target.port,
                                        deadline: share,
                                        tunnelUp: tunnelUp
                                    )
                                )
                            }
                            if let tls {
                                try channel.pipeline.syncOperations.addHandler(
                                    try NIOSSLClientHandler(context: tls, serverHostname: serverName)
                                )
                            }
                            try channel.pipeline.syncOperations.addHTTPClientHandlers()
                            try channel.pipeline.syncOperations.addHandler(AnswerCollector(promise: promise))
                        }
                    }
                    .connect(to: proxyAddress ?? address).get()
                if let tunnel, let tunnelUp {
                    // The tunnel before anything else (the proxy's answer is bounded by the POST's deadline too);
                    // an address the proxy cannot reach leaves time for the next.
                    let timer = channel.eventLoop.scheduleTask(in: TimeAmount(deadline - self.clock.now)) {
                        tunnelUp.fail(
                            Failure(kind: .timeout, description: "no tunnel through \(tunnel) within \(self.timeout)")
                        )
                    }
                    defer { timer.cancel() }
                    do {
                        try await tunnelUp.futureResult.get()
                    } catch {
                        channel.close(promise: nil)
                        throw error
                    }
                }
                connected = (channel, promise)
                break
            } catch {
                tunnelUp?.fail(error)
                promise.fail(error)
                lastError = error
            }
        }
        guard let (channel, promise) = connected else {
            let through = tunnel.map { " through proxy \($0)" } ?? ""
            throw Failure(
                kind: .connect,
                description:
                    "could not connect to \(target)\(through): \(lastError.map { "\($0)" } ?? "no time left")"
            )
        }
        let timer = channel.eventLoop.scheduleTask(in: TimeAmount(deadline - self.clock.now)) {
            promise.fail(Failure(kind: .timeout, description: "no answer from \(target) within \(self.timeout)"))
            channel.close(promise: nil)
        }
        var head = HTTPRequestHead(version: .http1_1, method: .POST, uri: target.pathAndQuery)
        let hostHeader = target.host.contains(":") ? "[\(target.host)]" : target.host
        let defaultPort = target.secure ? 443 : 80
        head.headers.add(name: "Host", value: target.port == defaultPort ? hostHeader : "\(hostHeader):\(target.port)")
        head.headers.add(name: "Content-Type", value: "application/json")
        head.headers.add(name: "Content-Length", value: "\(body.count)")
        head.headers.add(name: "Connection", value: "close")
        for (name, value) in headers { head.headers.add(name: name, value: value) }
        channel.write(HTTPClientRequestPart.head(head), promise: nil)
        channel.write(HTTPClientRequestPart.body(.byteBuffer(ByteBuffer(bytes: body))), promise: nil)
        channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
        defer {
            timer.cancel()
            channel.close(promise: nil)
        }
        do {
            return try await promise.futureResult.get()
        } catch let failure as Failure {
            throw failure
        } catch let error as NIOSSLError {
            throw Failure(kind: .tls, description: "TLS with \(target) failed: \(error)")
        } catch {
            throw Failure(kind: .closed, description: "\(target) closed the connection without an answer: \(error)")
        }
    }

    /// The addresses to connect to, in the order the system gives, once every one the host resolves to
    /// passed the check (one bad address refuses them all: a name that mixes public and private addresses is
    /// not to be trusted). An IP address literal is not looked up.
    func resolve(_ target: Target, deadline: ContinuousClock.Instant) async throws(Failure) -> [SocketAddress] {
        let host = target.host
        let port = target.port
        let addresses = try await self.lookupShared(host: host, port: port, deadline: deadline)
        if !self.allowPrivate {
            for address in addresses {
                if let range = Self.privateRange(of: address) {
                    throw Failure(
                        kind: .refusedAddress,
                        description:
                            "\(host) resolves to \(address.ipAddress ?? "?"), a \(range) address: refused, so that a row cannot make the worker call into its own network. Point the hook at a public address, or run the workers with --webhooks-allow-private if this receiver is meant to be inside."
                    )
                }
            }
        }
        return addresses
    }

    /// getaddrinfo on the resolver pool, one lookup per `host:port` at a time shared by its callers, bounded by
    /// `deadline` (a late answer is dropped, a lookup dequeued past it is not made); never empty. An IP literal is
    /// its address.
    func lookupShared(
        host: String,
        port: Int,
        deadline: ContinuousClock.Instant
    ) async throws(Failure) -> [SocketAddress] {
        if let literal = try? SocketAddress(ipAddress: host, port: port) { return [literal] }
        // The lookup blocks a resolver thread for as long as the resolver takes: the POST's deadline
        // bounds the wait for it (a late answer is dropped), and a lookup dequeued past it is not made.
        let loop = self.group.next()
        let looked = loop.makePromise(of: [SocketAddress].self)
        let timeout = self.timeout
        let clock = self.clock
        let key = "\(host):\(port)"
        let shared = self.lookups.futures.withLock { futures -> EventLoopFuture<[SocketAddress]> in
            if let running = futures[key] { return running }
            let started = self.resolver.runIfActive(eventLoop: loop) {
                guard clock.now < deadline else {
                    throw Failure(kind: .timeout, description: "could not resolve \(host) within \(timeout)")
                }
                return try Self.lookup(host: host, port: port)
            }
            futures[key] = started
            return started
        }
        shared.whenComplete { [lookups = self.lookups] _ in
            lookups.futures.withLock { futures in
                if futures[key] === shared { futures[key] = nil }
            }
        }
        shared.cascade(to: looked)
        let timer = loop.scheduleTask(in: TimeAmount(deadline - self.clock.now)) {
            looked.fail(Failure(kind: .timeout, description: "could not resolve \(host) within \(timeout)"))
        }
        defer { timer.cancel() }
        let addresses: [SocketAddress]
        do {
            addresses = try await looked.futureResult.get()
        } catch let failure as Failure {
            throw failure
        } catch {
            throw Failure(kind: .resolve, description: "could not resolve \(host): \(error)")
        }
        guard !addresses.isEmpty else {
            throw Failure(kind: .resolve, description: "\(host) resolves to no address")
        }
        return addresses
    }

    /// Why `address` is not public, or `nil` when it is.
    static func privateRange(of address: SocketAddress) -> String? {
        switch address {
        case .v4(let v4):
            let raw = v4.address.sin_addr.s_addr  // network order in memory
            return withUnsafeBytes(of: raw) { WebhookAddress.privateRange(ofIPv4: Array($0)) }
        case .v6(let v6):
            return withUnsafeBytes(of: v6.address.sin6_addr) { WebhookAddress.privateRange(ofIPv6: Array($0)) }
        default:
            return "non-IP"
        }
    }

    /// getaddrinfo, TCP only.
    static func lookup(host: String, port: Int) throws -> [SocketAddress] {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        #if canImport(Glibc)
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        #else
        hints.ai_socktype = SOCK_STREAM
        #endif
        hints.ai_protocol = Int32(IPPROTO_TCP)
        var result: UnsafeMutablePointer<addrinfo>?
        let code = getaddrinfo(host, String(port), &hints, &result)
        guard code == 0 else {
            throw Failure(kind: .resolve, description: String(cString: gai_strerror(code)))
        }
        defer { freeaddrinfo(result) }
        var addresses: [SocketAddress] = []
        var cursor = result
        while let info = cursor?.pointee {
            if let raw = info.ai_addr {
                switch info.ai_family {
                case AF_INET:
                    raw.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
                        addresses.append(SocketAddress($0.pointee, host: host))
                    }
                case AF_INET6:
                    raw.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
                        addresses.append(SocketAddress($0.pointee, host: host))
                    }
                default: break
                }
            }
            cursor = info.ai_next
        }
        return addresses
    }
}
