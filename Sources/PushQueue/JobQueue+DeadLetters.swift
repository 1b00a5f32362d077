import Foundation
import PostgresNIO
import PushCore

extension QueueOperations {
    /// Dead letters matching `filter`, newest first.
    public func deadLetters(matching filter: DeadLetterFilter) async throws -> [DeadLetter] {
        var query: PostgresQuery = """
            SELECT \(unescaped: Self.deadColumns) FROM push.dead_jobs AS j WHERE
            """
        query.sql += " " + Self.appendFilter(filter, to: &query.binds)
        query.sql += " ORDER BY j.dead_at DESC, j.id DESC LIMIT \(max(filter.limit, 0))"
        var letters: [DeadLetter] = []
        for try await row in try await self.client.query(query, logger: self.logger) {
            letters.append(try Self.decodeDeadLetter(row))
        }
        return letters
    }

    /// One dead letter by id, or `nil`.
    public func deadLetter(id: Int64) async throws -> DeadLetter? {
        try await self.deadLetters(matching: DeadLetterFilter(ids: [id], limit: 1)).first
    }

    /// Moves matching dead letters back to `push.jobs` as `pending`, due now, with attempts, status,
    /// reason and trap ids reset, the history kept (plus a `replayed` entry) and the same `apns_id`
    /// unless `newAPNsID`. With `dryRun` nothing moves and the result lists what would.
    ///
    /// A dead letter whose id or `apns_id` is already in `push.jobs` is skipped, never dropped.
    /// - Parameter expiresIn: a new `expires_at`, this long from now, for every replayed job (a job whose
    ///   `expires_at` has passed would otherwise die `Expired` again at once).
    public func replay(
        matching filter: DeadLetterFilter,
        newAPNsID: Bool = false,
        expiresIn: Duration? = nil,
        dryRun: Bool = false
    ) async throws -> ReplayResult {
        let newExpiry = expiresIn.map { "now() + make_interval(secs => \(Double($0.components.seconds)))" } ?? "NULL"
        var binds = PostgresBindings()
        let condition = Self.appendFilter(filter, to: &binds)
        let conflict =
            "EXISTS (SELECT 1 FROM push.jobs AS x WHERE x.id = j.id OR (NOT \(newAPNsID) AND x.apns_id = j.apns_id))"
        // A dead letter that breaks a rule the schema checks at INSERT (from before it did) cannot go back:
        // it is reported with the rule, and the others move.
        let broken = """
            push.broken_rule(j.platform, j.environment, j.topic, j.device_token, j.channel_id, j.payload, j.push_type, j.priority,
                             j.collapse_id, j.credential, now(), coalesce(\(newExpiry), j.expires_at))
            """
        // A keyed dead letter whose key has a job above its id that carries an older state (a superseded job
        // revived after this one died, or replayed before it) and none that carries a newer one goes out under
        // a new id above them: latest-wins orders by id, and this is the newest state that can still arrive.
        // The state a job carries is as old as the oldest id in its history (`previous_id` of a revive or of a
        // renumbered replay), the dead letter's own included (it may have been renumbered before).
        func order(_ job: String) -> String {
            """
            coalesce((SELECT min((e->>'previous_id')::bigint) FROM jsonb_array_elements(\(job).history) AS e
                       WHERE e->>'outcome' IN ('revived', 'replayed') AND e ? 'previous_id'), \(job).id)
            """
        }
        let renumber = """
            (j.coalesce_key IS NOT NULL AND EXISTS (
                SELECT 1 FROM push.jobs AS n
                 WHERE n.coalesce_key = j.coalesce_key AND n.topic = j.topic AND n.environment = j.environment
                   AND n.id > j.id AND n.state IN ('pending', 'running', 'delivered'))
             AND NOT EXISTS (
                SELECT 1 FROM push.jobs AS n
                 WHERE n.coalesce_key = j.coalesce_key AND n.topic = j.topic AND n.environment = j.environment
                   AND n.id > j.id AND n.state IN ('pending', 'running', 'delivered')
                   AND \(order("n")) > \(order("j"))))
            """
        // Dead letters of one key replayed together keep their order: once one is renumbered, every later one
        // of its key is too (else the renumbered older one would go out above a newer one left at its id).
        let renumberedInOrder = """
            (coalesce_key IS NOT NULL
             AND bool_or(renumber) OVER (PARTITION BY topic, environment, coalesce_key ORDER BY id))
            """
        // Two dead letters sharing an apns_id (from before apns_ids were kept unique): the first moves, the
        // others are reported as conflicts.
        let duplicate = "(NOT \(newAPNsID) AND row_number() OVER (PARTITION BY apns_id ORDER BY id) > 1)"
        let sql: String
        if dryRun {
            sql = """
                SELECT id, apns_id, reason, conflicted OR \(duplicate), coalesce(\(newExpiry), expires_at) < now(), broken,
                       NULL::bigint, \(renumberedInOrder)
                  FROM (SELECT j.id, j.apns_id, j.reason, j.expires_at, \(conflict) AS conflicted, \(broken) AS broken,
                               j.topic, j.environment, j.coalesce_key, \(renumber) AS renumber
                          FROM push.dead_jobs AS j
                         WHERE \(condition) ORDER BY j.id LIMIT \(max(filter.limit, 0))) AS c
                 ORDER BY id
                """
        } else {
            sql = """
                WITH candidates AS MATERIALIZED (
                    SELECT j.id, j.apns_id, \(conflict) AS conflicted, \(broken) AS broken, j.topic, j.environment,
                           j.coalesce_key, \(renumber) AS renumber
                      FROM push.dead_jobs AS j
                     WHERE \(condition) ORDER BY j.id LIMIT \(max(filter.limit, 0))
                     FOR UPDATE OF j SKIP LOCKED
                ), ranked AS (
                    SELECT id, conflicted OR \(duplicate) AS conflicted, broken, \(renumberedInOrder) AS renumber
                      FROM candidates
                ), moved AS (
                    DELETE FROM push.dead_jobs AS d USING ranked AS c
                     WHERE d.id = c.id AND NOT c.conflicted AND c.broken IS NULL
                    RETURNING d.*
                ), inserted AS (
                    -- With a new apns_id, the old one stays spent in push.apns_ids: an outbox retry of it is
                    -- not sent; the new one joins the ledger through the insert trigger.
                    INSERT INTO push.jobs (
                        id, topic, device_token, channel_id, payload, push_type, priority, environment, credential,
                        collapse_id, expires_at, run_at, apns_id, max_attempts, created_at, history, deliver_once,
                        coalesce_key, platform, traceparent, trace_first_span)
                    OVERRIDING SYSTEM VALUE
                    -- In id order, so that renumbered jobs of one key keep their order (nextval is volatile:
                    -- evaluated after the sort).
                    SELECT CASE WHEN c.renumber THEN nextval(pg_get_serial_sequence('push.jobs', 'id')) ELSE m.id END,
                           topic, device_token, channel_id, payload, push_type, priority, environment, credential,
                           collapse_id, coalesce(\(newExpiry), expires_at), now(),
                           CASE WHEN \(newAPNsID) THEN gen_random_uuid() ELSE apns_id END,
                           max_attempts, created_at,
                           history || jsonb_build_array(jsonb_build_object(
                               'outcome', 'replayed', 'at', now(), 'dead_reason', reason,
                               'previous_apns_id', apns_id, 'attempts_before', attempts)
                               || CASE WHEN c.renumber THEN jsonb_build_object('previous_id', m.id) ELSE '{}' END),
                           deliver_once, coalesce_key, platform, traceparent, trace_first_span
                      FROM moved AS m JOIN ranked AS c USING (id)
                     ORDER BY m.id
                    RETURNING id, coalesce((history->-1->>'previous_id')::bigint, id) AS dead_id, apns_id,
                              expires_at < now() AS expired
                )
                SELECT m.id, i.apns_id, m.reason, false, i.expired, NULL::text, i.id, i.id <> m.id
                  FROM inserted AS i JOIN moved AS m ON m.id = i.dead_id
                UNION ALL
                SELECT c.id, NULL, NULL, c.conflicted, NULL, c.broken, NULL, false FROM ranked AS c
                 WHERE c.conflicted OR c.broken IS NOT NULL
                """
        }
        let query = PostgresQuery(unsafeSQL: sql, binds: binds)
        let logger = self.logger
        // The producers' INSERT trigger skips an apns_id held by a dead letter and resets the worker's
        // columns; a replay is the worker's own insert, marked for its transaction.
        let results = try await self.client.withTransaction(logger: logger) { connection in
            if !dryRun {
                try await connection.query("SELECT set_config('push.internal_insert', 'on', true)", logger: logger)
            }
            var results: [(Int64, UUID?, String?, Bool, Bool?, String?, Int64?, Bool)] = []
            for try await row in try await connection.query(query, logger: logger)
                .decode((Int64, UUID?, String?, Bool, Bool?, String?, Int64?, Bool).self)
            {
                results.append(row)
            }
            return results
        }
        var moved: [ReplayResult.Moved] = []
        var skipped: [Int64] = []
        var invalid: [ReplayResult.Invalid] = []
        for (id, apnsID, reason, conflicted, expired, broken, queuedAs, renumbered) in results {
            if let broken {
                invalid.append(.init(id: id, rule: broken))
            } else if conflicted {
                skipped.append(id)
            } else if let apnsID {
                moved.append(
                    .init(
                        id: id,
                        apnsID: apnsID,
                        reason: reason ?? "",
                        expired: expired ?? false,
                        queuedAs: queuedAs,
                        renumbered: renumbered
                    )
                )
            }
        }
        return ReplayResult(
            moved: moved.sorted { $0.id < $1.id },
            skippedInvalid: invalid.sorted { $0.id < $1.id },
            skippedConflicts: skipped.sorted(),
            dryRun: dryRun
        )
    }

