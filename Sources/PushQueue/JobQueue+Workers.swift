public import Foundation
import PostgresNIO

/// Worker heartbeats (`push.workers`): a lease only lapses for a worker that is gone.
/// Another live process heartbeats under this worker id.
public struct WorkerIDInUse: Error, Sendable, CustomStringConvertible {
    public var workerID: String
    public var host: String
    public var pid: Int
    /// Its last heartbeat, seconds ago.
    public var secondsAgo: Double

    public var description: String {
        "worker id '\(self.workerID)' is in use by a live worker (host \(self.host), pid \(self.pid), heartbeat \(String(format: "%.1f", self.secondsAgo)) s ago): two workers with one id take each other's jobs back. Give each its own --worker-id (containers sharing a hostname, each PID 1, get the same default id hostname-pid)"
    }
}

extension JobQueue {
    /// Registers or refreshes this worker's row: its heartbeat, and the credentials it can sign for.
    ///
    /// - Parameter sessionTracked: every Postgres session of this worker carries `workerID` as its
    ///   `application_name` (not behind a transaction pooler), so the reaper can tell from
    ///   `pg_stat_activity` whether the worker is gone or only frozen.
    ///   - instance: this process's own id. A row of `workerID` that another instance heartbeats (within
    ///     `staleAfter`, not stopped) is not taken over: ``WorkerIDInUse`` is thrown instead. Two live workers
    ///     with one id would take each other's jobs back (containers sharing a hostname, each PID 1).
    public func heartbeat(
        workerID: String,
        host: String,
        pid: Int,
        credentials: [String],
        sessionTracked: Bool = false,
        instance: UUID? = nil,
        staleAfter: Duration = .seconds(6)
    ) async throws {
        let stale = Double(staleAfter.components.seconds) + Double(staleAfter.components.attoseconds) / 1e18
        var written = 0
        for try await _ in try await self.client.query(
            """
            INSERT INTO push.workers AS w (worker_id, host, pid, credentials, session_tracked, instance)
            VALUES (\(workerID), \(host), \(Int32(clamping: pid)), \(credentials)::text[], \(sessionTracked), \(instance))
            ON CONFLICT (worker_id) DO UPDATE
               SET heartbeat_at = now(), host = excluded.host, pid = excluded.pid, credentials = excluded.credentials,
                   stopped_at = NULL, session_tracked = excluded.session_tracked, instance = excluded.instance
             WHERE excluded.instance IS NULL OR w.instance IS NULL OR w.instance = excluded.instance
                OR w.stopped_at IS NOT NULL OR w.heartbeat_at < now() - make_interval(secs => \(stale))
            RETURNING 1
            """,
            logger: self.logger
        ) {
            written += 1
        }
        guard written == 0 else { return }
        var holder = WorkerIDInUse(workerID: workerID, host: "?", pid: 0, secondsAgo: 0)
        for try await (host, pid, ago) in try await self.client.query(
            "SELECT host, pid, extract(epoch FROM now() - heartbeat_at)::float8 FROM push.workers WHERE worker_id = \(workerID)",
            logger: self.logger
        ).decode((String, Int32, Double).self) {
            holder = WorkerIDInUse(workerID: workerID, host: host, pid: Int(pid), secondsAgo: ago)
        }
        throw holder
    }

    /// Marks this worker stopped on a clean stop (it holds no job); the row is kept as "last seen with
    /// these credentials" for ``deadLetterUnsignable(wait:)``.
    /// With `instance`, only this process's row: not one another process has since taken over.
    public func deregister(workerID: String, instance: UUID? = nil) async throws {
        try await self.client.query(
            """
            UPDATE push.workers SET stopped_at = now(), heartbeat_at = now()
             WHERE worker_id = \(workerID) AND (\(instance)::uuid IS NULL OR instance IS NULL OR instance = \(instance)::uuid)
            """,
            logger: self.logger
        )
    }

