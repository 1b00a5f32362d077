import Foundation
import NIOCore

/// An HTTP CONNECT proxy between the worker and APNs (`--https-proxy`, `HTTPS_PROXY`), and the hosts that
/// bypass it (`NO_PROXY`). TLS to APNs runs inside the tunnel with full verification: the proxy sees only
/// the host name and encrypted bytes. Its description never shows the password.
public struct HTTPSProxy: Sendable, Hashable, CustomStringConvertible {
    /// The proxy's host.
    public var host: String
    /// The proxy's port.
    public var port: Int
    /// The user of basic auth, if any (the password is kept only inside ``authorization``).
    public var user: String?
    /// `Basic <base64(user:password)>`, sent as `Proxy-Authorization`.
    var authorization: String?
    /// Lower-cased `NO_PROXY` entries: host names, domain suffixes (`.example.com` or `example.com`), IP
    /// addresses, or `*` for every host.
    public var noProxy: [String]

    /// Parses `http://[user:password@]host:port`; the user and password may instead come from
    /// `credentialsFile` (one line, `user:password`, readable by the owner only).
    ///
    /// - Throws: ``TransportError`` (`invalidProxy`) with a sentence that names the setting and the fix.
    public init(url: String, credentialsFile: String? = nil, noProxy: String? = nil) throws(TransportError) {
        func fail(_ what: String) -> TransportError {
            TransportError(code: .invalidProxy, mayHaveBeenProcessed: false, message: "--https-proxy \(what)")
        }
        let redacted = Self.redact(url)
        // `user:password@proxy:3128` and `proxy:3128`, as curl takes them, mean http://.
        let url = url.contains("://") ? url : "http://" + url
        guard let components = URLComponents(string: url), let scheme = components.scheme?.lowercased() else {
            throw fail("'\(redacted)' is not a URL: write it as http://proxy.internal:3128")
        }
        guard scheme == "http" else {
            throw fail(
                "'\(redacted)' uses \(scheme)://: only http:// CONNECT proxies are supported (TLS to the provider runs inside the tunnel either way)"
            )
        }
        guard let host = components.host, !host.isEmpty else {
            throw fail("'\(redacted)' has no host: write it as http://proxy.internal:3128")
        }
        guard let port = components.port, (1...65_535).contains(port) else {
            throw fail("'\(redacted)' has no port: add the proxy's port, e.g. http://\(host):3128")
        }
        guard components.path.isEmpty || components.path == "/" else {
            throw fail("'\(redacted)' has a path: a CONNECT proxy is host and port only")
        }
        self.host = host
        self.port = port
        var user = components.user
        var password = components.password
        if let file = credentialsFile {
            let bytes: [UInt8]
            switch SecretFile.read(file, policy: .privateKey, maxBytes: 4096) {
            case .success(let read): bytes = read
            case .failure(let failure):
                throw TransportError(
                    code: .invalidProxy,
                    mayHaveBeenProcessed: false,
                    message: "--https-proxy-auth-file \(file) \(failure.sentence)"
                )
            }
            let line = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            guard let colon = line.firstIndex(of: ":"), colon != line.startIndex,
                !line.unicodeScalars.contains(where: { $0 == "\n" || $0 == "\r" })
            else {
                throw TransportError(
                    code: .invalidProxy,
                    mayHaveBeenProcessed: false,
                    message: "--https-proxy-auth-file \(file) must hold one line, user:password"
                )
            }
            user = String(line[..<colon])
            password = String(line[line.index(after: colon)...])
        }
        self.user = user
        if let user {
            let pair = "\(user):\(password ?? "")"
            self.authorization = "Basic \(Data(pair.utf8).base64EncodedString())"
        }
        self.noProxy = Self.parseNoProxy(noProxy)
    }

    public var description: String {
        "http://\(self.user.map { "\($0):***@" } ?? "")\(self.host):\(self.port)"
    }

    /// Whether a connection to `host` goes through the proxy (it is not named by `NO_PROXY`).
    public func applies(to host: String) -> Bool {
        let host = host.lowercased().trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
        for entry in self.noProxy {
            if entry == "*" || entry == host { return false }
            let domain = entry.hasPrefix(".") ? String(entry.dropFirst()) : entry
            if host == domain || host.hasSuffix("." + domain) { return false }
        }
        return true
    }

    /// `NO_PROXY`'s comma-separated entries, lower-cased, without ports or a leading `*.`.
    static func parseNoProxy(_ value: String?) -> [String] {
        (value ?? "").split(separator: ",").compactMap { raw in
            var entry = raw.trimmingCharacters(in: .whitespaces).lowercased()
            if entry.hasPrefix("*.") { entry.removeFirst() }
            // host:port → host (an IPv6 literal keeps its colons inside brackets).
            if entry.hasPrefix("["), let close = entry.firstIndex(of: "]") {
                entry = String(entry[entry.index(after: entry.startIndex)..<close])
            } else if entry.filter({ $0 == ":" }).count == 1, let colon = entry.firstIndex(of: ":") {
                entry = String(entry[..<colon])
            }
            return entry.isEmpty ? nil : entry
        }
    }

    /// The URL with any password replaced by `***`, for error messages (with or without a scheme).
    static func redact(_ url: String) -> String {
        guard let at = url.lastIndex(of: "@") else { return url }
        let userStart =
            url.range(of: "://").map { $0.upperBound < at ? $0.upperBound : url.startIndex }
            ?? url.startIndex
        let userInfo = url[userStart..<at]
        guard let colon = userInfo.firstIndex(of: ":") else { return url }
        return String(url[..<colon]) + ":***" + String(url[at...])
    }
}