    /// Deletes dead letters that died more than `age` ago, in bounded batches.
    ///
    /// - Returns: how many were deleted.
    @discardableResult
    public func purgeDeadLetters(olderThan age: Duration, batchSize: Int = 5_000) async throws -> Int {
        let seconds = Double(age.components.seconds)
        return try await self.queue.deleteInBatches(
            of: batchSize,
            DeadJobsSQL.purgeOlder.query {
                $0.bind("age_seconds", seconds)
                $0.bind("batch_size", Int64(batchSize))
            }
        )
    }

    /// Deletes the dead letters that died before `cutoffMicros` (microseconds since 1970, exact), in bounded
    /// batches: a purge confirmed from a preview deletes what the preview counted, however long it was open.
    ///
    /// - Returns: how many were deleted.
    @discardableResult
    public func purgeDeadLetters(diedBeforeMicros cutoffMicros: Int64, batchSize: Int = 5_000) async throws -> Int {
        try await self.queue.deleteInBatches(
            of: batchSize,
            DeadJobsSQL.purgeDiedBefore.query {
                $0.bind("cutoff_micros", cutoffMicros)
                $0.bind("batch_size", Int64(batchSize))
            }
        )
    }

    /// Appends the binds of `filter` and returns the SQL condition over alias `j` that uses them.
    static func appendFilter(_ filter: DeadLetterFilter, to binds: inout PostgresBindings) -> String {
        var conditions = ["true"]
        func bind<T: PostgresDynamicTypeEncodable>(_ value: T) -> String {
            binds.append(value)
            return "$\(binds.count)"
        }
        if !filter.ids.isEmpty { conditions.append("j.id = ANY (\(bind(filter.ids))::bigint[])") }
        // Containment, not `= ANY`: the GIN index on trap_ids answers it.
        if let trap = filter.trapID { conditions.append("j.trap_ids @> ARRAY[\(bind(trap))::text]") }
        switch filter.lastTrap {
        case .none: break
        case .some(.none): conditions.append("cardinality(j.trap_ids) = 0")
        case .some(.some(let trap)):
            conditions.append("j.trap_ids[array_upper(j.trap_ids, 1)] = \(bind(trap))::text")
        }
        if let reason = filter.reason { conditions.append("j.reason = \(bind(reason))::text") }
        if let topic = filter.topic { conditions.append("j.topic = \(bind(topic))::text") }
        if let since = filter.since { conditions.append("j.dead_at >= \(bind(since))::timestamptz") }
        if let before = filter.before { conditions.append("j.dead_at < \(bind(before))::timestamptz") }
        return conditions.joined(separator: " AND ")
    }

