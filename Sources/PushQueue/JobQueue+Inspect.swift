import Foundation
import PostgresNIO
import PushCore

extension QueueOperations {
    /// One job by id with its outcome, or `nil` (it may have moved to `push.dead_jobs`).
    public func job(id: Int64) async throws -> JobDetails? {
        let rows = try await self.client.query(JobsSQL.show.query { $0.bind("id", id) }, logger: self.logger)
        var found: JobDetails?
        for try await row in rows where found == nil {
            let job = try JobQueue.decodeJob(row)
            let c = row.makeRandomAccess()
            found = JobDetails(
                job: job,
                state: JobState(rawValue: try c["state"].decode(String.self)) ?? .pending,
                status: try c["status"].decode(Int16?.self).map(Int.init),
                reason: try c["reason"].decode(String?.self),
                apnsUniqueID: try c["apns_unique_id"].decode(String?.self),
                deliveredAt: try c["delivered_at"].decode(Date?.self),
                lastAttemptAt: try c["last_attempt_at"].decode(Date?.self),
                latencyMs: try c["latency_ms"].decode(Int32?.self).map(Int.init),
                lockedBy: try c["locked_by"].decode(String?.self),
                lockedUntil: try c["locked_until"].decode(Date?.self),
                supersededBy: try c["superseded_by"].decode(Int64?.self),
                providerMessageID: try c["provider_message_id"].decode(String?.self),
                historyJSON: try c["history_json"].decode(String.self),
                rowJSON: try c["row_json"].decode(String.self)
            )
        }
        guard var details = found else { return nil }
        // A recipient's job: its children (a second statement, once the first's rows are read).
        if details.state == .fannedOut {
            let children = try await self.client.query(
                JobsSQL.children.query { $0.bind("id", id) },
                logger: self.logger
            )
            for try await (child, state, token, environment, reason) in children.decode(
                (Int64, String, String?, String?, String?).self
            ) {
                details.children.append(
                    JobDetails.Child(
                        id: child,
                        state: state,
                        tokenFingerprint: token.map(PushCore.tokenFingerprint) ?? "-",
                        environment: environment ?? "-",
                        reason: reason
                    )
                )
            }
        }
        return details
    }

    /// Counts by state, the oldest due job's age, dead letters by trap and last-minute throughput, in one
    /// statement.
    public func stats() async throws -> QueueStats {
        let rows = try await self.client.query(JobsSQL.stats.query(), logger: self.logger)
        for try await r in rows.decode((String, Int64, Double, Int64, String, Int64, Int64, Int64).self) {
            var byState = Dictionary(uniqueKeysWithValues: JobState.allCases.map { ($0.rawValue, 0) })
            var byPlatform: [String: [String: Int]] = [:]
            for (key, count) in try JSONDecoder().decode([String: Int].self, from: Data(r.0.utf8)) {
                let parts = key.split(separator: "/", maxSplits: 1).map(String.init)
                guard parts.count == 2 else { continue }
                byState[parts[1], default: 0] += count
                byPlatform[parts[0], default: [:]][parts[1]] = count
            }
            return QueueStats(
                byState: byState,
                pendingDue: Int(r.1),
                oldestPendingAgeSeconds: r.2,
                deadLetters: Int(r.3),
                deadByTrap: try JSONDecoder().decode([String: Int].self, from: Data(r.4.utf8)),
                deliveredLastMinute: Int(r.5),
                deadLastMinute: Int(r.6),
                invalidTokens: Int(r.7),
                byPlatform: byPlatform
            )
        }
        throw QueueError(code: .schemaMissing, message: "stats returned no row; run `push-worker migrate`")
    }
}

/// The queue gauges a worker publishes, read cheaply (partial indexes, no scan of delivered rows).
public struct QueueGauges: Sendable, Hashable {
    /// Pending jobs (due or not).
    public var pending: Int
    /// Running jobs.
    public var running: Int
    /// Age in seconds of the oldest due pending job; 0 when none.
    public var oldestDueAgeSeconds: Double
    /// Dead letters: exact below 100,000, the planner's estimate above (a gauge, not an invoice).
    public var deadLetters: Int
    /// The fleet-wide pauses, each with its age.
    public var pauses: [Pause] = []
    /// The fleet-wide rate limits, with their buckets now.
    public var rateLimits: [RateLimit] = []
    /// Age in seconds of the oldest due webhook delivery of an enabled hook (due and not taken: no sender
    /// keeps up, or none runs); 0 when none.
    public var webhookOldestDueAgeSeconds: Double = 0
}

extension JobQueue {
    /// The queue gauges, read by one worker of the fleet: the live worker with the smallest id (so a fleet
    /// of fifty does not count the queue fifty times every 15 s). Returns `nil` for every other worker.
    ///
    /// Pending and running are counted from their partial indexes and the oldest due job is one probe per
    /// claim range; delivered rows are never read (`stats`, for the CLI, counts those).
    public func gauges(workerID: String, staleAfter: Duration) async throws -> QueueGauges? {
        let stale = Double(staleAfter.components.seconds)
        let rows = try await self.client.query(
            JobsSQL.gauges.query {
                $0.bind("stale_seconds", stale)
                $0.bind("worker_id", workerID)
            },
            logger: self.logger
        )
        for try await (pending, running, age, dead, pausesJSON, limitsJSON, outboxAge) in rows.decode(
            (Int64, Int64, Double, Int64, String, String, Double).self
        ) {
            struct PauseRow: Decodable {
                var credential: String?
                var topic: String?
                var reason: String
                var created_at: Double
                var created_by: String
            }
            struct LimitRow: Decodable {
                var credential: String?
                var topic: String?
                var per_second: Double
                var burst: Int
                var available: Int
            }
            let pauses = try JSONDecoder().decode([PauseRow].self, from: Data(pausesJSON.utf8)).map {
                Pause(
                    credential: $0.credential,
                    topic: $0.topic,
                    reason: $0.reason,
                    createdAt: Date(timeIntervalSince1970: $0.created_at),
                    createdBy: $0.created_by
                )
            }
            let limits = try JSONDecoder().decode([LimitRow].self, from: Data(limitsJSON.utf8)).map {
                RateLimit(
                    credential: $0.credential,
                    topic: $0.topic,
                    perSecond: $0.per_second,
                    burst: $0.burst,
                    available: $0.available
                )
            }
            return QueueGauges(
                pending: Int(pending),
                running: Int(running),
                oldestDueAgeSeconds: age,
                deadLetters: Int(dead),
                pauses: pauses,
                rateLimits: limits,
                webhookOldestDueAgeSeconds: outboxAge
            )
        }
        return nil
    }
}
