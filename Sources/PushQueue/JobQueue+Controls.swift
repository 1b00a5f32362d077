public import Foundation
import PostgresNIO

/// A fleet-wide pause: jobs matching it are not claimed (`push.pauses`).
public struct Pause: Sendable, Hashable, Codable {
    /// The credential it pauses, or `nil` for every credential.
    public var credential: String?
    /// The topic it pauses, or `nil` for every topic.
    public var topic: String?
    /// Why, as the operator wrote it.
    public var reason: String
    /// When it was made.
    public var createdAt: Date
    /// The database role that made it.
    public var createdBy: String
    /// Pending jobs it holds now (counted only by ``JobQueue/pauses(countingJobs:)``).
    public var pendingJobs: Int?

    /// `credential=C topic=T`, with `*` for any.
    public var scope: String { "credential=\(self.credential ?? "*") topic=\(self.topic ?? "*")" }
}

/// A fleet-wide rate limit (`push.rate_limits`): a send schedule the claim fills, one interval per job.
public struct RateLimit: Sendable, Hashable, Codable {
    /// The credential it limits, or `nil` for every credential.
    public var credential: String?
    /// The topic it limits, or `nil` for every topic.
    public var topic: String?
    /// The average rate.
    public var perSecond: Double
    /// The most claimed ahead of their send times.
    public var burst: Int
    /// How many matching jobs a claim could take now (0 while the schedule is `burst` intervals ahead).
    public var available: Int

    /// `credential=C topic=T`, with `*` for any.
    public var scope: String { "credential=\(self.credential ?? "*") topic=\(self.topic ?? "*")" }
}

extension QueueOperations {
    /// Pauses claiming of the jobs matching `credential` and `topic` (`nil`: any) across the fleet; a pause of
    /// the same scope is replaced (its reason updated). Every worker stops claiming them at its next claim.
    @discardableResult
    public func pause(credential: String?, topic: String?, reason: String) async throws -> Pause {
        let rows = try await self.client.query(
            ControlsSQL.pause.query {
                $0.bind("credential", credential)
                $0.bind("topic", topic)
                $0.bind("reason", reason)
            },
            logger: self.logger
        )
        for try await (credential, topic, reason, at, by) in rows.decode((String?, String?, String, Date, String).self)
        {
            return Pause(credential: credential, topic: topic, reason: reason, createdAt: at, createdBy: by)
        }
        throw QueueError(code: .invalidArgument, message: "the pause was not recorded")
    }

    /// Lifts the pause of exactly this scope and wakes every listening worker (NOTIFY), so its jobs are
    /// claimed at once. Returns whether there was one.
    public func resume(credential: String?, topic: String?) async throws -> Bool {
        try await self.deleteScope(ControlsSQL.resume, credential: credential, topic: topic)
    }

    /// NOTIFY on the channel every worker listens on: they claim at once instead of at their next poll.
    func wakeWorkers() async throws {
        try await self.client.query(ControlsSQL.wakeWorkers.query(), logger: self.logger)
    }

    /// Sets the rate limit of this scope (replacing one there), with a full bucket, and wakes the workers.
    @discardableResult
    public func setRateLimit(
        credential: String?,
        topic: String?,
        perSecond: Double,
        burst: Int
    ) async throws
        -> RateLimit
    {
        let rows = try await self.client.query(
            ControlsSQL.setRateLimit.query {
                $0.bind("credential", credential)
                $0.bind("topic", topic)
                $0.bind("per_second", perSecond)
                $0.bind("burst", Int32(clamping: burst))
            },
            logger: self.logger
        )
        for try await (credential, topic, rate, burst, available) in rows.decode(
            (String?, String?, Double, Int32, Int64).self
        ) {
            try await self.wakeWorkers()
            return RateLimit(
                credential: credential,
                topic: topic,
                perSecond: rate,
                burst: Int(burst),
                available: Int(available)
            )
        }
        throw QueueError(code: .invalidArgument, message: "the rate limit was not recorded")
    }

    /// Removes the rate limit of exactly this scope and wakes the workers. Returns whether there was one.
    public func clearRateLimit(credential: String?, topic: String?) async throws -> Bool {
        try await self.deleteScope(ControlsSQL.clearRateLimit, credential: credential, topic: topic)
    }

    /// Deletes the row of exactly this scope from `push.pauses` or `push.rate_limits` (`statement`), then
    /// wakes the workers (NOTIFY). Returns whether there was one.
    private func deleteScope(_ statement: SQLStatement, credential: String?, topic: String?) async throws -> Bool {
        let rows = try await self.client.query(
            statement.query {
                $0.bind("credential", credential)
                $0.bind("topic", topic)
            },
            logger: self.logger
        )
        var found = false
        for try await _ in rows { found = true }
        try await self.wakeWorkers()
        return found
    }

