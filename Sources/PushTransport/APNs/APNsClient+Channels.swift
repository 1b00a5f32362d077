import Foundation
public import PushCore

/// APNs answered a channel-management request with an error.
public struct ChannelManagementError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The HTTP status.
    public var status: Int
    /// APNs' reason, if any.
    public var reason: String?
    /// The trap id, if the reason has one (MS031 channel, MS034 broadcast not enabled, MS030 token).
    public var trapID: TrapID?

    public var description: String {
        "APNs refused the channel request: \(self.status) \(self.reason ?? "(no reason)")\(self.trapID.map { " [\($0)]" } ?? "")"
    }
}

extension APNsClient {
    /// Message storage of a broadcast channel.
    public enum MessageStoragePolicy: Int, Sendable {
        /// No storage: only devices connected at the time get the update (send with apns-expiration 0).
        case noStorage = 0
        /// The most recent message is stored for offline devices.
        case mostRecentMessageStored = 1
    }

    /// Creates an iOS 18 broadcast channel for `bundleID` and returns its id (base64).
    public func createChannel(
        bundleID: String,
        environment: APNsEnvironment,
        credential: String,
        storage: MessageStoragePolicy
    ) async throws -> String {
        let body = Array(#"{"message-storage-policy":\#(storage.rawValue),"push-type":"LiveActivity"}"#.utf8)
        let response = try await self.channelRequest(
            "POST",
            "/1/apps/\(bundleID)/channels",
            environment: environment,
            credential: credential,
            headers: [("content-type", "application/json")],
            body: body
        )
        guard response.status == 201 || response.status == 200, let id = response.channelID else {
            throw Self.channelError(response)
        }
        return id
    }

    /// The ids of every channel of `bundleID`.
    public func listChannels(
        bundleID: String,
        environment: APNsEnvironment,
        credential: String
    ) async throws -> [String] {
        let response = try await self.channelRequest(
            "GET",
            "/1/apps/\(bundleID)/all-channels",
            environment: environment,
            credential: credential
        )
        guard response.status == 200 else { throw Self.channelError(response) }
        let object = try? JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any]
        return object?["channels"] as? [String] ?? []
    }

    /// One channel's configuration: its message-storage policy (`GET /1/apps/<bundle>/channels` with
    /// `apns-channel-id`, Apple's "read channel" request).
    public func channelStorage(
        _ channelID: String,
        bundleID: String,
        environment: APNsEnvironment,
        credential: String
    ) async throws -> MessageStoragePolicy {
        let response = try await self.channelRequest(
            "GET",
            "/1/apps/\(bundleID)/channels",
            environment: environment,
            credential: credential,
            headers: [("apns-channel-id", channelID)]
        )
        guard response.status == 200 else { throw Self.channelError(response) }
        let object = try? JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any]
        guard let raw = (object?["message-storage-policy"] as? NSNumber)?.intValue,
            let policy = MessageStoragePolicy(rawValue: raw)
        else { throw ChannelManagementError(status: response.status, reason: "UnreadableChannel", trapID: nil) }
        return policy
    }

    /// Deletes a channel.
    public func deleteChannel(
        _ channelID: String,
        bundleID: String,
        environment: APNsEnvironment,
        credential: String
    ) async throws {
        let response = try await self.channelRequest(
            "DELETE",
            "/1/apps/\(bundleID)/channels",
            environment: environment,
            credential: credential,
            headers: [("apns-channel-id", channelID)]
        )
        guard response.status == 204 || response.status == 200 else { throw Self.channelError(response) }
    }

    func channelRequest(
        _ method: String,
        _ path: String,
        environment: APNsEnvironment,
        credential: String,
        headers: [(name: String, value: String)] = [],
        body: [UInt8] = []
    ) async throws -> APNsResponse {
        let endpoint =
            self.configuration.channelEndpointOverride ?? self.configuration.endpointOverride
            ?? .appleChannels(environment)
        var response = try await self.perform(
            endpoint: endpoint,
            credential: credential,
            method: method,
            path: path,
            headers: headers,
            body: body
        )
        if response.status != 200, response.reason == nil {
            response.reason = APNsResponse.parseErrorBody(response.body).reason
        }
        return response
    }

    static func channelError(_ response: APNsResponse) -> ChannelManagementError {
        ChannelManagementError(status: response.status, reason: response.reason, trapID: response.verdict.trapID)
    }
}
