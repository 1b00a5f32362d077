import Foundation
import PostgresNIO
public import PushCore

/// What a claim leaves pending, typed until the statement binds it (as `environment/credential` and
/// `credential/topic` strings).
public struct ClaimExclusions: Sendable, Equatable {
    /// APNs environments down: their jobs wait.
    public var environments: [String]
    /// (environment, credential) pairs whose jobs wait: a pool backing off, a credential refused, a
    /// credential this worker cannot sign for, an FCM project down.
    public var endpoints: [EndpointKey]
    /// (credential, topic) pairs APNs refused.
    public var topics: [TopicKey]

    public init(environments: [String] = [], endpoints: [EndpointKey] = [], topics: [TopicKey] = []) {
        self.environments = environments
        self.endpoints = endpoints
        self.topics = topics
    }
}

extension JobQueue {
    /// Claims up to `limit` due jobs for `workerID`: marks them `running`, counts the attempt, and sets a
    /// lease until now + `lease`. Credentials take turns (a backlog of one never delays another's due jobs
    /// beyond one batch); within a credential, send priority 10, 5 and 1 share the batch 8 : 2 : 1 when all
    /// are due (strict priority otherwise starves the lower ones), each oldest `run_at` first.
    ///
    /// Concurrent claimers never get the same job: rows are picked `FOR NO KEY UPDATE SKIP LOCKED` in a
    /// materialized CTE and updated in the same statement.
    ///
    /// - Parameters:
    ///   - limit: at most this many jobs (the sender's free capacity).
    ///   - workerID: the claimer's name, written to `locked_by` and required by every outcome write.
    ///   - lease: how long the claim holds before the reaper may return the job to `pending`; longer
    ///     than the request deadline.
    ///   - excludingCredentials: credentials whose jobs must stay pending (paused after a credential fault).
    ///   - onlyCredentials: the credentials this worker can sign for; `nil` claims any.
    ///   - excluding: environments, (environment, credential) pairs and (credential, topic) pairs whose jobs
    ///     wait (a provider down, a pool backing off, a credential or topic refused).
    ///   - excludingIDs: jobs this worker still holds (an outcome not yet written): never claimed twice.
    /// - Returns: the claimed jobs, in claim order, with `attempts` counting this attempt.
    public func claim(
        limit: Int,
        workerID: String,
        lease: Duration,
        excludingCredentials: [String] = [],
        onlyCredentials: [String]? = nil,
        excluding: ClaimExclusions = ClaimExclusions(),
        excludingIDs: [Int64] = []
    ) async throws -> [PushJob] {
        try await self.claimBatch(
            limit: limit,
            workerID: workerID,
            lease: lease,
            excludingCredentials: excludingCredentials,
            onlyCredentials: onlyCredentials,
            excluding: excluding,
            excludingIDs: excludingIDs
        ).jobs
    }

    /// What one claim did: the jobs it claimed, how many older jobs it superseded (`coalesce_key`), and
    /// how soon a rate limit's schedule has room again.
    public struct ClaimBatch: Sendable {
        /// The claimed jobs, in claim order.
        public var jobs: [PushJob]
        /// Older due jobs that share a claimed job's `coalesce_key`: now `superseded`, never sent.
        public var superseded: Int
        /// When a rate limit's schedule is full: how long until it has room again (claim again then).
        public var rateLimitedFor: Duration?
        /// A range of the claim gave its whole share: more due work is likely waiting, claim again at once
        /// (a busy credential's share grows once the others have nothing due).
        public var mayHaveMore: Bool = false
        /// A walk of topics spent its budget before coming round: topics after where it stopped were not looked
        /// at. Claim again soon even if this claim took nothing (what it walked was paused or not due), but not
        /// without end: a queue whose topics are all waiting walks round and round.
        public var walkIncomplete = false
    }

    /// Where the queue's walk of topics stopped, per (credential, environment): the next claim starts after
    /// that topic, so every topic with due work takes its turn whatever their number, and one claim reads at
    /// most a batch's worth of topics. One per queue (the worker's claim loop is its only claimer); an empty
    /// cursor starts at the first topic.
    struct ClaimCursor: Sendable {
        /// (credential, environment, last topic walked), one per pair that had pending jobs.
        var stops: [(credential: String, environment: String, topic: String)] = []
        /// Where each busy range (credential, environment, topic, priority) goes on: after the last job this
        /// claimer took there, while the range keeps giving its whole share. The entries of jobs claimed since
        /// the last vacuum lie before it; a scan from the head steps over every one of them.
        /// A point lives a second from when its range was last read from its head (``headInterval``), so a
        /// job a resumed scan passed (locked by another statement then, or enqueued with a `run_at` already
        /// past) waits about a second, whatever else the claims read meanwhile.
        var resumes: [RangeKey: ResumePoint] = [:]

