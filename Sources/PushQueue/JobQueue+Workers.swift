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
            WorkersSQL.heartbeat.query {
                $0.bind("worker_id", workerID)
                $0.bind("host", host)
                $0.bind("pid", Int32(clamping: pid))
                $0.bind("credentials", credentials)
                $0.bind("session_tracked", sessionTracked)
                $0.bind("instance", instance)
                $0.bind("stale_seconds", stale)
            },
            logger: self.logger
        ) {
            written += 1
        }
        guard written == 0 else { return }
        var holder = WorkerIDInUse(workerID: workerID, host: "?", pid: 0, secondsAgo: 0)
        for try await (host, pid, ago) in try await self.client.query(
            WorkersSQL.holder.query { $0.bind("worker_id", workerID) },
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
            WorkersSQL.deregister.query {
                $0.bind("worker_id", workerID)
                $0.bind("instance", instance)
            },
            logger: self.logger
        )
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
            WorkersSQL.returnRunning.query {
                $0.bind("why", why)
                $0.bind("worker_id", workerID)
                $0.bind("held", held)
            },
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
            WorkersSQL.reapGoneWorkers.query {
                $0.bind("stale_seconds", stale)
                $0.bind("grace_seconds", grace)
                $0.bind("frozen_seconds", frozen)
                $0.bind("worker_id", workerID)
                $0.bind("why", "its worker is gone")
            },
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
        try await self.client.query(WorkersSQL.forgetSilentWorkers.query(), logger: self.logger)
        var count = 0
        for try await _ in try await self.client.query(
            WorkersSQL.deadLetterUnsignable.query { $0.bind("wait_seconds", waitSeconds) },
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
            WorkersSQL.durability.query(),
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

/// The statements of `Statements/workers.sql`, with their binds in order.
enum WorkersSQL: StatementFile {
    static let file = "workers"

    static let heartbeat = named(
        "heartbeat",
        "worker_id",
        "host",
        "pid",
        "credentials",
        "session_tracked",
        "instance",
        "stale_seconds"
    )
    static let holder = named("holder", "worker_id")
    static let deregister = named("deregister", "worker_id", "instance")
    static let returnRunning = named("return_running", "why", "worker_id", "held")
    static let reapGoneWorkers = named(
        "reap_gone_workers",
        "stale_seconds",
        "grace_seconds",
        "frozen_seconds",
        "worker_id",
        "why"
    )
    static let forgetSilentWorkers = named("forget_silent_workers")
    static let deadLetterUnsignable = named("dead_letter_unsignable", "wait_seconds")
    static let durability = named("durability")
    static let list = named("list", "limit")

    static let all = [
        heartbeat, holder, deregister, returnRunning, reapGoneWorkers, forgetSilentWorkers, deadLetterUnsignable,
        durability, list,
    ]
}