    /// The SET clause that returns a running job to `pending`, due at once, same `apns_id`: the attempt
    /// stays counted (its outcome is unknown), `locked_by` is kept so the old holder's late outcome is
    /// still accepted until another worker re-claims the job, and the history says why.
    static func backToPending(_ why: String) -> String {
        """
        state = 'pending', run_at = now(), locked_until = NULL,
        history = push.append_history(j.history, jsonb_build_object(
            'attempt', j.attempts, 'at', now(), 'outcome', 'lease_expired', 'worker', j.locked_by,
            'why', '\(why)'))
        """
    }

    /// Returns to `pending` the jobs a previous process with this worker id left `running` (it died):
    /// at start, before claiming, so a restarted worker gets its jobs back at once. Worker ids are
    /// unique per live process.
    @discardableResult
    public func reclaimPreviousLife(workerID: String) async throws -> [Int64] {
        try await self.returnRunning(of: workerID, except: [], why: "its worker restarted")
    }

    /// Returns to `pending` the jobs this worker has `running` in the table but does not hold: claims the old
    /// primary committed while their answer was lost in a failover. Run on the new primary's client before any
    /// claim goes through it, so no claim of its own can be caught; without it they would wait for their lease.
    @discardableResult
    public func releaseUnheld(workerID: String, holding held: [Int64]) async throws -> [Int64] {
        try await self.returnRunning(
            of: workerID,
            except: held,
            why: "claimed on the old primary, the claim answer lost in a failover"
        )
    }

    /// Returns to `pending` the running jobs `workerID` holds in the table, but those in `held`; `why` goes in
    /// each job's history.
    private func returnRunning(of workerID: String, except held: [Int64], why: String) async throws -> [Int64] {
        var ids: [Int64] = []
        for try await id in try await self.client.query(
            """
            UPDATE push.jobs AS j
               SET \(unescaped: Self.backToPending(why))
             WHERE j.state = 'running' AND j.locked_by = \(workerID) AND NOT (j.id = ANY(\(held)))
            RETURNING j.id
            """,
            logger: self.logger
        ).decode(Int64.self) {
            ids.append(id)
        }
        return ids
    }

