import Foundation
import PostgresNIO

extension JobQueue {
    /// Writes a batch of outcomes in one statement: delivered and retried jobs are updated in place, dead
    /// ones are moved to `push.dead_jobs` (deleted and inserted together, with their whole history), and
    /// invalid tokens are upserted into `push.invalid_tokens`.
    ///
    /// Each write is fenced on (id, attempt, `workerID`, state `running`): an outcome from a worker that no
    /// longer holds the attempt is refused and reported in ``RecordResult/fenced``.
    public func record(_ outcomes: [JobOutcome], workerID: String) async throws -> RecordResult {
        guard !outcomes.isEmpty else { return RecordResult(recorded: [], fenced: []) }
        var ids: [Int64] = [], attempts: [Int16] = [], kinds: [String] = [], retryAt: [Date] = []
        var statuses: [Int16] = [], reasons: [String] = [], traps: [String] = [], uniqueIDs: [String] = []
        var latencies: [Int32] = [], attemptedAt: [Date] = [], errors: [String] = [], sent: [Bool] = []
        var invalidate: [Bool] = [], timestamps: [Int64] = []
        for outcome in outcomes {
            ids.append(outcome.jobID)
            attempts.append(Int16(clamping: outcome.attempt))
            switch outcome.disposition {
            case .delivered:
                kinds.append("delivered"); retryAt.append(outcome.attemptedAt); errors.append("")
            case .retry(let at):
                kinds.append("retry"); retryAt.append(at); errors.append("")
            case .dead(let error):
                kinds.append("dead"); retryAt.append(outcome.attemptedAt); errors.append(error)
            case .requeue(let at):
                kinds.append("requeue"); retryAt.append(at); errors.append("")
            }
            // Arrays cannot carry NULL elements through the binary protocol: 0, -1 and "" stand for NULL.
            statuses.append(Int16(clamping: outcome.status ?? 0))
            reasons.append(outcome.reason ?? "")
            traps.append(outcome.trapIDs.joined(separator: ","))
            uniqueIDs.append(outcome.apnsUniqueID ?? "")
            latencies.append(Int32(clamping: outcome.latencyMs ?? -1))
            attemptedAt.append(outcome.attemptedAt)
            sent.append(outcome.sent)
            invalidate.append(outcome.invalidatesToken)
            timestamps.append(outcome.apnsTimestampMs ?? 0)
        }
        var binds = PostgresBindings(capacity: 15)
        binds.append(ids)
        binds.append(attempts)
        binds.append(kinds)
        binds.append(retryAt)
        binds.append(statuses)
        binds.append(reasons)
        binds.append(traps)
        binds.append(uniqueIDs)
        binds.append(latencies)
        binds.append(attemptedAt)
        binds.append(errors)
        binds.append(sent)
        binds.append(invalidate)
        binds.append(timestamps)
        binds.append(workerID)
        let rows = try await self.client.query(PostgresQuery(unsafeSQL: Self.recordSQL, binds: binds), logger: self.logger)
        var recorded: [Int64] = []
        for try await id in rows.decode(Int64.self) { recorded.append(id) }
        let written = Set(recorded)
        return RecordResult(recorded: recorded, fenced: ids.filter { !written.contains($0) })
    }

    /// The outcome input, one row per outcome, as a subquery: each statement part unnests it itself so
    /// the planner joins it to `push.jobs` by primary key (a shared CTE would be scanned once per job row).
    private static let inputRows = """
        (SELECT i.*,
                NULLIF(i.status, 0) AS st,
                NULLIF(i.reason, '') AS rs,
                coalesce(string_to_array(NULLIF(i.traps, ''), ','), '{}') AS trap_arr,
                NULLIF(i.latency, -1) AS lat,
                jsonb_build_object(
                    'attempt', i.attempt, 'at', i.attempted_at, 'outcome', i.kind,
                    'status', NULLIF(i.status, 0), 'reason', NULLIF(i.reason, ''),
                    'trap_ids', to_jsonb(coalesce(string_to_array(NULLIF(i.traps, ''), ','), '{}')),
                    'latency_ms', NULLIF(i.latency, -1), 'sent', i.sent, 'worker', $15::text
                ) AS entry
           FROM unnest($1::bigint[], $2::smallint[], $3::text[], $4::timestamptz[], $5::smallint[], $6::text[],
                       $7::text[], $8::text[], $9::integer[], $10::timestamptz[], $11::text[], $12::boolean[],
                       $13::boolean[], $14::bigint[])
                AS i(id, attempt, kind, retry_at, status, reason, traps, unique_id, latency, attempted_at,
                     error, sent, invalidate, ts_ms))
        """

