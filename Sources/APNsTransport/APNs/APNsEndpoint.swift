public import PushCore

/// Where requests go: Apple's hosts by environment, or one override (the simulator, a staging proxy)
/// for both environments, trusted through an extra CA file. TLS verification is never switched off.
public struct APNsEndpoint: Sendable, Hashable {
    /// Host to connect to (and to verify the certificate against).
    public var host: String
    /// TCP port.
    public var port: Int

    /// Creates an endpoint.
    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// Parses `https://host[:port]` (the `--apns-endpoint` flag).
    public init(url: String) throws {
        var rest = Substring(url)
        guard rest.hasPrefix("https://") else {
            throw TransportError(
                code: .connectFailed,
                mayHaveBeenProcessed: false,
                message: "--apns-endpoint \(url) must start with https:// (APNs is HTTP/2 over TLS)"
            )
        }
        rest = rest.dropFirst("https://".count)
        if let slash = rest.firstIndex(of: "/") { rest = rest[..<slash] }
        if let colon = rest.lastIndex(of: ":"), let port = Int(rest[rest.index(after: colon)...]) {
            self.host = String(rest[..<colon]).trimmingCharacters(in: ["[", "]"])
            self.port = port
        } else {
            self.host = String(rest)
            self.port = 443
        }
        guard !self.host.isEmpty else {
            throw TransportError(
                code: .connectFailed,
                mayHaveBeenProcessed: false,
                message: "--apns-endpoint \(url) has no host"
            )
        }
    }

    /// Apple's send endpoint for an environment.
    public static func apple(_ environment: APNsEnvironment, port: Int = 443) -> APNsEndpoint {
        APNsEndpoint(host: environment.sendHost, port: port)
    }

    /// Apple's channel-management endpoint for an environment.
    public static func appleChannels(_ environment: APNsEnvironment) -> APNsEndpoint {
        let (host, port) = environment.channelHost
        return APNsEndpoint(host: host, port: port)
    }
}

extension String {
    func trimmingCharacters(in set: Set<Character>) -> String {
        var text = Substring(self)
        while let first = text.first, set.contains(first) { text.removeFirst() }
        while let last = text.last, set.contains(last) { text.removeLast() }
        return String(text)
    }
}
