import Foundation
import NIOCore
import NIOEmbedded
import Testing

@testable import PushTransport

@Suite("HTTPS proxy: settings, NO_PROXY, and the CONNECT handshake")
struct ProxyTests {
    @Test("a proxy URL with credentials: host, port, basic auth; the description hides the password")
    func parse() throws {
        let proxy = try HTTPSProxy(url: "http://push%20user:p%40ss@proxy.internal:3128")
        #expect(proxy.host == "proxy.internal" && proxy.port == 3128 && proxy.user == "push user")
        #expect(proxy.authorization == "Basic " + Data("push user:p@ss".utf8).base64EncodedString())
        #expect("\(proxy)" == "http://push user:***@proxy.internal:3128")
        #expect(!"\(proxy)".contains("p@ss"))
    }

    @Test(
        "unusable proxy settings are refused with the fix, never echoing the password",
        arguments: [
            ("https://u:secret@proxy:3128", "only http://"), ("http://proxy", "has no port"),
            ("http://u:secret@:3128", "has no host"), ("http://proxy:3128/path", "has a path"),
            ("u:secret@proxy", "has no port"), ("user:secret@proxy.internal:3128/x", "has a path"),
        ]
    )
    func refused(_ testCase: (String, String)) {
        #expect {
            try HTTPSProxy(url: testCase.0)
        } throws: { error in
            let text = "\(error)"
            return text.contains(testCase.1) && !text.contains("secret")
        }
    }

    @Test("a URL without a scheme is http://, as curl takes it; its password is never shown")
    func schemeless() throws {
        let proxy = try HTTPSProxy(url: "user:secret@proxy.internal:3128")
        #expect(proxy.host == "proxy.internal" && proxy.port == 3128 && proxy.user == "user")
        #expect(HTTPSProxy.redact("user:secret@proxy.internal") == "user:***@proxy.internal")
        #expect(HTTPSProxy.redact("http://user:secret@proxy.internal:1") == "http://user:***@proxy.internal:1")
    }

    @Test("NO_PROXY: exact hosts, domain suffixes with or without a dot, ports ignored, * for all")
    func noProxy() throws {
        let proxy = try HTTPSProxy(
            url: "http://proxy:3128",
            noProxy: " localhost, .internal.example ,apple.com:443,[::1]:8443, 10.0.0.7"
        )
        #expect(!proxy.applies(to: "localhost"))
        #expect(!proxy.applies(to: "api.internal.example") && !proxy.applies(to: "internal.example"))
        #expect(!proxy.applies(to: "api.push.apple.com"), "apple.com covers its subdomains")
        #expect(!proxy.applies(to: "::1") && !proxy.applies(to: "10.0.0.7"))
        #expect(proxy.applies(to: "api.sandbox.push.apple.org") && proxy.applies(to: "notapple.com"))
        #expect(!(try HTTPSProxy(url: "http://proxy:3128", noProxy: "*")).applies(to: "api.push.apple.com"))
    }

    /// Records what reaches the handler after the proxy handler.
    final class Downstream: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        var active = false
        var bytes: [UInt8] = []
        var errors: [String] = []
        func channelActive(context: ChannelHandlerContext) { self.active = true }
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            self.bytes += self.unwrapInboundIn(data).readableBytesView
        }
        func errorCaught(context: ChannelHandlerContext, error: any Error) { self.errors.append("\(error)") }
    }

    func handshake(answer: String) throws -> (EmbeddedChannel, Downstream, String) {
        let proxy = try HTTPSProxy(url: "http://user:pw@proxy:3128")
        let downstream = Downstream()
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(
            ProxyConnectHandler(proxy: proxy, targetHost: "api.push.apple.com", targetPort: 443, deadline: .seconds(5))
        )
        try channel.pipeline.syncOperations.addHandler(downstream)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 3128)).wait()
        #expect(!downstream.active, "TLS must not start before the tunnel is up")
        var sent = ""
        while let buffer = try channel.readOutbound(as: ByteBuffer.self) { sent += String(buffer: buffer) }
        try channel.writeInbound(ByteBuffer(string: answer))
        return (channel, downstream, sent)
    }

    @Test("CONNECT with Proxy-Authorization; on 200 the handler leaves and bytes after the answer go on")
    func tunnel() throws {
        let (channel, downstream, sent) = try self.handshake(
            answer: "HTTP/1.1 200 Connection established\r\nProxy-Agent: test\r\n\r\n\u{16}\u{03}"
        )
        #expect(sent.hasPrefix("CONNECT api.push.apple.com:443 HTTP/1.1\r\nHost: api.push.apple.com:443\r\n"))
        #expect(sent.contains("Proxy-Authorization: Basic \(Data("user:pw".utf8).base64EncodedString())\r\n"))
        #expect(sent.hasSuffix("\r\n\r\n"))
        #expect(downstream.active && downstream.bytes == [0x16, 0x03] && downstream.errors.isEmpty)
        #expect(throws: (any Error).self) {
            try channel.pipeline.syncOperations.handler(type: ProxyConnectHandler.self)
        }
        _ = try? channel.finish()
    }

    @Test("a refusal fails the connection with the proxy's status line and the fix")
    func refusal() throws {
        let (channel, downstream, _) = try self.handshake(
            answer: "HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n"
        )
        #expect(!downstream.active)
        #expect(downstream.errors.count >= 1)
        #expect(downstream.errors.first?.contains("407 Proxy Authentication Required") == true)
        #expect(downstream.errors.first?.contains("--https-proxy-auth-file") == true)
        #expect(!channel.isActive)
        _ = try? channel.finish()
    }

    @Test("an answer that is not HTTP fails the connection")
    func garbage() throws {
        let (_, downstream, _) = try self.handshake(answer: "SSH-2.0-OpenSSH\r\n\r\n")
        #expect(!downstream.active && downstream.errors.first?.contains("not an HTTP answer") == true)
    }
}
