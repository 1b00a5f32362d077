import Foundation
import PostgresNIO

extension JobQueue {
    /// Writes a batch of outcomes in one statement: delivered and retried jobs are updated in place, dead
    /// ones are moved to `push.dead_jobs` (deleted and inserted together, with their whole history), and
    /// invalid tokens are upserted into `push.invalid_tokens`.
    ///
    /// Each write is fenced on (id, attempt, `workerID`, state `running`): an outcome from a worker that no
    /// longer holds the attempt is refused and reported in ``OutcomeWriteResult/fenced``.
    public func writeOutcomes(_ outcomes: [JobOutcome], workerID: String) async throws -> OutcomeWriteResult {
        guard !outcomes.isEmpty else { return OutcomeWriteResult(recorded: [], fenced: []) }
        let binds = Self.bindings(outcomes, workerID: workerID)
        var recorded: [Int64] = []
        try await self.forEachRow(of: WriteOutcomesStatement.self, binds: binds) {
            recorded.append(try $0.decode(Int64.self))
        }
        let written = Set(recorded)
        return OutcomeWriteResult(recorded: recorded, fenced: outcomes.map(\.jobID).filter { !written.contains($0) })
    }

    /// The last resort for one outcome the normal write refused (a poison row: a value the statement
    /// cannot store). A 200 is written as `delivered` with nothing else; anything else moves the job to
    /// the dead letters with `sentence`, without the side effect that may have failed (the
    /// invalid-token row). Fenced like ``writeOutcomes(_:workerID:)``.
    ///
    /// - Returns: whether the job was written (false: fenced).
    public func deadLetterUnwritable(_ outcome: JobOutcome, workerID: String, sentence: String) async throws -> Bool {
        let delivered = outcome.disposition == .delivered
        let reason = outcome.reason ?? "OutcomeWriteFailed"
        let entry = "{\"outcome\":\"\(outcome.disposition.name)\",\"unwritable\":true}"
        let rows = try await self.client.query(
            """
            WITH done AS (
                UPDATE push.jobs AS j
                   SET state = 'delivered', delivered_at = now(), last_attempt_at = now(), status = 200,
                       locked_by = NULL, locked_until = NULL
                 WHERE \(delivered) AND j.id = \(outcome.jobID) AND j.attempts = \(Int16(clamping: outcome.attempt))
                   AND j.locked_by = \(workerID)
                RETURNING j.id
            ), moved AS (
                DELETE FROM push.jobs AS j
                 WHERE NOT \(delivered) AND j.id = \(outcome.jobID) AND j.attempts = \(Int16(clamping: outcome.attempt))
                   AND j.locked_by = \(workerID)
                RETURNING j.*
            ), dead AS (
                INSERT INTO push.dead_jobs (\(unescaped: Self.deadLetterInsertColumns))
                SELECT id, topic, device_token, channel_id, payload, push_type, priority, environment, credential,
                       collapse_id, expires_at, run_at, apns_id, max_attempts, attempts, transport_retries,
                       \(outcome.status.map { Int16(clamping: $0) })::smallint, \(reason), coalesce(array_remove(trap_ids, NULL), '{}'), apns_unique_id,
                       created_at, first_attempt_at, now(), NULL, now(), \(sentence),
                       history || jsonb_build_array(\(entry)::jsonb || jsonb_build_object('at', now(), 'worker', \(workerID)::text)),
                       deliver_once, coalesce_key
                  FROM moved
                \(unescaped: Self.deadConflict)
                RETURNING id
            )
            SELECT id FROM done UNION ALL SELECT id FROM dead
            """,
            logger: self.logger
        )
        for try await _ in rows.decode(Int64.self) { return true }
        return false
    }