    /// One statement for a batch: update delivered/retried jobs, move dead ones with their history,
    /// upsert invalid tokens. Every write is fenced on (id, attempt, worker $15). `locked_by` is set
    /// only while a job is running (every transition out of `running` clears it), so the fence needs
    /// no `state = 'running'` test, which would steer the planner to the lease index and a nested
    /// loop over every running job; joined by id, each outcome costs one primary-key lookup.
    static let recordSQL = """
        WITH updated AS (
            UPDATE push.jobs AS j
               SET state = CASE WHEN i.kind = 'delivered' THEN 'delivered' ELSE 'pending' END,
                   run_at = CASE WHEN i.kind IN ('retry', 'requeue') THEN i.retry_at ELSE j.run_at END,
                   attempts = CASE WHEN i.kind = 'requeue' THEN j.attempts - 1 ELSE j.attempts END,
                   status = i.st,
                   reason = CASE WHEN i.kind = 'delivered' THEN j.reason ELSE i.rs END,
                   trap_ids = CASE WHEN cardinality(i.trap_arr) = 0 THEN j.trap_ids
                                   ELSE push.merge_trap_ids(j.trap_ids, i.trap_arr) END,
                   apns_unique_id = coalesce(NULLIF(i.unique_id, ''), j.apns_unique_id),
                   last_attempt_at = i.attempted_at,
                   delivered_at = CASE WHEN i.kind = 'delivered' THEN now() ELSE NULL END,
                   latency_ms = i.lat,
                   locked_by = NULL,
                   locked_until = NULL,
                   history = j.history || jsonb_build_array(i.entry)
              FROM \(inputRows) AS i
             WHERE j.id = i.id AND j.attempts = i.attempt AND j.locked_by = $15
               AND i.kind IN ('delivered', 'retry', 'requeue')
            RETURNING j.id
        ), moved AS (
            DELETE FROM push.jobs AS j
             USING \(inputRows) AS i
             WHERE j.id = i.id AND j.attempts = i.attempt AND j.locked_by = $15
               AND i.kind = 'dead'
            RETURNING j.*, i.st, i.rs, i.trap_arr, i.unique_id, i.lat, i.attempted_at, i.error, i.entry,
                      i.invalidate, i.ts_ms
        ), dead AS (
            INSERT INTO push.dead_jobs (
                id, topic, device_token, channel_id, payload, push_type, priority, environment, credential,
                collapse_id, expires_at, run_at, apns_id, max_attempts, attempts, status, reason, trap_ids,
                apns_unique_id, created_at, first_attempt_at, last_attempt_at, latency_ms, dead_at, error, history)
            SELECT id, topic, device_token, channel_id, payload, push_type, priority, environment, credential,
                   collapse_id, expires_at, run_at, apns_id, max_attempts, attempts, st,
                   coalesce(rs, 'Unknown'), push.merge_trap_ids(trap_ids, trap_arr),
                   coalesce(NULLIF(unique_id, ''), apns_unique_id), created_at, first_attempt_at, attempted_at,
                   lat, now(), error, history || jsonb_build_array(entry)
              FROM moved
            RETURNING id
        ), tokens AS (
            INSERT INTO push.invalid_tokens AS t
                   (device_token, topic, environment, reason, invalidated_at, apns_timestamp_ms, job_id)
            SELECT DISTINCT ON (device_token, topic, environment)
                   device_token, topic, environment, coalesce(rs, 'Unknown'),
                   CASE WHEN ts_ms > 0 THEN to_timestamp(ts_ms::double precision / 1000) ELSE now() END,
                   NULLIF(ts_ms, 0), id
              FROM moved
             WHERE invalidate AND device_token IS NOT NULL
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
