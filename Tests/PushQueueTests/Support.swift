import Foundation
import PostgresNIO
import PushQueue
import PushQueueTesting

/// A producer's INSERT, as plain SQL text, returning the new ids.
func enqueue(
    _ db: TestDatabase,
    count: Int = 1,
    topic: String = "com.example.app",
    pushType: String = "alert",
    priority: Int? = nil,
    runAt: String = "now()",
    extra: String = ""
) async throws -> [Int64] {
    let priorityValue = priority.map(String.init) ?? "NULL"
    return try await db.int64s(
        PostgresQuery(
            unsafeSQL: """
                INSERT INTO push.jobs (topic, device_token, payload, push_type, priority, run_at)
                SELECT '\(topic)', lpad(to_hex(g), 64, 'a'), '{"aps":{"alert":"hi"}}', '\(pushType)', \(priorityValue), \(runAt)
                  FROM generate_series(1, \(count)) AS g
                RETURNING id
                """
        )
    )
}

/// A worker name unique to one test.
func workerName(_ label: String = "w") -> String { "\(label)-\(UInt32.random(in: 0...UInt32.max))" }