    /// The columns every move into `push.dead_jobs` writes, in this order.
    static let deadLetterInsertColumns = """
        id, topic, device_token, channel_id, payload, push_type, priority, environment, credential, collapse_id,
        expires_at, run_at, apns_id, max_attempts, attempts, transport_retries, status, reason, trap_ids,
        apns_unique_id, created_at, first_attempt_at, last_attempt_at, latency_ms, dead_at, error, history,
        deliver_once, coalesce_key
        """

    /// A dead letter whose `id` is already taken (a job re-enqueued by hand with an explicit id) merges
    /// into it: the newer row wins, both histories are kept, nothing is lost and the write never fails.
    static let deadConflict = """
        ON CONFLICT (id) DO UPDATE SET
            topic = excluded.topic, device_token = excluded.device_token, channel_id = excluded.channel_id,
            payload = excluded.payload, push_type = excluded.push_type, priority = excluded.priority,
            environment = excluded.environment, credential = excluded.credential, collapse_id = excluded.collapse_id,
            deliver_once = excluded.deliver_once, coalesce_key = excluded.coalesce_key,
            expires_at = excluded.expires_at, run_at = excluded.run_at, apns_id = excluded.apns_id,
            max_attempts = excluded.max_attempts, attempts = excluded.attempts,
            transport_retries = excluded.transport_retries, status = excluded.status, reason = excluded.reason,
            trap_ids = push.merge_trap_ids(dead_jobs.trap_ids, excluded.trap_ids),
            apns_unique_id = excluded.apns_unique_id, created_at = excluded.created_at,
            first_attempt_at = excluded.first_attempt_at, last_attempt_at = excluded.last_attempt_at,
            latency_ms = excluded.latency_ms, dead_at = excluded.dead_at,
            error = excluded.error || ' (An older dead letter with the same id, apns_id ' || dead_jobs.apns_id
                    || ', was merged into this one; its history comes first.)',
            history = dead_jobs.history || jsonb_build_array(jsonb_build_object('outcome', 'merged_dead_letter',
                    'previous_apns_id', dead_jobs.apns_id, 'previous_reason', dead_jobs.reason)) || excluded.history
        """

    static func bindings(_ outcomes: [JobOutcome], workerID: String) -> PostgresBindings {
        var ids: [Int64] = []
        var attempts: [Int16] = []
        var kinds: [String] = []
        var delays: [Int64] = []
        var statuses: [Int16] = []
        var reasons: [String] = []
        var traps: [String] = []
        var uniqueIDs: [String] = []
        var latencies: [Int32] = []
        var ages: [Int64] = []
        var errors: [String] = []
        var sent: [Bool] = []
        var invalidate: [Bool] = []
        var timestamps: [Int64] = []
        let now = ContinuousClock.now
        // In id order, as every statement that locks several job rows does: no deadlock between them.
        for outcome in outcomes.sorted(by: { $0.jobID < $1.jobID }) {
            ids.append(outcome.jobID)
            attempts.append(Int16(clamping: outcome.attempt))
            kinds.append(outcome.disposition.name)
            delays.append(max((outcome.disposition.delay ?? .zero).milliseconds, 0))
            if case .dead(let sentence) = outcome.disposition { errors.append(sentence) } else { errors.append("") }
            // Arrays cannot carry NULL elements through the binary protocol: 0, -1 and "" stand for NULL.
            statuses.append(Int16(clamping: outcome.status ?? 0))
            reasons.append(outcome.reason ?? "")
            traps.append(outcome.trapIDs.map(\.rawValue).joined(separator: ","))
            uniqueIDs.append(outcome.apnsUniqueID ?? "")
            latencies.append(Int32(clamping: outcome.latencyMs ?? -1))
            ages.append(max((now - outcome.attemptedAt).milliseconds, 0))
            sent.append(outcome.sent)
            invalidate.append(outcome.invalidatesToken)
            timestamps.append(outcome.apnsTimestampMs ?? 0)
        }
        var binds = PostgresBindings(capacity: 15)
        binds.append(ids)
        binds.append(attempts)
        binds.append(kinds)
        binds.append(delays)
        binds.append(statuses)
        binds.append(reasons)
        binds.append(traps)
        binds.append(uniqueIDs)
        binds.append(latencies)
        binds.append(ages)
        binds.append(errors)
        binds.append(sent)
        binds.append(invalidate)
        binds.append(timestamps)
        binds.append(workerID)
        return binds
    }

