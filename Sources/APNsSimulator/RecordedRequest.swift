public import Foundation

/// One request as the simulator received it, for tests to inspect.
public struct RecordedRequest: Sendable, Hashable {
    /// Which TCP connection it came on (1, 2, …).
    public var connectionID: Int
    /// The HTTP/2 stream id.
    public var streamID: Int
    /// `:method`.
    public var method: String
    /// `:path`.
    public var path: String
    /// Every header except `authorization`, lower-case names, in order.
    public var headers: [String: String]
    /// Whether an `authorization` header was present (its JWT is not kept).
    public var hadAuthorization: Bool
    /// The JWT's `iat`, when it verified.
    public var tokenIssuedAt: Int64?
    /// The JWT's `kid`, when it verified: which signing key sent the request.
    public var tokenKeyID: String?
    /// The topic of the provider certificate the connection presented in TLS, if any (certificate-based trust).
    public var certificateTopic: String?
    /// The body.
    public var body: [UInt8]
    /// When it arrived.
    public var receivedAt: Date
    /// The status the simulator answered (0 when it did not answer).
    public var status: Int
    /// The reason it answered, if any.
    public var reason: String?

    /// The device token of a `/3/device/` request, or an FCM send's registration token.
    public var deviceToken: String? {
        if self.path.hasPrefix("/3/device/") { return String(self.path.dropFirst("/3/device/".count)) }
        return self.path.hasSuffix("/messages:send") ? APNsSimulator.fcmToken(self.body) : nil
    }

    /// The notification's id: `apns-id` (or a broadcast's `apns-request-id`), or an FCM send's
    /// `data.push_id`, lower-case.
    public var notificationID: String? {
        if self.path.hasSuffix("/messages:send") { return APNsSimulator.fcmPushID(self.body) }
        return (self.headers["apns-id"] ?? self.headers["apns-request-id"])?.lowercased()
    }
}