        /// One claim range.
        struct RangeKey: Hashable {
            var credential: String
            var environment: String
            var topic: String
            var priority: Int16
        }

        /// A job's place in its range's order: `run_at` (microseconds since 1970, exact) and id; and when its
        /// range was last read from its head.
        struct ResumePoint {
            var runAtMicros: Int64
            var id: Int64
            var headReadAt: ContinuousClock.Instant
        }

        /// How long a range is read from a resume point before it is read from its head again.
        static let headInterval: Duration = .seconds(1)
        /// This cursor's: ``headInterval`` but in tests that need a longer one on a loaded machine.
        var headInterval = Self.headInterval
        /// At most this many resume points are kept and sent (a claim reports one only for a range that gave a
        /// share of 8 or more): the claim joins them to the topics it walks. Past it, the ones whose ranges
        /// were read from their heads longest ago go.
        static let maximumResumes = 64

        /// The points a claim at `now` starts from: those whose ranges were read from their heads within
        /// ``headInterval``.
        func livePoints(at now: ContinuousClock.Instant) -> [RangeKey: ResumePoint] {
            self.resumes.filter { now - $0.value.headReadAt < self.headInterval }
        }

        /// The points after a claim at `now` that started from `sent` reported `reported` (id 0: the range
        /// goes back to its head): a reported point keeps its range's head read time when the claim resumed
        /// it, else it starts now; points not reported stay while they live.
        func updated(
            sent: [RangeKey: ResumePoint],
            reported: [(RangeKey, runAtMicros: Int64, id: Int64)],
            at now: ContinuousClock.Instant
        ) -> [RangeKey: ResumePoint] {
            var points = sent
            for (key, runAt, id) in reported {
                points[key] =
                    id > 0
                    ? ResumePoint(runAtMicros: runAt, id: id, headReadAt: sent[key]?.headReadAt ?? now) : nil
            }
            if points.count > Self.maximumResumes {
                for (key, _) in points.sorted(by: { $0.value.headReadAt < $1.value.headReadAt })
                    .prefix(points.count - Self.maximumResumes)
                {
                    points[key] = nil
                }
            }
            return points
        }

        /// The stops a claim reported, with this cursor's stops for the pairs that claim did not walk (left
        /// out for a moment: backing off, paused, nothing pending), so those go on where they were.
        func merged(with walked: [(credential: String, environment: String, topic: String)]) -> ClaimCursor {
            let seen = Set(walked.map { [$0.credential, $0.environment] })
            var merged = self
            merged.stops = walked + self.stops.filter { !seen.contains([$0.credential, $0.environment]) }
            return merged
        }
    }