    /// The outcome input, one row per outcome, as a subquery: each statement part unnests it itself so
    /// the planner joins it to `push.jobs` by primary key (a shared CTE would be scanned once per job row).
    private static let inputRows = """
        (SELECT i.*,
                NULLIF(i.status, 0) AS st,
                NULLIF(i.reason, '') AS rs,
                coalesce(string_to_array(NULLIF(i.traps, ''), ','), '{}') AS trap_arr,
                NULLIF(i.latency, -1) AS lat,
                now() - i.age_ms * interval '1 millisecond' AS at,
                jsonb_build_object(
                    'attempt', i.attempt, 'at', now() - i.age_ms * interval '1 millisecond', 'outcome', i.kind,
                    'status', NULLIF(i.status, 0), 'reason', NULLIF(i.reason, ''),
                    'trap_ids', to_jsonb(coalesce(string_to_array(NULLIF(i.traps, ''), ','), '{}')),
                    'latency_ms', NULLIF(i.latency, -1), 'sent', i.sent, 'worker', $15::text
                ) AS entry
           FROM unnest($1::bigint[], $2::smallint[], $3::text[], $4::bigint[], $5::smallint[], $6::text[],
                       $7::text[], $8::text[], $9::integer[], $10::bigint[], $11::text[], $12::boolean[],
                       $13::boolean[], $14::bigint[])
                AS i(id, attempt, kind, delay_ms, status, reason, traps, unique_id, latency, age_ms,
                     error, sent, invalidate, ts_ms))
        """