    /// Returns to `pending`, due at once and with the same `apns_id`, the running jobs whose worker is
    /// gone. A worker whose heartbeat is fresh keeps its jobs whatever their leases say (it may only have
    /// lost Postgres for a while; its outcomes are on their way), except the ones it no longer holds itself
    /// (`workerID`'s own jobs with a lapsed lease). A worker whose heartbeat is older than `staleAfter` is
    /// taken for gone when Postgres holds no session of it any more (`pg_stat_activity.application_name`:
    /// it died, and the kernel closed its sockets); one whose sessions are still open is frozen (SIGSTOP, a
    /// VM pause, a throttled container) or cut off, and may still read the answers to requests it wrote:
    /// its jobs are sent again only after `frozenAfter` of silence. A worker that does not name its
    /// sessions (behind a transaction pooler) is taken for gone after `staleAfter`, and one with no row
    /// when the lease lapsed. The attempt stays counted; `locked_by` is kept, so a late outcome from the
    /// old holder is still accepted unless another worker re-claimed the job. Rows another statement
    /// holds are skipped, never waited for.
    ///
    /// A worker last seen before Postgres itself restarted is not taken for gone until `restartGrace`
    /// after the restart: every worker was cut off alike, and its pool may take a while to reconnect.
    ///
    /// - Returns: the ids of the jobs reclaimed.
    @discardableResult
    public func reapJobsOfGoneWorkers(
        staleAfter: Duration,
        workerID: String,
        restartGrace: Duration = .seconds(75),
        frozenAfter: Duration = .seconds(120)
    ) async throws -> [Int64] {
        let stale = Double(staleAfter.components.seconds) + Double(staleAfter.components.attoseconds) / 1e18
        let frozen = max(
            Double(frozenAfter.components.seconds) + Double(frozenAfter.components.attoseconds) / 1e18,
            stale
        )
        let grace = Double(restartGrace.components.seconds)
        var ids: [Int64] = []
        for try await id in try await self.client.query(
            """
            WITH holders AS MATERIALIZED (
                SELECT w.worker_id,
                       w.heartbeat_at > now() - make_interval(secs => \(stale))
                       -- Last seen before Postgres restarted, and the restart is recent: cut off, not gone.
                       OR (w.heartbeat_at < pg_postmaster_start_time()
                           AND pg_postmaster_start_time() > now() - make_interval(secs => \(grace)))
                       -- Frozen or cut off: its sessions are still open. Not gone until the longer bound.
                       OR (w.session_tracked AND w.heartbeat_at > now() - make_interval(secs => \(frozen))
                           AND EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity AS a
                                        WHERE a.application_name = left(w.worker_id, 63)
                                          AND a.datname = current_database())) AS live
                  FROM push.workers AS w
            ), reaped AS MATERIALIZED (
                SELECT r.id FROM push.jobs AS r LEFT JOIN holders AS h ON h.worker_id = r.locked_by
                 WHERE r.state = 'running'
                   AND ((r.locked_by = \(workerID) AND r.locked_until < now())
                        OR (r.locked_by <> \(workerID) AND h.live IS FALSE)
                        OR (r.locked_by <> \(workerID) AND h.live IS NULL AND r.locked_until < now()))
                 FOR NO KEY UPDATE OF r SKIP LOCKED
            )
            UPDATE push.jobs AS j
               SET \(unescaped: Self.backToPending("its worker is gone"))
             WHERE j.id IN (SELECT id FROM reaped) AND j.state = 'running'
            RETURNING j.id
            """,
            logger: self.logger
        ).decode(Int64.self) {
            ids.append(id)
        }
        return ids
    }

    /// Dead-letters pending jobs whose credential no worker has been seen holding for `wait` (trap
    /// MS028), once they have waited `wait` past their `run_at`. "Seen" counts stopped workers too (a
    /// worker restarted for maintenance keeps its jobs); a worker that names no credentials signs any.
    /// Forgets worker rows silent for a week.
    ///
    /// - Returns: how many jobs were dead-lettered.
    @discardableResult
    public func deadLetterUnsignable(wait: Duration) async throws -> Int {
        let waitSeconds = Double(wait.components.seconds)
        try await self.client.query(
            "DELETE FROM push.workers WHERE heartbeat_at < now() - interval '7 days'",
            logger: self.logger
        )
        var count = 0
        for try await _ in try await self.client.query(
            """
            WITH seen AS (
                SELECT credentials FROM push.workers WHERE heartbeat_at > now() - make_interval(secs => \(waitSeconds))
            ), moved AS (
                DELETE FROM push.jobs AS j
                 WHERE j.id IN (SELECT p.id FROM push.jobs AS p
                                 WHERE p.state = 'pending' AND p.run_at < now() - make_interval(secs => \(waitSeconds))
                                   AND NOT EXISTS (SELECT 1 FROM seen AS w
                                                    WHERE cardinality(w.credentials) = 0
                                                       -- An FCM credential registers as fcm:<name>.
                                                       OR (CASE WHEN p.environment = 'fcm' THEN 'fcm:' || p.credential
                                                                ELSE p.credential END) = ANY (w.credentials))
                                 LIMIT 1000 FOR UPDATE SKIP LOCKED)
                RETURNING j.*
            ), deliveries AS (
                -- Webhooks that take `dead` hear of these too, in this statement.
                INSERT INTO push.webhook_deliveries (webhook_id, event, job_id, body)
                SELECT h.id, 'dead', m.id,
                       jsonb_build_object('job_id', m.id, 'apns_id', m.apns_id, 'platform', m.platform,
                                          'topic', m.topic, 'state', 'dead', 'status', m.status,
                                          'reason', 'CredentialsMissing',
                                          'trap_ids', to_jsonb(push.merge_trap_ids(m.trap_ids, '{MS028}')),
                                          'at', now(), 'event', 'dead')
                  FROM push.webhooks AS h JOIN moved AS m ON h.topic IS NULL OR h.topic = m.topic
                 WHERE h.disabled_at IS NULL AND 'dead' = ANY (h.events)
                RETURNING 1
            )
            INSERT INTO push.dead_jobs (\(unescaped: Self.deadLetterInsertColumns))
            SELECT id, topic, device_token, channel_id, payload, push_type, priority, environment, credential,
                   collapse_id, expires_at, run_at, apns_id, max_attempts, attempts, transport_retries, status,
                   'CredentialsMissing', push.merge_trap_ids(trap_ids, '{MS028}'), apns_unique_id, created_at,
                   first_attempt_at, last_attempt_at, latency_ms, now(),
                   CASE WHEN environment = 'fcm'
                        THEN 'no running worker has an FCM service account for credential ''' || credential || ''' (MS028): give a worker FCM_SERVICE_ACCOUNT_PATH or a {"type": "fcm"} credential in its --config, then replay this job.'
                        ELSE 'no running worker has a signing key for credential ''' || credential || ''' (MS028): name it in a worker''s --config or APNS_* settings, then replay this job.' END,
                   push.append_history(history, jsonb_build_object('outcome', 'dead', 'at', now(), 'reason', 'CredentialsMissing')),
                   deliver_once, coalesce_key, platform, provider_message_id, traceparent, trace_first_span
              FROM moved
            \(unescaped: Self.deadConflict)
            RETURNING id
            """,
            logger: self.logger
        ) {
            count += 1
        }
        return count
    }
}

