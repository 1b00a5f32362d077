/// Where a provider's requests go (host and port), whichever the provider: its own hosts, or an override
/// (the simulator, a staging proxy) trusted through an extra CA file. TLS verification is never switched off.
public struct PushEndpoint: Sendable, Hashable {
    /// Host to connect to (and to verify the certificate against).
    public var host: String
    /// TCP port.
    public var port: Int

    /// Creates an endpoint.
    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// Parses `https://host[:port]`, as the flag `flag` gives it (`--apns-endpoint`).
    public init(url: String, flag: String = "--apns-endpoint") throws {
        var rest = Substring(url)
        guard rest.hasPrefix("https://") else {
            throw TransportError(
                code: .connectFailed,
                mayHaveBeenProcessed: false,
                message: "\(flag) \(url) must start with https:// (push providers speak HTTP/2 over TLS)"
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
                message: "\(flag) \(url) has no host"
            )
        }
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
