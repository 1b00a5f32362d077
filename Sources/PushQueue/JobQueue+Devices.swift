public import Foundation
import PostgresNIO
import PushCore

/// One row of `push.devices`, as operators see it: its token only as a fingerprint.
public struct Device: Sendable, Hashable, Codable {
    public var id: Int64
    /// The producer's key for a person or account.
    public var recipient: String
    public var platform: String
    public var topic: String
    /// The token's short SHA-256 fingerprint (``tokenFingerprint(_:)``): never the token.
    public var tokenFingerprint: String
    /// `device`, `push_to_start` or `activity`.
    public var kind: String
    public var activityID: String?
    /// `production`, `development`, `auto` (APNs) or `fcm`.
    public var environment: String
    public var registeredAt: Date
    /// When the provider called the token invalid (`nil`: live).
    public var invalidatedAt: Date?
    public var invalidatedReason: String?

    /// Whether jobs may still target it.
    public var isLive: Bool { self.invalidatedAt == nil }
}

/// How many devices the registry holds.
public struct DeviceCounts: Sendable, Hashable, Codable {
    public var devices: Int
    public var live: Int
    /// Recipients with at least one live device.
    public var recipientsReachable: Int
}

extension QueueOperations {
    /// Devices of `recipient` and `topic` (each when given), the newest registration first.
    public func devices(recipient: String? = nil, topic: String? = nil, limit: Int = 100) async throws -> [Device] {
        let rows = try await self.client.query(
            DevicesSQL.list.query {
                $0.bind("recipient", recipient)
                $0.bind("topic", topic)
                $0.bind("limit", Int64(max(limit, 0)))
            },
            logger: self.logger
        )
        var devices: [Device] = []
        for try await row in rows.decode(
            (Int64, String, String, String, String, String, String?, String, Date, Date?, String?).self
        ) {
            devices.append(
                Device(
                    id: row.0,
                    recipient: row.1,
                    platform: row.2,
                    topic: row.3,
                    tokenFingerprint: PushCore.tokenFingerprint(row.4),
                    kind: row.5,
                    activityID: row.6,
                    environment: row.7,
                    registeredAt: row.8,
                    invalidatedAt: row.9,
                    invalidatedReason: row.10
                )
            )
        }
        return devices
    }

    /// How many devices there are (of `topic`, when given), live, and recipients a job can reach.
    public func deviceCounts(topic: String? = nil) async throws -> DeviceCounts {
        let rows = try await self.client.query(
            DevicesSQL.counts.query { $0.bind("topic", topic) },
            logger: self.logger
        )
        for try await (devices, live, recipients) in rows.decode((Int64, Int64, Int64).self) {
            return DeviceCounts(devices: Int(devices), live: Int(live), recipientsReachable: Int(recipients))
        }
        return DeviceCounts(devices: 0, live: 0, recipientsReachable: 0)
    }
}

/// The statements of `Statements/devices.sql`, with their binds in order.
enum DevicesSQL: StatementFile {
    static let file = "devices"

    static let list = named("list", "recipient", "topic", "limit")
    static let counts = named("counts", "topic")

    static let all = [list, counts]
}
