public import Foundation
import PostgresNIO
import PushCore

/// A count that stays cheap on big tables: exact up to ``JobQueue/exactCountLimit`` rows, above that the
/// planner's estimate (from the last ANALYZE), or only "more than the limit" when there is none yet.
public struct BoundedCount: Sendable, Hashable {
    /// The figure to show.
    public var value: Int
    /// Whether `value` was counted (true) or estimated / a lower bound (false).
    public var exact: Bool
}

/// The queue at a glance for the operator console, read without counting whole tables.
public struct ConsoleOverview: Sendable, Hashable {
    /// Jobs waiting: due now, and scheduled for later (retries, `run_at` in the future).
    public var pendingDue: BoundedCount
    public var pendingScheduled: BoundedCount
    /// Jobs being sent now.
    public var running: BoundedCount
    /// Delivered and superseded rows still kept (retention prunes them).
    public var delivered: BoundedCount
    public var superseded: BoundedCount
    /// Dead letters.
    public var deadLetters: BoundedCount
    /// Age in seconds of the oldest due pending job; 0 when none.
    public var oldestDueAgeSeconds: Double
}

/// One row of `push.workers`.
public struct WorkerRow: Sendable, Hashable {
    public var workerID: String
    public var host: String
    public var pid: Int
    public var credentials: [String]
    public var startedAt: Date
    public var heartbeatAt: Date
    /// Set by a clean stop.
    public var stoppedAt: Date?
}

/// Outcomes of one minute: deliveries and dead letters.
public struct MinuteOutcomes: Sendable, Hashable {
    public var minute: Date
    public var delivered: Int
    public var dead: Int
}

/// Dead letters sharing a reason and the trap id they died with.
public struct DeadLetterGroup: Sendable, Hashable {
    /// The last trap id the dead letters met (the one they died with), if any.
    public var trapID: String?
    public var reason: String
    public var count: Int
    public var newest: Date
    /// The newest one's sentence (what went wrong and what to fix).
    public var example: String
    /// Set when more dead letters matched than the groups read: the counts are of the newest this many.
    public var sampledNewest: Int? = nil
}

/// Where a dead-letter page ends: the next page starts after this one (keyset pagination, newest first).
public struct DeadLetterCursor: Sendable, Hashable, LosslessStringConvertible {
    /// `dead_at` in microseconds since 1970 (exact, as Postgres stores it).
    public var deadAtMicros: Int64
    public var id: Int64

    public init(deadAtMicros: Int64, id: Int64) {
        self.deadAtMicros = deadAtMicros
        self.id = id
    }

    /// `MICROS-ID`, as it travels in a URL.
    public init?(_ text: String) {
        let parts = text.split(separator: "-", omittingEmptySubsequences: false)
        // Between 1970 and 3000: any other instant is not a dead letter's, and would overflow Postgres' interval.
        guard parts.count == 2, let micros = Int64(parts[0]), let id = Int64(parts[1]),
            (0...32_503_680_000_000_000).contains(micros)
        else { return nil }
        self.init(deadAtMicros: micros, id: id)
    }

    public var description: String { "\(self.deadAtMicros)-\(self.id)" }
}

/// One dead letter in a listing: what a table row shows, no payload, the token only as its fingerprint.
public struct DeadLetterSummary: Sendable, Hashable {
    public var id: Int64
    public var deadAt: Date
    public var reason: String
    public var status: Int?
    public var trapIDs: [String]
    public var topic: String
    public var credential: String
    public var pushType: String
    public var attempts: Int
    /// `tokenFingerprint` of the device token, or the channel id for a broadcast.
    public var target: String
    public var error: String
    /// The cursor for the page after this row.
    public var cursor: DeadLetterCursor
}

extension QueueOperations {
    /// Counts above this are estimated (``BoundedCount``).
    public static let exactCountLimit = 100_000

    /// Counts by state, the oldest due job's age: partial indexes, capped counts and the planner's estimates,
    /// so it stays fast with millions of delivered rows.
    public func consoleOverview() async throws -> ConsoleOverview {
        let cap = Self.exactCountLimit + 1
        let rows = try await self.client.query(
            JobsSQL.overview.query { $0.bind("cap", Int64(cap)) },
            logger: self.logger
        )
        for try await r in rows.decode(
            (Int64, Int64, Int64, Int64, Double, Int64, Double, Int64, Double, Double).self
        ) {
            func bounded(_ counted: Int64, _ estimated: Double? = nil) -> BoundedCount {
                if counted < cap { return BoundedCount(value: Int(counted), exact: true) }
                // reltuples is -1 before the first ANALYZE: then only "more than the limit" is known.
                if let estimated, estimated >= Double(cap) { return BoundedCount(value: Int(estimated), exact: false) }
                return BoundedCount(value: Self.exactCountLimit, exact: false)
            }
            return ConsoleOverview(
                pendingDue: bounded(r.0),
                pendingScheduled: bounded(r.1),
                running: bounded(r.2),
                delivered: bounded(r.3, r.4),
                superseded: bounded(r.5, r.6),
                deadLetters: bounded(r.7, r.8),
                oldestDueAgeSeconds: r.9
            )
        }
        throw QueueError(code: .schemaMissing, message: "the overview returned no row; run `push-worker migrate`")
    }