    /// ``claim(limit:workerID:lease:excludingCredentials:onlyCredentials:excluding:excludingIDs:)``
    /// with what else the claim did. Besides the turns and priorities, the fleet-wide controls apply here,
    /// in the same statement:
    ///
    /// - `push.pauses`: a paused credential is left out of the ranges (its backlog is never read); a paused
    ///   topic's jobs are skipped.
    /// - `push.rate_limits`: each limit (the most specific row matching the job's credential and topic) is a
    ///   fleet-wide schedule: a claimed job gets the next send time (`sendAt`, one interval after the previous
    ///   one), and a limit takes jobs only while those times fall within `burst` intervals of now.
    /// - `coalesce_key`: only the newest due pending job of a key is claimable; claiming it marks the older
    ///   due ones `superseded`. A job already running is never touched.
    /// - Dead tokens: each claimed job carries `tokenInvalidatedAt` when its token died after it was enqueued.
    ///
    /// `includingRateLimited: false` leaves every rate-limited job for later: a worker with a backlog of
    /// sends passes it, so the spacing the bucket gives the claims survives into the requests.
    public func claimBatch(
        limit: Int,
        workerID: String,
        lease: Duration,
        excludingCredentials: [String] = [],
        onlyCredentials: [String]? = nil,
        excluding: ClaimExclusions = ClaimExclusions(),
        excludingIDs: [Int64] = [],
        includingRateLimited: Bool = true
    ) async throws -> ClaimBatch {
        guard limit > 0 else { return ClaimBatch(jobs: [], superseded: 0, rateLimitedFor: nil, mayHaveMore: false) }
        let walkFrom = self.claimCursor.value
        let leaseSeconds = Double(lease.components.seconds) + Double(lease.components.attoseconds) / 1e18
        var binds = NamedBindings(for: ClaimStatement.statement)
        binds.bind("only_credentials", onlyCredentials ?? [])
        binds.bind("any_credential", onlyCredentials == nil)
        binds.bind("excluded_credentials", excludingCredentials)
        binds.bind("half_lease_seconds", leaseSeconds / 2)
        binds.bind("excluded_environments", excluding.environments)
        binds.bind("excluded_pairs", excluding.endpoints.map(\.description))
        binds.bind("held_ids", excludingIDs)
        binds.bind("include_rate_limited", includingRateLimited)
        binds.bind("batch_limit", Int64(limit))
        binds.bind("worker_id", workerID)
        binds.bind("lease_seconds", leaseSeconds)
        binds.bind("excluded_topics", excluding.topics.map(\.description))
        binds.bind("cursor_credentials", walkFrom.stops.map(\.credential))
        binds.bind("cursor_environments", walkFrom.stops.map(\.environment))
        binds.bind("cursor_topics", walkFrom.stops.map(\.topic))
        var nextCursor = walkFrom
        let now = self.clock.now
        // Released jobs keep their run_at: after a release, every range from its head.
        let resumeFrom = self.claimCursor.takeHeadRequest() ? [:] : walkFrom.livePoints(at: now)
        var reported: [(ClaimCursor.RangeKey, runAtMicros: Int64, id: Int64)] = []
        let resumes = Array(resumeFrom)
        binds.bind("resume_credentials", resumes.map(\.key.credential))
        binds.bind("resume_environments", resumes.map(\.key.environment))
        binds.bind("resume_topics", resumes.map(\.key.topic))
        binds.bind("resume_priorities", resumes.map(\.key.priority))
        binds.bind("resume_run_ats", resumes.map(\.value.runAtMicros))
        binds.bind("resume_ids", resumes.map(\.value.id))
        var walkCut = false
        var superseded = 0
        var limitedMs: Int64?
        var more = false
        // Claimed, but a newer job of the same key was claimed meanwhile by another worker: never sent.
        var stale: [(id: Int64, attempt: Int, by: Int64)] = []
        var jobs: [PushJob] = []
        jobs.reserveCapacity(limit)
        var undecodable: [(id: Int64, attempt: Int, error: String)] = []
        func read(_ row: PostgresRow) throws {
            var cursor = RowCursor(row)
            superseded = Int(try cursor.next(Int64.self))
            limitedMs = try cursor.next(Int64?.self)
            more = try cursor.next(Bool.self)
            walkCut = try cursor.next(Bool.self)
            // On the first row only.
            let (credentials, environments, topics) = (
                try cursor.next([String]?.self), try cursor.next([String]?.self), try cursor.next([String]?.self)
            )
            if let credentials, let environments, let topics, credentials.count == environments.count,
                credentials.count == topics.count
            {
                nextCursor = nextCursor.merged(
                    with: (0..<topics.count).map { (credentials[$0], environments[$0], topics[$0]) }
                )
            }
            // On the first row only: the ranges read whose point is new or goes (id 0: from its head).
            let (rCredentials, rEnvironments, rTopics) = (
                try cursor.next([String]?.self), try cursor.next([String]?.self), try cursor.next([String]?.self)
            )
            let (rPriorities, rRunAts, rIDs) = (
                try cursor.next([Int16]?.self), try cursor.next([Int64]?.self), try cursor.next([Int64]?.self)
            )
            if let rCredentials, let rEnvironments, let rTopics, let rPriorities, let rRunAts, let rIDs,
                Set([rCredentials.count, rEnvironments.count, rTopics.count, rPriorities.count, rRunAts.count]) == [
                    rIDs.count
                ]
            {
                for n in rIDs.indices {
                    let key = ClaimCursor.RangeKey(
                        credential: rCredentials[n],
                        environment: rEnvironments[n],
                        topic: rTopics[n],
                        priority: rPriorities[n]
                    )
                    reported.append((key, rRunAts[n], rIDs[n]))
                }
            }
            let supersededBy = try cursor.next(Int64?.self)
            let tokenInvalidatedAt = try cursor.next(Date?.self)
            let sendIn = try cursor.next(Double?.self)
            let sendScope = try cursor.next(Int64?.self)
            let sendInterval = try cursor.next(Double?.self)
            // The one row of a claim that took nothing carries only the counts.
            if cursor.nextIsNull() { return }
            do {
                var job = try Self.decodeJob(&cursor)
                job.tokenInvalidatedAt = tokenInvalidatedAt
                // Relative to the row's database clock (db_now): the claim loop turns it into its own clock.
                job.sendAt = sendIn.flatMap { seconds in job.claimedAt.map { $0.addingTimeInterval(seconds) } }
                if let sendScope, let sendInterval {
                    job.sendSpacing = SendSpacing(scope: sendScope, interval: sendInterval)
                }
                if let supersededBy {
                    stale.append((job.id, job.attempts, supersededBy))
                } else {
                    jobs.append(job)
                }
            } catch {
                let c = row.makeRandomAccess()
                // A row the schema let through but Swift cannot read: it must not fail its batch (the claim
                // has committed). It goes to the dead letters, fenced by its attempt, with what was wrong.
                undecodable.append(
                    (try c["id"].decode(Int64.self), Int(try c["attempts"].decode(Int16.self)), "\(error)")
                )
            }
        }
        try await self.forEachRow(of: ClaimStatement.self, binds: binds.complete, read)
        // This process's instant of the claim's database clock (claimedAt), within half the round trip: the
        // middle of it. Database times of the job (its previous attempt) map to this process's clock from here.
        let answered = self.clock.now
        for index in jobs.indices { jobs[index].claimedLocally = now + (answered - now) / 2 }
        nextCursor.resumes = walkFrom.updated(sent: resumeFrom, reported: reported, at: now)
        self.claimCursor.value = nextCursor
        if !stale.isEmpty {
            superseded += try await self.supersedeClaimed(stale, workerID: workerID)
        }
        for row in undecodable {
            let outcome = JobOutcome(
                jobID: row.id,
                attempt: row.attempt,
                disposition: .dead(sentence: ""),
                attemptedAt: self.clock.now,
                reason: "InvalidJob",
                sent: false
            )
            _ = try await self.deadLetterUnwritable(
                outcome,
                workerID: workerID,
                sentence:
                    "the worker could not read this row (\(row.error.prefix(200))): fix the producer and insert it again."
            )
        }
        return ClaimBatch(
            jobs: jobs,
            superseded: superseded,
            rateLimitedFor: limitedMs.map { .milliseconds(max($0, 1)) },
            mayHaveMore: more,
            walkIncomplete: walkCut
        )
    }
}

