/// Whether this worker counts as alive to the fleet, and whether it may judge others: its heartbeat's
/// freshness (sends start only while fresh, so no other worker takes it for gone and claims its jobs
/// again), being cut off from Postgres, and when it may first reap the jobs of workers that look gone. A
/// plain value on the monotonic clock, the time passed in.
struct WorkerLiveness: Sendable {
    /// After this long without a heartbeat, other workers take this one for gone.
    let staleAfter: Duration
    /// How often this worker beats.
    let heartbeatInterval: Duration
    /// After being cut off, how long the others get to check in before this worker judges them.
    let reconnectGrace: Duration

    /// The last heartbeat Postgres took.
    private(set) var lastHeartbeat: ContinuousClock.Instant?
    /// When this worker may first take other workers for gone; `nil` while cut off (or before the first
    /// heartbeat).
    private(set) var reapAllowedAfter: ContinuousClock.Instant?
    /// Whether a heartbeat failed to reach the database since the last success.
    private(set) var cutOff = false

    init(staleAfter: Duration, heartbeatInterval: Duration, reconnectGrace: Duration) {
        self.staleAfter = staleAfter
        self.heartbeatInterval = heartbeatInterval
        self.reconnectGrace = reconnectGrace
    }

    /// A heartbeat went through at `now`. One that took longer than a stale period to get through
    /// (Postgres' pool queues queries while it reconnects: a failover, a network cut) means this worker was
    /// cut off, and so, likely, were the others: they get the reconnect grace before they are judged. The
    /// first heartbeat waits a whole stale period (the others may be checking in too).
    mutating func heartbeatSucceeded(at now: ContinuousClock.Instant) {
        if let last = self.lastHeartbeat, now - last > self.staleAfter { self.cutOff = true }
        if self.cutOff || self.reapAllowedAfter == nil {
            self.reapAllowedAfter = now + (self.cutOff ? self.reconnectGrace : self.staleAfter)
        }
        self.lastHeartbeat = now
        self.cutOff = false
    }

    /// A heartbeat failed. A lost connection cuts this worker off (no reaping until it is back and the
    /// grace has passed); a statement the server refused (a deadlock, say) is no outage.
    mutating func heartbeatFailed(connectionLost: Bool) {
        guard connectionLost else { return }
        self.reapAllowedAfter = nil
        self.cutOff = true
    }

    /// Whether this worker may start a send at `now`: its heartbeat is fresh with half an interval to
    /// spare.
    func isFresh(at now: ContinuousClock.Instant) -> Bool {
        guard let last = self.lastHeartbeat else { return false }
        return now - last < self.staleAfter - self.heartbeatInterval / 2
    }

    /// Whether this worker may reap the jobs of workers that look gone, at `now`.
    func mayReap(at now: ContinuousClock.Instant) -> Bool {
        guard let after = self.reapAllowedAfter else { return false }
        return now >= after
    }
}
