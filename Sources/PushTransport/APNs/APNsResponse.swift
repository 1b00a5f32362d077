public import Foundation
public import PushCore

/// APNs' answer to one request.
public struct APNsResponse: Sendable, Hashable {
    /// The HTTP status.
    public var status: Int
    /// The `reason` of an error body.
    public var reason: String?
    /// The `apns-id` header, if APNs sent one (a response without it is accepted: the job's own id stands).
    public var apnsID: UUID?
    /// The `apns-unique-id` header (development only).
    public var apnsUniqueID: String?
    /// The `apns-request-id` header: a broadcast's id, echoed from the request (or minted by APNs).
    public var requestID: String?
    /// A 410's `timestamp`: milliseconds since the epoch, exactly as sent.
    public var timestampMs: Int64?
    /// The `Retry-After` header as sent.
    public var retryAfter: String?
    /// The `apns-channel-id` header (channel management).
    public var channelID: String?
    /// The body, for channel listings.
    public var body: [UInt8]
    /// How long the request took, from write to the end of the response.
    public var latency: Duration
    /// APNs' `Date` header: the server's clock (HTTP date, whole seconds).
    public var serverDate: String?

    /// Creates a response.
    public init(
        status: Int,
        reason: String? = nil,
        apnsID: UUID? = nil,
        apnsUniqueID: String? = nil,
        requestID: String? = nil,
        timestampMs: Int64? = nil,
        retryAfter: String? = nil,
        channelID: String? = nil,
        body: [UInt8] = [],
        latency: Duration = .zero,
        serverDate: String? = nil
    ) {
        self.status = status
        self.reason = reason
        self.apnsID = apnsID
        self.apnsUniqueID = apnsUniqueID
        self.requestID = requestID
        self.timestampMs = timestampMs
        self.retryAfter = retryAfter
        self.channelID = channelID
        self.body = body
        self.latency = latency
        self.serverDate = serverDate
    }

    /// What the answer means for the job, with its trap id.
    public var verdict: APNsVerdict { APNsVerdict.classify(status: self.status, reason: self.reason) }

    /// What the transport does about the answer on its connection (the reason table's column).
    var connectionEffect: ConnectionEffect { APNsReason.connectionEffect(status: self.status, reason: self.reason) }

    /// Whether the answer proves the credential (a 2xx: `true`) or refuses it (its reason's class is a
    /// credential's: `false`); `nil` says nothing about it. The connection's stream limit follows it.
    var credentialAccepted: Bool? {
        if (200...299).contains(self.status) { return true }
        switch self.verdict.responseClass {
        case .credentialFatal, .credentialRetry: return false
        default: return nil
        }
    }

    /// APNs' answer as read off its stream: the headers and error body it carries.
    init(_ answer: HTTP2Answer) {
        let (reason, timestamp) = answer.status == 200 ? (nil, nil) : Self.parseErrorBody(answer.body)
        let headers = answer.headers
        self.init(
            status: answer.status,
            reason: reason,
            apnsID: headers.first(name: "apns-id").flatMap(UUID.init(uuidString:)),
            apnsUniqueID: headers.first(name: "apns-unique-id"),
            requestID: headers.first(name: "apns-request-id"),
            timestampMs: timestamp,
            retryAfter: headers.first(name: "retry-after"),
            channelID: headers.first(name: "apns-channel-id"),
            body: answer.body,
            latency: .nanoseconds(answer.latency.nanoseconds),
            serverDate: headers.first(name: "date")
        )
    }

    /// Parses an error body `{"reason": …, "timestamp": …}`; other bodies leave both `nil`.
    static func parseErrorBody(_ body: [UInt8]) -> (reason: String?, timestampMs: Int64?) {
        guard !body.isEmpty, let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else {
            return (nil, nil)
        }
        let reason = object["reason"] as? String
        var timestamp: Int64?
        if let number = object["timestamp"] as? NSNumber { timestamp = number.int64Value }
        if let text = object["timestamp"] as? String { timestamp = Int64(text) }
        return (reason, timestamp)
    }
}