extension JobQueue {
    /// Ends claimed jobs `superseded` without a request: a newer job of the same key was claimed by another
    /// worker while this claim ran. Fenced on (id, attempt, worker); the attempt is not counted.
    ///
    /// - Returns: how many were superseded.
    func supersedeClaimed(_ jobs: [(id: Int64, attempt: Int, by: Int64)], workerID: String) async throws -> Int {
        let sorted = jobs.sorted { $0.id < $1.id }
        var count = 0
        for try await _ in try await self.client.query(
            JobsSQL.supersedeClaimed.query {
                $0.bind("ids", sorted.map(\.id))
                $0.bind("attempts", sorted.map { Int16(clamping: $0.attempt) })
                $0.bind("by", sorted.map(\.by))
                $0.bind("worker_id", workerID)
            },
            logger: self.logger
        ) {
            count += 1
        }
        return count
    }

    /// How long until the next pending job falls due, on the database's clock (zero if one is due now),
    /// or `nil` when none is pending.
    public func untilNextDue() async throws -> Duration? {
        let rows = try await self.client.query(JobsSQL.untilNextDue.query(), logger: self.logger)
        for try await ms in rows.decode(Int64?.self) { return ms.map { .milliseconds(max($0, 0)) } }
        return nil
    }
}

/// The claim (`Statements/claim.sql`), prepared once per connection. Planning the claim cost 1.6 ms per call (16 µs per
/// job at the drain's 95 jobs per claim); the worker's sessions run with `plan_cache_mode =
/// force_generic_plan` (``JobQueue/workerSessionSettings``), so it is planned once per connection.
enum ClaimStatement: BatchStatement {
    static let name = "push_claim_v7"
    /// `Statements/claim.sql` with its binds in order.
    static let statement = SQLStatement(
        file: "claim",
        binds: [
            "only_credentials", "any_credential", "excluded_credentials", "half_lease_seconds",
            "excluded_environments", "excluded_pairs", "held_ids", "include_rate_limited", "batch_limit", "worker_id",
            "lease_seconds", "excluded_topics", "cursor_credentials", "cursor_environments", "cursor_topics",
            "resume_credentials", "resume_environments", "resume_topics", "resume_priorities", "resume_run_ats",
            "resume_ids",
        ]
    )
    static var sql: String { Self.statement.sql }
}