    static let deadColumns =
        JobQueue.jobColumns + """
            , j.status, j.reason, j.apns_unique_id, j.dead_at, j.error, j.history::text AS history_json,
            to_jsonb(j)::text AS row_json
            """

    static func decodeDeadLetter(_ row: PostgresRow) throws -> DeadLetter {
        let job = try JobQueue.decodeJob(row)
        let cells = row.makeRandomAccess()
        return DeadLetter(
            job: job,
            status: try cells["status"].decode(Int16?.self).map(Int.init),
            reason: try cells["reason"].decode(String.self),
            apnsUniqueID: try cells["apns_unique_id"].decode(String?.self),
            deadAt: try cells["dead_at"].decode(Date.self),
            error: try cells["error"].decode(String.self),
            historyJSON: try cells["history_json"].decode(String.self),
            rowJSON: try cells["row_json"].decode(String.self)
        )
    }
}

/// The statements of `Statements/dead_jobs.sql`, with their binds in order.
enum DeadJobsSQL {
    /// Statement `name` of `Statements/dead_jobs.sql`, with its binds in order.
    private static func named(_ name: String, _ binds: String...) -> SQLStatement {
        SQLStatement(file: "dead_jobs", name: name, binds: binds)
    }

    static let purgeOlder = named("purge_older", "age_seconds", "batch_size")
    static let purgeDiedBefore = named("purge_died_before", "cutoff_micros", "batch_size")

    static let all = [purgeOlder, purgeDiedBefore]
}
