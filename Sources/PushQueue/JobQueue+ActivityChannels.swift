import Foundation
import PostgresNIO
import PushCore

/// An activity waiting for the channel it asked for.
public struct ActivityChannelRequest: Sendable, Hashable {
    public var activity: Int64
    public var topic: String
    public var environment: String
    public var credential: String
    /// Apple's message-storage policy: 0 none, 1 the most recent message.
    public var storage: Int
}

/// The broadcast channel of an ended activity, due for deletion.
public struct ActivityChannel: Sendable, Hashable {
    public var activity: Int64
    public var topic: String
    public var channelID: String
    public var environment: String
    public var credential: String
}

extension JobQueue {
    /// Up to `limit` channels of ended activities whose dismissal passed, leased to this worker for `lease`.
    public func activityChannelsToDelete(limit: Int, lease: Duration) async throws -> [ActivityChannel] {
        let rows = try await self.client.query(
            ActivitiesSQL.channelsToDelete.query {
                $0.bind("lease_seconds", lease.seconds)
                $0.bind("limit", Int64(max(limit, 0)))
            },
            logger: self.logger
        )
        var channels: [ActivityChannel] = []
        for try await (id, topic, channel, environment, credential) in rows.decode(
            (Int64, String, String, String, String).self
        ) {
            channels.append(
                ActivityChannel(
                    activity: id,
                    topic: topic,
                    channelID: channel,
                    environment: environment,
                    credential: credential
                )
            )
        }
        return channels
    }

    /// Up to `limit` activities that asked for a channel and have none, leased to this worker for `lease`.
    public func activityChannelsToCreate(limit: Int, lease: Duration) async throws -> [ActivityChannelRequest] {
        let rows = try await self.client.query(
            ActivitiesSQL.channelsToCreate.query {
                $0.bind("lease_seconds", lease.seconds)
                $0.bind("limit", Int64(max(limit, 0)))
            },
            logger: self.logger
        )
        var requests: [ActivityChannelRequest] = []
        for try await (id, topic, environment, credential, storage) in rows.decode(
            (Int64, String, String, String, Int32).self
        ) {
            requests.append(
                ActivityChannelRequest(
                    activity: id,
                    topic: topic,
                    environment: environment,
                    credential: credential,
                    storage: Int(storage)
                )
            )
        }
        return requests
    }

    /// Records activity `id`'s new channel; `false` when another worker recorded one first (delete this one).
    public func activityChannelCreated(_ id: Int64, channelID: String) async throws -> Bool {
        let rows = try await self.client.query(
            ActivitiesSQL.channelCreated.query {
                $0.bind("channel_id", channelID)
                $0.bind("id", id)
            },
            logger: self.logger
        )
        for try await _ in rows.decode(Int64.self) { return true }
        return false
    }

    /// APNs refused to create activity `id`'s channel (`error`): it asks for none any more.
    public func activityChannelRefused(_ id: Int64, error: String) async throws {
        try await self.client.query(
            ActivitiesSQL.channelRefused.query {
                $0.bind("id", id)
                $0.bind("error", error)
            },
            logger: self.logger
        )
    }

    /// Records the channels of `activities` deleted.
    public func activityChannelsDeleted(_ activities: [Int64]) async throws {
        guard !activities.isEmpty else { return }
        try await self.client.query(
            ActivitiesSQL.channelsDeleted.query { $0.bind("ids", activities) },
            logger: self.logger
        )
    }
}
