import Foundation
import NIOHPACK

extension APNsSimulator {
    /// Broadcast channel management: create (POST …/channels), list (GET …/all-channels), delete
    /// (DELETE …/channels with apns-channel-id).
    func manageChannels(
        method: String,
        bundle: String,
        resource: String,
        headers: HPACKHeaders,
        body: [UInt8]
    ) -> SimulatorAnswer {
        switch (method, resource) {
        case ("POST", "channels"):
            guard let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any],
                let policy = (object["message-storage-policy"] as? NSNumber)?.intValue, [0, 1].contains(policy),
                object["push-type"] as? String == "LiveActivity"
            else {
                return .error(400, "BadRequest")
            }
            // Apple allows an app 10,000 channels per environment.
            guard let id = self.addChannel(bundle: bundle, policy: policy) else {
                return .error(400, "CannotCreateChannelConfig")
            }
            return SimulatorAnswer(status: 201, reason: nil, headers: [("apns-channel-id", id)])
        case ("GET", "all-channels"):
            let ids = self.state.withLock { $0.channels[bundle].map { Array($0.keys).sorted() } ?? [] }
            let data = (try? JSONSerialization.data(withJSONObject: ["channels": ids])).map(Array.init) ?? []
            return SimulatorAnswer(
                status: 200,
                reason: nil,
                headers: [("content-type", "application/json")],
                body: data
            )
        case ("GET", "channels"):
            guard let id = headers.first(name: "apns-channel-id") else { return .error(400, "MissingChannelId") }
            guard let policy = self.state.withLock({ $0.channels[bundle]?[id] }) else {
                return .error(404, "ChannelNotRegistered")
            }
            let body = Array(#"{"message-storage-policy":\#(policy),"push-type":"LiveActivity"}"#.utf8)
            return SimulatorAnswer(
                status: 200,
                reason: nil,
                headers: [("content-type", "application/json")],
                body: body
            )
        case ("DELETE", "channels"):
            guard let id = headers.first(name: "apns-channel-id") else { return .error(400, "MissingChannelId") }
            let removed = self.state.withLock { $0.channels[bundle]?.removeValue(forKey: id) != nil }
            return removed ? SimulatorAnswer(status: 204, reason: nil) : .error(404, "ChannelNotRegistered")
        default:
            return .error(405, "MethodNotAllowed")
        }
    }
}

extension APNsSimulator {
    /// How many channels an app may hold (Apple: 10,000 per environment); past it a create is answered
    /// 400 CannotCreateChannelConfig.
    public static let channelLimit = 10_000

    /// Creates a channel of `bundle` as a create request would; `nil` past ``channelLimit``.
    @discardableResult
    public func addChannel(bundle: String, policy: Int = 0) -> String? {
        let id = Data((0..<16).map { _ in UInt8.random(in: 0...255) }).base64EncodedString()
        return self.state.withLock { state -> String? in
            guard (state.channels[bundle]?.count ?? 0) < Self.channelLimit else { return nil }
            state.channels[bundle, default: [:]][id] = policy
            return id
        }
    }

    /// The channels `bundle` holds now.
    public func channelCount(bundle: String) -> Int { self.state.withLock { $0.channels[bundle]?.count ?? 0 } }
}
