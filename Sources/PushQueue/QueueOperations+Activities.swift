import Foundation
import PostgresNIO
import PushCore

extension QueueOperations {
    /// Channels of activities in use (not deleted), by environment: Apple allows an app 10,000 per environment.
    public func activityChannelCounts() async throws -> [String: Int] {
        let rows = try await self.client.query(ActivitiesSQL.channelCounts.query(), logger: self.logger)
        var counts: [String: Int] = [:]
        for try await (environment, count) in rows.decode((String, Int64).self) { counts[environment] = Int(count) }
        return counts
    }

    /// Activities of `topic` (when given), the newest first.
    public func activities(topic: String? = nil, limit: Int = 100) async throws -> [Activity] {
        let rows = try await self.client.query(
            ActivitiesSQL.list.query {
                $0.bind("topic", topic)
                $0.bind("limit", Int64(max(limit, 0)))
            },
            logger: self.logger
        )
        var activities: [Activity] = []
        for try await row in rows { activities.append(try Self.decodeActivity(row)) }
        return activities
    }

    /// One activity, by its row id or by topic and activity id, with its budget this hour.
    public func activity(id: Int64? = nil, topic: String? = nil, activityID: String? = nil) async throws -> Activity? {
        let rows = try await self.client.query(
            ActivitiesSQL.show.query {
                $0.bind("id", id)
                $0.bind("topic", topic)
                $0.bind("activity_id", activityID)
            },
            logger: self.logger
        )
        for try await row in rows { return try Self.decodeActivity(row) }
        return nil
    }

    /// The events of an activity in the order they were enqueued.
    public func activityEvents(topic: String, activityID: String) async throws -> [ActivityEventRow] {
        let rows = try await self.client.query(
            ActivitiesSQL.events.query {
                $0.bind("topic", topic)
                $0.bind("activity_id", activityID)
            },
            logger: self.logger
        )
        var events: [ActivityEventRow] = []
        for try await row in rows.decode(
            (Int64, String?, String?, String, String?, Int16?, Date, Int64, Int32?).self
        ) {
            events.append(
                ActivityEventRow(
                    jobID: row.0,
                    event: row.1,
                    timestamp: row.2,
                    state: row.3,
                    reason: row.4,
                    priority: row.5.map(Int.init),
                    createdAt: row.6,
                    delivered: Int(row.7),
                    children: Int(row.8 ?? 0)
                )
            )
        }
        return events
    }

    /// An activity from a row of `list` or `show` (the same columns, by position).
    static func decodeActivity(_ row: PostgresRow) throws -> Activity {
        var c = RowCursor(row)
        return Activity(
            id: try c.next(Int64.self),
            topic: try c.next(String.self),
            activityID: try c.next(String.self),
            recipient: try c.next(String?.self),
            channelID: try c.next(String?.self),
            state: try c.next(String.self),
            lastEvent: try c.next(String?.self),
            lastTimestamp: try c.next(Int64?.self),
            lastRoutedAt: try c.next(Date?.self),
            endedAt: try c.next(Date?.self),
            dismissalAt: try c.next(Date?.self),
            createdAt: try c.next(Date.self),
            budgetUsed: Int(try c.next(Int32.self)),
            budgetPerHour: Int(try c.next(Int32.self))
        )
    }

    /// Enqueues an end for activity `id` (the content-state given, or its last routed event's), dismissed
    /// `dismissAfter` from now; `nil` when the activity is already ended.
    public func endActivity(id: Int64, contentState: String?, dismissAfter: Duration) async throws -> Int64? {
        let rows = try await self.client.query(
            ActivitiesSQL.enqueueEnd.query {
                $0.bind("dismiss_after_seconds", dismissAfter.components.seconds)
                $0.bind("content_state", contentState)
                $0.bind("id", id)
            },
            logger: self.logger
        )
        for try await job in rows.decode(Int64.self) { return job }
        return nil
    }

    /// Sets `topic`'s hourly budget of priority-10 updates per activity; returns it.
    public func setActivityBudget(topic: String, perHour: Int) async throws -> Int {
        let rows = try await self.client.query(
            ActivitiesSQL.setBudget.query {
                $0.bind("topic", topic)
                $0.bind("per_hour", Int32(clamping: perHour))
            },
            logger: self.logger
        )
        for try await value in rows.decode(Int32.self) { return Int(value) }
        return perHour
    }
}