extension JobQueue {
    /// What the server this worker reached promises for committed rows on failover (``durabilitySentence(synchronousCommit:synchronousStandbyNames:streamingStandbys:)``).
    public func durability() async throws -> String {
        for try await (commit, names, standbys) in try await self.client.query(
            """
            SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
                   (SELECT count(*) FROM pg_stat_replication)
            """,
            logger: self.logger
        ).decode((String, String, Int64).self) {
            return Self.durabilitySentence(
                synchronousCommit: commit,
                synchronousStandbyNames: names,
                streamingStandbys: Int(standbys)
            )
        }
        return "unknown"
    }

    /// What the server can promise for committed rows when it fails over, in a sentence for the start-up log:
    /// single server, asynchronous replication (a failover can lose the last commits), or synchronous.
    public static func durabilitySentence(
        synchronousCommit: String,
        synchronousStandbyNames: String,
        streamingStandbys: Int
    ) -> String {
        let syncCommit = ["on", "remote_write", "remote_apply"].contains(synchronousCommit)
        if !synchronousStandbyNames.isEmpty && syncCommit {
            return
                "synchronous replication (synchronous_commit=\(synchronousCommit), synchronous_standby_names='\(synchronousStandbyNames)'): no committed job or outcome is lost when a synchronous standby takes over"
        }
        if streamingStandbys > 0 || !synchronousStandbyNames.isEmpty {
            return
                "asynchronous replication (synchronous_commit=\(synchronousCommit), synchronous_standby_names='\(synchronousStandbyNames)', \(streamingStandbys) standby streaming): a failover can lose the last committed jobs and outcomes; a lost outcome means the push is sent again with the same apns-id. For no loss, set synchronous_standby_names and synchronous_commit = on or remote_apply"
        }
        if synchronousCommit == "off" {
            return
                "a single server (no standby streaming) with synchronous_commit=off: a commit is acknowledged before it reaches disk, so a crash can lose the last committed jobs and outcomes; nothing replicates them"
        }
        return
            "a single server (no standby streaming, synchronous_commit=\(synchronousCommit)): committed jobs survive a crash as far as its disk does; nothing replicates them"
    }
}
