public import PushCore

/// Why the worker takes its primary for lost.
public enum PrimaryLoss: Sendable, Equatable {
    /// Its writes have been refused as read-only for 2 s: demoted by a failover.
    case readOnly
    /// Nothing has reached it for ``WorkerConfiguration/hostLostAfter``.
    case unreachable
    /// ``WorkerConfiguration/switchWouldHelp`` found a database a fresh connection reaches.
    case reachableElsewhere
}

/// How one worker process claims, sends and records.
public struct WorkerConfiguration: Sendable {
    /// This worker's name in `locked_by` (unique per process).
    public var workerID: String
    /// Called when the primary this worker uses is lost, with why (``PrimaryLoss``). The daemon switches its
    /// client to the new primary (keeping held jobs and unwritten outcomes), or exits for its supervisor to
    /// restart it. Watching goes on once it returns.
    public var onPrimaryLost: (@Sendable (PrimaryLoss) async -> Void)? = nil
    /// Called (with the sentence to print) when another live process keeps heartbeating under this worker id
    /// at start; the worker then stops without claiming. `nil`: it waits for the other to stop.
    public var onWorkerIDInUse: (@Sendable (String) -> Void)? = nil
    /// How long the database may stay unreachable before ``onPrimaryLost`` is called; `nil`: wait for it.
    public var hostLostAfter: Duration? = nil
    /// Whether a fresh connection would reach a database this worker's pool cannot (another host of a
    /// multi-host URL promoted to primary, or a renewed password accepted where the one in use is refused).
    /// Asked once a second, told whether a heartbeat has just failed to get through; `true` calls
    /// ``onPrimaryLost`` (``PrimaryLoss/reachableElsewhere``) at once instead of waiting out ``hostLostAfter``.
    public var switchWouldHelp: (@Sendable (_ missedHeartbeat: Bool) async -> Bool)? = nil
    /// Sends in flight at most; the claimer never holds more jobs than this.
    public var concurrency: Int
    /// Jobs per claim at most.
    public var batchSize: Int
    /// How long a claim holds before the reaper may take the job back (longer than the request deadline).
    public var lease: Duration
    /// The polling fallback when no NOTIFY arrives.
    public var pollInterval: Duration
    /// How long the worker waits for a claim or an outcome write before it gives the connection up and
    /// tries again: half the lease, from 5 s to 30 s. A statement unanswered for longer (a network cut, a
    /// frozen server) cannot be trusted to land before the lease lapses; waiting on it only delays the retry
    /// on a working connection.
    public var statementDeadline: Duration { Self.statementDeadline(lease: self.lease) }

    /// ``statementDeadline`` for a lease: also the server's `statement_timeout` on the worker's sessions
    /// (`JobQueue.workerSessionSettings(statementTimeout:)`), so a statement the worker gave up on stops.
    public static func statementDeadline(lease: Duration) -> Duration {
        min(.seconds(30), max(.seconds(5), lease / 2))
    }
    /// How often expired leases are reclaimed.
    public var reaperInterval: Duration
    /// Delivered jobs are deleted this long after delivery.
    public var retention: Duration
    /// How often the retention pruner runs.
    public var pruneInterval: Duration
    /// How long an apns_id stays spent after its job was enqueued, once no job or dead letter holds it (an
    /// INSERT reusing it is skipped); longer than any producer's retry horizon. Latest-wins marks of keys
    /// not claimed for this long are forgotten too.
    public var apnsIDMemory: Duration = .seconds(30 * 86_400)
    /// Outcomes are written at least this often, or when a batch fills.
    public var recordInterval: Duration
    /// The retry policy before the priority-aware stretch.
    public var retry: RetryPolicy.Configuration
    /// How long in-flight sends may finish after SIGTERM before their jobs are left to the reaper.
    public var shutdownGrace: Duration
    /// The first pause of a credential APNs rejects; doubles up to ``maximumCredentialPause``.
    public var credentialPause: Duration
    /// The longest pause of a rejected credential.
    public var maximumCredentialPause: Duration
    /// How often the worker writes its heartbeat (and extends the leases of the jobs it holds).
    public var heartbeatInterval: Duration = .seconds(2)
    /// A worker whose heartbeat is older than this is gone: its running jobs return to pending (three
    /// heartbeats). A live worker never starts a send once its own heartbeat is this old.
    public var staleAfter: Duration = .seconds(6)
    /// After this worker (or Postgres) was cut off, how long it waits before it takes other workers for
    /// gone: they were cut off too, and Postgres' client pool backs off up to a minute between connects.
    public var reconnectGrace: Duration = .seconds(75)
    /// How long a worker whose heartbeat is stale but whose Postgres sessions are still open (frozen or cut
    /// off: it may still read answers to requests it wrote) keeps its jobs before another worker sends them.
    public var frozenAfter: Duration = .seconds(120)
    /// Whether this worker's sessions carry its id as `application_name` (not behind a pooler).
    public var sessionTracked = false
    /// Unknown outcomes (connection lost mid-request, stream reset, deadline) a job may have before it
    /// is dead-lettered; separate from the retry policy's attempts.
    public var transportBudget: Int = 10
    /// How long a job whose credential no live worker can sign for waits before it is dead-lettered (MS028).
    public var credentialWait: Duration = .seconds(600)
    /// The credentials this worker can sign for (it claims only these); `nil` claims any.
    public var credentials: [String]?
    /// How webhook deliveries are POSTed (when the worker is given a webhook client).
    public var webhooks = WebhookSettings()

    /// Defaults: 500 in flight, batches of 250, 60 s lease, 1 s poll, 7 days retention.
    public init(
        workerID: String,
        concurrency: Int = 500,
        batchSize: Int = 250,
        lease: Duration = .seconds(60),
        pollInterval: Duration = .seconds(1),
        reaperInterval: Duration = .seconds(5),
        retention: Duration = .seconds(7 * 86_400),
        pruneInterval: Duration = .seconds(60),
        recordInterval: Duration = .milliseconds(5),
        retry: RetryPolicy.Configuration = .init(),
        shutdownGrace: Duration = .seconds(20),
        credentialPause: Duration = .seconds(30),
        maximumCredentialPause: Duration = .seconds(600)
    ) {
        self.workerID = workerID
        self.concurrency = concurrency
        self.batchSize = batchSize
        self.lease = lease
        self.pollInterval = pollInterval
        self.reaperInterval = reaperInterval
        self.retention = retention
        self.pruneInterval = pruneInterval
        self.recordInterval = recordInterval
        self.retry = retry
        self.shutdownGrace = shutdownGrace
        self.credentialPause = credentialPause
        self.maximumCredentialPause = maximumCredentialPause
    }
}