/// What a proxy answered to CONNECT, when it was not a 2xx.
struct ProxyRefusal: Error, CustomStringConvertible {
    var proxy: String
    var target: String
    var statusLine: String

    var description: String {
        var text = "proxy \(self.proxy) refused CONNECT \(self.target): \(self.statusLine)"
        if self.statusLine.contains(" 407") || self.statusLine.contains(" 401") {
            text +=
                ": it wants credentials; put them in the --https-proxy URL (http://user:password@host:port) or in --https-proxy-auth-file"
        } else if self.statusLine.contains(" 403") {
            text += ": the proxy's rules forbid this host or port; allow CONNECT to it"
        }
        return text
    }
}

/// Opens a CONNECT tunnel before anything else on the connection speaks. It holds back `channelActive`
/// from the handlers after it (TLS, HTTP/2) until the proxy answers 2xx, then removes itself; a refusal,
/// an early close or a silent proxy fails the connection with a sentence that says which. `tunnelUp`, when
/// given, is succeeded once the tunnel is up and failed with that sentence otherwise.
final class ProxyConnectHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let proxy: HTTPSProxy
    private let targetHost: String
    private let targetPort: Int
    private let deadline: TimeAmount
    private var buffer: ByteBuffer?
    private var established = false
    private var failed = false
    private var timeout: Scheduled<Void>?
    private var tunnelUp: EventLoopPromise<Void>?

    init(
        proxy: HTTPSProxy,
        targetHost: String,
        targetPort: Int,
        deadline: TimeAmount,
        tunnelUp: EventLoopPromise<Void>? = nil
    ) {
        self.proxy = proxy
        self.targetHost = targetHost
        self.targetPort = targetPort
        self.deadline = deadline
        self.tunnelUp = tunnelUp
    }

    /// Completes `tunnelUp` once (the first outcome stands).
    private func settle(_ error: (any Error)?) {
        guard let promise = self.tunnelUp else { return }
        self.tunnelUp = nil
        if let error { promise.fail(error) } else { promise.succeed(()) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        // A connection that never came up (or a pipeline torn down early) must not leave the promise pending.
        self.timeout?.cancel()
        self.settle(
            ProxyRefusal(
                proxy: "\(self.proxy)",
                target: self.target,
                statusLine: "the connection to the proxy ended before the tunnel was up"
            )
        )
    }

    private var target: String {
        self.targetHost.contains(":")
            ? "[\(self.targetHost)]:\(self.targetPort)" : "\(self.targetHost):\(self.targetPort)"
    }

    func channelActive(context: ChannelHandlerContext) {
        var request = "CONNECT \(self.target) HTTP/1.1\r\nHost: \(self.target)\r\n"
        if let authorization = self.proxy.authorization { request += "Proxy-Authorization: \(authorization)\r\n" }
        request += "\r\n"
        context.writeAndFlush(self.wrapOutboundOut(context.channel.allocator.buffer(string: request)), promise: nil)
        let loopBound = NIOLoopBound(context, eventLoop: context.eventLoop)
        let description = "\(self.proxy)"
        let target = self.target
        let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
        self.timeout = context.eventLoop.scheduleTask(in: self.deadline) {
            let context = loopBound.value
            handler.value.failed = true
            let refusal = ProxyRefusal(proxy: description, target: target, statusLine: "no answer to CONNECT in time")
            handler.value.settle(refusal)
            context.fireErrorCaught(refusal)
            context.close(promise: nil)
        }
        // channelActive goes on only once the tunnel is up.
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var incoming = self.unwrapInboundIn(data)
        if self.established {
            context.fireChannelRead(data)
            return
        }
        if self.buffer == nil {
            self.buffer = incoming
        } else {
            self.buffer!.writeBuffer(&incoming)
        }
        guard let view = self.buffer?.readableBytesView,
            let end = view.firstRange(of: [UInt8]("\r\n\r\n".utf8))
        else {
            if (self.buffer?.readableBytes ?? 0) > 16 * 1024 {
                self.fail(context, "an answer to CONNECT longer than 16 KB")
            }
            return
        }
        let headerLength = end.upperBound - view.startIndex
        let head = self.buffer!.readString(length: headerLength) ?? ""
        let statusLine = head.components(separatedBy: "\r\n").first ?? ""
        let parts = statusLine.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let code = Int(parts[1]) else {
            self.fail(context, "not an HTTP answer (\(statusLine.prefix(80)))")
            return
        }
        guard (200...299).contains(code) else {
            self.fail(context, statusLine)
            return
        }
        self.established = true
        self.timeout?.cancel()
        self.settle(nil)
        let leftover = self.buffer!
        self.buffer = nil
        context.fireChannelActive()
        if leftover.readableBytes > 0 { context.fireChannelRead(self.wrapInboundOut(leftover)) }
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.timeout?.cancel()
        if !self.established && !self.failed {
            self.failed = true
            let refusal = ProxyRefusal(
                proxy: "\(self.proxy)",
                target: self.target,
                statusLine: "the proxy closed the connection before answering"
            )
            self.settle(refusal)
            context.fireErrorCaught(refusal)
        }
        context.fireChannelInactive()
    }

    private func fail(_ context: ChannelHandlerContext, _ statusLine: String) {
        self.timeout?.cancel()
        self.failed = true
        // The proxy's words, bounded and printable: they go into logs.
        let printable = String(
            String.UnicodeScalarView(
                statusLine.unicodeScalars.prefix(200).filter { $0.value >= 0x20 && $0.value < 0x7F }
            )
        )
        let refusal = ProxyRefusal(proxy: "\(self.proxy)", target: self.target, statusLine: printable)
        self.settle(refusal)
        context.fireErrorCaught(refusal)
        context.close(promise: nil)
    }
}
