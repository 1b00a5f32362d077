public import Foundation

/// The exact HTTP/2 request a send of one job issues, minus the `authorization` header: what
/// `push-worker describe` prints and what the transport writes.
public struct APNsRequest: Sendable, Hashable {
    /// Which APNs the request goes to.
    public var environment: APNsEnvironment
    /// `POST`.
    public var method: String
    /// `/3/device/<token>` or `/4/broadcasts/apps/<bundle id>`.
    public var path: String
    /// Request headers in the order they are sent, lower-case names; no `authorization`.
    public var headers: [(name: String, value: String)]
    /// The body, byte for byte.
    public var body: [UInt8]
    /// The payload ceiling that applied.
    public var limit: Int
    /// The job's `apns-id` (sent as `apns-request-id` on a broadcast).
    public var apnsID: UUID
    /// Fields APNs accepts but a device would not honour as written (PW101–PW107); the request is still sent.
    public var warnings: [PayloadWarning]

    /// The body's size in bytes.
    public var byteCount: Int { self.body.count }

    /// The value of a header, if present.
    public func header(_ name: String) -> String? {
        self.headers.first { $0.name == name }?.value
    }

    /// Creates a request from its parts.
    public init(
        environment: APNsEnvironment,
        method: String = "POST",
        path: String,
        headers: [(name: String, value: String)],
        body: [UInt8],
        limit: Int,
        apnsID: UUID,
        warnings: [PayloadWarning] = []
    ) {
        self.environment = environment
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self.limit = limit
        self.apnsID = apnsID
        self.warnings = warnings
    }

    public static func == (lhs: APNsRequest, rhs: APNsRequest) -> Bool {
        lhs.environment == rhs.environment && lhs.method == rhs.method && lhs.path == rhs.path
            && lhs.headers.map(\.name) == rhs.headers.map(\.name)
            && lhs.headers.map(\.value) == rhs.headers.map(\.value)
            && lhs.body == rhs.body && lhs.limit == rhs.limit && lhs.apnsID == rhs.apnsID
            && lhs.warnings == rhs.warnings
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(self.path)
        hasher.combine(self.body)
        hasher.combine(self.apnsID)
    }
}

/// Production or development (sandbox) APNs. Tokens and channels belong to one of them.
public enum APNsEnvironment: String, Sendable, Hashable, CaseIterable, Codable {
    case production
    case development

    /// The host that takes sends (device, Live Activity, broadcast).
    public var sendHost: String {
        self == .production ? "api.push.apple.com" : "api.sandbox.push.apple.com"
    }

    /// The host and port of broadcast channel management.
    public var channelHost: (host: String, port: Int) {
        self == .production
            ? ("api-manage-broadcast.push.apple.com", 2196) : ("api-manage-broadcast.sandbox.push.apple.com", 2195)
    }
}