    /// One statement for a batch: update delivered/retried/requeued jobs, move dead ones with their
    /// history, upsert invalid tokens. Every write is fenced on (id, attempt, worker $15). `locked_by`
    /// is set by a claim and cleared by every outcome; the reaper leaves it, so the late outcome of a
    /// job that was taken back but not yet re-claimed is still accepted (and the job not sent twice).
    /// A re-claim bumps `attempts` and sets `locked_by`, which fences the old holder out. The state must
    /// still be `running` or `pending` (returned by the reaper): a job superseded or delivered meanwhile is
    /// never brought back by a late outcome (superseding clears `locked_by` too). Every time is Postgres's `now()`
    /// (less the outcome's age, plus its delay).
    static let writeOutcomesSQL = """
        WITH updated AS (
            UPDATE push.jobs AS j
               -- A job cancelled while its request was in flight: the request completes (a 200 is recorded as
               -- delivered), but it is never retried.
               SET state = CASE WHEN i.kind = 'delivered' THEN 'delivered'
                                WHEN j.state = 'cancelled' THEN 'cancelled' ELSE 'pending' END,
                   run_at = CASE WHEN i.kind = 'delivered' THEN j.run_at ELSE now() + i.delay_ms * interval '1 millisecond' END,
                   attempts = CASE WHEN i.kind IN ('requeue', 'transport_retry') THEN j.attempts - 1 ELSE j.attempts END,
                   transport_retries = j.transport_retries + CASE WHEN i.kind = 'transport_retry' THEN 1 ELSE 0 END,
                   status = i.st,
                   reason = CASE WHEN i.kind = 'delivered' THEN j.reason ELSE i.rs END,
                   trap_ids = CASE WHEN cardinality(i.trap_arr) = 0 THEN j.trap_ids
                                   ELSE push.merge_trap_ids(j.trap_ids, i.trap_arr) END,
                   apns_unique_id = coalesce(NULLIF(i.unique_id, ''), j.apns_unique_id),
                   first_attempt_at = coalesce(j.first_attempt_at, CASE WHEN i.sent THEN i.at END),
                   last_attempt_at = CASE WHEN i.sent THEN i.at ELSE j.last_attempt_at END,
                   delivered_at = CASE WHEN i.kind = 'delivered' THEN now() ELSE NULL END,
                   latency_ms = i.lat,
                   locked_by = NULL,
                   locked_until = NULL,
                   -- The attempt that delivered lives in the row's columns (status, latency_ms, delivered_at,
                   -- last_attempt_at, apns_unique_id); history keeps the attempts that did not deliver.
                   history = CASE WHEN i.kind = 'delivered' THEN j.history
                                  ELSE push.append_history(j.history, i.entry) END
              FROM \(inputRows) AS i
             WHERE j.id = i.id AND j.attempts = i.attempt AND j.locked_by = $15
               AND (j.state IN ('running', 'pending') OR (j.state = 'cancelled' AND i.sent)) AND i.kind <> 'dead'
            RETURNING j.id
        ), moved AS (
            DELETE FROM push.jobs AS j
             USING \(inputRows) AS i
             WHERE j.id = i.id AND j.attempts = i.attempt AND j.locked_by = $15
               AND (j.state IN ('running', 'pending') OR (j.state = 'cancelled' AND i.sent)) AND i.kind = 'dead'
            RETURNING j.*, i.st, i.rs, i.trap_arr, i.unique_id, i.lat, i.at, i.sent, i.error, i.entry,
                      i.invalidate, i.ts_ms
        ), dead AS (
            INSERT INTO push.dead_jobs (\(deadLetterInsertColumns))
            SELECT id, topic, device_token, channel_id, payload, push_type, priority, environment, credential,
                   collapse_id, expires_at, run_at, apns_id, max_attempts, attempts, transport_retries, st,
                   coalesce(rs, 'Unknown'), push.merge_trap_ids(trap_ids, trap_arr),
                   coalesce(NULLIF(unique_id, ''), apns_unique_id), created_at,
                   coalesce(first_attempt_at, CASE WHEN sent THEN at END), CASE WHEN sent THEN at ELSE last_attempt_at END,
                   lat, now(), error, push.append_history(history, entry), deliver_once, coalesce_key
              FROM moved
            \(deadConflict)
            RETURNING id
        ), tokens AS (
            INSERT INTO push.invalid_tokens AS t
                   (device_token, topic, environment, reason, invalidated_at, apns_timestamp_ms, job_id)
            SELECT DISTINCT ON (device_token, topic, environment)
                   device_token, topic, environment, coalesce(rs, 'Unknown'),
                   CASE WHEN ts_sane THEN to_timestamp(ts_ms::double precision / 1000) ELSE now() END,
                   CASE WHEN ts_sane THEN ts_ms END, id
              FROM (SELECT m.*, (m.ts_ms BETWEEN 1262304000000 AND (extract(epoch FROM now()) * 1000 + 86400000)::bigint) AS ts_sane
                      FROM moved AS m) AS moved
             -- A 410 timestamp is range-checked (2010 to tomorrow); a token too long for the index is
             -- no real token: its dead letter says so, and no invalid-token row is written.
             WHERE invalidate AND device_token IS NOT NULL AND octet_length(device_token) <= 512
             ORDER BY device_token, topic, environment, ts_ms DESC
            ON CONFLICT (device_token, topic, environment) DO UPDATE
               SET reason = excluded.reason, invalidated_at = excluded.invalidated_at,
                   apns_timestamp_ms = excluded.apns_timestamp_ms, job_id = excluded.job_id
             WHERE excluded.invalidated_at >= t.invalidated_at
            RETURNING 1
        )
        SELECT id FROM updated UNION ALL SELECT id FROM dead
        """
}

/// ``JobQueue/writeOutcomesSQL``, prepared once per connection.
enum WriteOutcomesStatement: BatchStatement {
    static let name = "push_write_outcomes_v9"
    static let sql = JobQueue.writeOutcomesSQL
}