    /// The fleet's workers: live ones first, then the stopped, each once.
    public func workers(limit: Int = 50) async throws -> [WorkerRow] {
        let rows = try await self.client.query(
            WorkersSQL.list.query { $0.bind("limit", Int64(limit)) },
            logger: self.logger
        )
        var workers: [WorkerRow] = []
        for try await (id, host, pid, credentials, started, heartbeat, stopped) in rows.decode(
            (String, String, Int32, [String], Date, Date, Date?).self
        ) {
            workers.append(
                WorkerRow(
                    workerID: id,
                    host: host,
                    pid: Int(pid),
                    credentials: credentials,
                    startedAt: started,
                    heartbeatAt: heartbeat,
                    stoppedAt: stopped
                )
            )
        }
        return workers
    }

    /// Deliveries and dead letters per minute over the last `minutes` minutes, oldest first, every minute
    /// present. Read from the delivered and dead-at indexes: the cost follows the window's volume, not the
    /// table's size.
    public func outcomesByMinute(minutes: Int = 60) async throws -> [MinuteOutcomes] {
        let rows = try await self.client.query(
            JobsSQL.outcomesByMinute.query { $0.bind("minutes", Int32(clamping: minutes)) },
            logger: self.logger
        )
        var result: [MinuteOutcomes] = []
        for try await (minute, delivered, dead) in rows.decode((Date, Int64, Int64).self) {
            result.append(MinuteOutcomes(minute: minute, delivered: Int(delivered), dead: Int(dead)))
        }
        return result
    }

    /// Dead letters matching `filter` grouped by reason and the trap id they died with (their last), the
    /// largest groups first.
    public func deadLetterGroups(
        matching filter: DeadLetterFilter,
        newest cap: Int = QueueOperations.deadLetterGroupSample
    ) async throws -> [DeadLetterGroup] {
        let query = DeadJobsSQL.groups.query {
            $0.bind(filter)
            $0.bind("cap", Int64(cap))
        }
        let rows = try await self.client.query(query, logger: self.logger)
        var groups: [DeadLetterGroup] = []
        for try await (trap, reason, count, newest, sampled, example) in rows.decode(
            (String?, String, Int64, Date, Bool, String).self
        ) {
            groups.append(
                DeadLetterGroup(
                    trapID: trap,
                    reason: reason,
                    count: Int(count),
                    newest: newest,
                    example: example,
                    sampledNewest: sampled ? cap : nil
                )
            )
        }
        return groups
    }

    /// How many of the newest matching dead letters the groups read.
    public static let deadLetterGroupSample = 10_000

    /// A page of dead letters matching `filter`, newest first, starting after `cursor` (keyset pagination:
    /// each page costs the same however deep).
    public func deadLetterPage(
        matching filter: DeadLetterFilter,
        after cursor: DeadLetterCursor?
    ) async throws -> [DeadLetterSummary] {
        let query = DeadJobsSQL.page.query {
            $0.bind(filter)
            $0.bind("cursor_micros", cursor?.deadAtMicros)
            $0.bind("cursor_id", cursor?.id)
            $0.bind("limit", Int64(max(filter.limit, 0)))
        }
        let rows = try await self.client.query(query, logger: self.logger)
        var page: [DeadLetterSummary] = []
        for try await row in rows {
            let (
                id, deadAt, micros, reason, status, traps, topic, credential, pushType, attempts, token, channel, error
            ) =
                try row.decode(
                    (
                        Int64, Date, Int64, String, Int16?, [String], String, String, String, Int16, String?, String?,
                        String
                    ).self
                )
            page.append(
                DeadLetterSummary(
                    id: id,
                    deadAt: deadAt,
                    reason: reason,
                    status: status.map(Int.init),
                    trapIDs: traps,
                    topic: topic,
                    credential: credential,
                    pushType: pushType,
                    attempts: Int(attempts),
                    target: token.map { "token fp " + tokenFingerprint($0) } ?? channel.map { "channel " + $0 } ?? "",
                    error: error,
                    cursor: DeadLetterCursor(deadAtMicros: micros, id: id)
                )
            )
        }
        return page
    }
}
