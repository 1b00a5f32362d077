import Foundation
import PostgresNIO
import PushCore

/// A claimed job read from its row: the columns of `job_columns.sql`, by position.
extension JobQueue {
    /// The columns `decodeJob` reads, by position: the order here is the order there.
    static let jobColumns = SQLStatement.fragment("job_columns")

    /// A job from a row whose first columns are ``jobColumns``, read by position.
    static func decodeJob(_ row: PostgresRow) throws -> PushJob {
        var cursor = RowCursor(row)
        return try decodeJob(&cursor)
    }

    /// A job from the cursor's next columns, ``jobColumns`` in their order.
    static func decodeJob(_ c: inout RowCursor) throws -> PushJob {
        PushJob(
            id: try c.next(Int64.self),
            apnsID: try c.next(UUID.self),
            topic: try c.next(String.self),
            deviceToken: try c.next(String?.self),
            channelID: try c.next(String?.self),
            payload: try c.next(String.self),
            pushType: try c.next(String.self),
            priority: try c.next(Int16?.self).map(Int.init),
            environment: try c.next(String.self),
            credential: try c.next(String.self),
            collapseID: try c.next(String?.self),
            deliverOnce: try c.next(Bool.self),
            expiresAt: try c.next(Date?.self),
            runAt: try c.next(Date.self),
            maxAttempts: try c.next(Int16?.self).map(Int.init),
            attempts: Int(try c.next(Int16.self)),
            trapIDs: try c.next([String].self).map(TrapID.init(rawValue:)),
            createdAt: try c.next(Date.self),
            firstAttemptAt: try c.next(Date?.self),
            transportRetries: Int(try c.next(Int16.self)),
            claimedAt: try c.next(Date.self),
            coalesceKey: try c.next(String?.self),
            // The schema's constraint admits only these two.
            platform: Platform(rawValue: try c.next(String.self)) ?? .apns,
            traceparent: try c.next(String?.self),
            traceFirstSpan: try c.next(String?.self),
            lastAttemptAt: try c.next(Date?.self),
            lastOutcome: try c.next(String?.self),
            recipient: try c.next(String?.self),
            autoEnvironment: try c.next(Bool.self),
            activityID: try c.next(String?.self)
        )
    }
}