    /// Every rate limit with what a claim could take under it now (read only: nothing is scheduled).
    public func rateLimits() async throws -> [RateLimit] {
        let rows = try await self.client.query(ControlsSQL.rateLimits.query(), logger: self.logger)
        var limits: [RateLimit] = []
        for try await (credential, topic, rate, burst, available) in rows.decode(
            (String?, String?, Double, Int32, Int64).self
        ) {
            limits.append(
                RateLimit(
                    credential: credential,
                    topic: topic,
                    perSecond: rate,
                    burst: Int(burst),
                    available: Int(available)
                )
            )
        }
        return limits
    }
}

/// What ``JobQueue/cancel(ids:coalesceKey:topic:)`` did.
public struct CancelResult: Sendable, Hashable, Codable {
    /// Jobs now `cancelled` that were waiting (`pending`): never sent.
    public var cancelled: [Int64]
    /// Jobs now `cancelled` that a worker held: it withdraws each whose request is not yet written; one
    /// already in flight completes and its outcome is recorded.
    public var heldByWorkers: [Int64]
    /// Asked-for jobs that had already ended (delivered, superseded, cancelled) or are dead letters, with
    /// their state, left as they are.
    public var ended: [String: String]
    /// Asked-for ids found nowhere.
    public var missing: [Int64]
}

extension JobQueue {
    /// The NOTIFY payload prefix that tells workers which held jobs were cancelled.
    public static let cancelNotificationPrefix = "cancel:"

    /// Which of `ids` (jobs a worker holds) an operator cancelled: each heartbeat asks, so a cancel whose
    /// NOTIFY was missed (the LISTEN connection reconnecting, a pooler) still reaches the worker.
    public func cancelled(among ids: [Int64]) async throws -> [Int64] {
        guard !ids.isEmpty else { return [] }
        var found: [Int64] = []
        for try await id in try await self.client.query(
            ControlsSQL.cancelledAmong.query { $0.bind("ids", ids) },
            logger: self.logger
        ).decode(Int64.self) {
            found.append(id)
        }
        return found
    }

    /// Cancels queued or retrying jobs, by id or by `coalesce_key` (within `topic`, if given): they end
    /// `cancelled` and are never sent. Jobs a worker holds are cancelled too, and every worker is told
    /// (NOTIFY) so it withdraws those whose request is not yet written.
    public func cancel(ids: [Int64], coalesceKey: String? = nil, topic: String? = nil) async throws -> CancelResult {
        var result = CancelResult(cancelled: [], heldByWorkers: [], ended: [:], missing: [])
        var seen = Set<Int64>()
        // Twice: a recipient's job whose fan-out committed while this statement waited for its row (asked by id
        // or by key) has children this statement's snapshot cannot see; the second statement cancels them.
        for pass in 0..<2 {
            let rows = try await self.client.query(
                ControlsSQL.cancel.query {
                    $0.bind("ids", ids)
                    $0.bind("coalesce_key", coalesceKey)
                    $0.bind("topic", topic)
                },
                logger: self.logger
            )
            for try await (id, state, _) in rows.decode((Int64, String?, Int64).self) {
                guard seen.insert(id).inserted else { continue }
                switch state {
                case "pending": result.cancelled.append(id)
                case "running": result.heldByWorkers.append(id)
                case .some(let other) where pass == 0: result.ended[String(id)] = other
                case .none where pass == 0: result.missing.append(id)
                default: break
                }
            }
        }
        result.cancelled.sort()
        result.heldByWorkers.sort()
        result.missing.sort()
        return result
    }
}

extension JobQueue {
    /// Every pause, oldest first; with `countingJobs`, how many pending jobs each holds.
    public func pauses(countingJobs: Bool = false) async throws -> [Pause] {
        let rows = try await self.client.query(
            ControlsSQL.pauses.query { $0.bind("counting_jobs", countingJobs) },
            logger: self.logger
        )
        var pauses: [Pause] = []
        for try await (credential, topic, reason, at, by, count) in rows.decode(
            (String?, String?, String, Date, String, Int64?).self
        ) {
            pauses.append(
                Pause(
                    credential: credential,
                    topic: topic,
                    reason: reason,
                    createdAt: at,
                    createdBy: by,
                    pendingJobs: count.map(Int.init)
                )
            )
        }
        return pauses
    }
}

/// The statements of `Statements/controls.sql`, with their binds in order.
enum ControlsSQL: StatementFile {
    static let file = "controls"

    static let pause = named("pause", "credential", "topic", "reason")
    static let resume = named("resume", "credential", "topic")
    static let pauses = named("pauses", "counting_jobs")
    static let setRateLimit = named("set_rate_limit", "credential", "topic", "per_second", "burst")
    static let clearRateLimit = named("clear_rate_limit", "credential", "topic")
    static let rateLimits = named("rate_limits")
    static let wakeWorkers = named("wake_workers")
    static let cancelledAmong = named("cancelled_among", "ids")
    static let cancel = named("cancel", "ids", "coalesce_key", "topic")

    static let all = [
        pause, resume, pauses, setRateLimit, clearRateLimit, rateLimits, wakeWorkers, cancelledAmong, cancel,
    ]
}
