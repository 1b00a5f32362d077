/// What the pool's state machine needs to know of a connection.
protocol PoolConnection: AnyObject {
    /// Whether new requests may go to it (open, no GOAWAY).
    var isUsable: Bool { get }
    /// Streams free on it now.
    var freeStreams: Int { get }
}

extension HTTP2Connection: PoolConnection {
    var freeStreams: Int { self.limiter.available }
}

/// The connection pool's decisions as a plain state machine (the NIO / postgres-nio pattern): events in,
/// actions out, time passed in. ``ConnectionPool`` holds it under its lock and carries the actions out.
struct PoolStateMachine<Connection: PoolConnection> {
    /// What the caller does next.
    enum Action {
        /// Send on this connection.
        case use(Connection)
        /// Open a connection into this slot, with this id.
        case open(slot: Int, id: Int)
        /// Every slot is connecting: wait for one to finish.
        case wait
        /// Connects are backing off and no connection is open: the endpoint is unreachable until then.
        case unreachable(until: ContinuousClock.Instant)
    }

    private(set) var slots: [Connection?]
    private(set) var connecting: [Bool]
    private(set) var backoff: Duration = .zero
    private(set) var retryAt: ContinuousClock.Instant?
    private var nextConnectionID = 0
    private var roundRobin = 0
    /// Whether a request has been answered since the last connect: only then is the backoff reset, so a
    /// peer that accepts and at once sends GOAWAY (or drops) is not reconnected to in a tight loop.
    private var answeredSinceConnect = true
    let initialBackoff: Duration
    let maximumBackoff: Duration

    init(size: Int, initialBackoff: Duration, maximumBackoff: Duration) {
        self.slots = Array(repeating: nil, count: max(size, 1))
        self.connecting = Array(repeating: false, count: max(size, 1))
        self.initialBackoff = initialBackoff
        self.maximumBackoff = maximumBackoff
    }

    /// Connections open and usable.
    var openCount: Int { self.slots.compactMap { $0 }.filter(\.isUsable).count }

    /// The next step for a request: sweeps connections that went away (returned, to be retired), then
    /// uses the connection with the most free streams, opens an empty slot, waits, or reports backoff.
    mutating func next(now: ContinuousClock.Instant) -> (action: Action, swept: [Connection]) {
        var swept: [Connection] = []
        for index in self.slots.indices {
            if let connection = self.slots[index], !connection.isUsable {
                swept.append(connection)
                self.slots[index] = nil
                self.connectionLost(now: now)
            }
        }
        let backingOff = self.retryAt.map { $0 > now } ?? false
        if backingOff, self.slots.allSatisfy({ $0 == nil }), let retryAt = self.retryAt {
            return (.unreachable(until: retryAt), swept)
        }
        if !backingOff, let empty = self.slots.indices.first(where: { self.slots[$0] == nil && !self.connecting[$0] }) {
            self.connecting[empty] = true
            self.nextConnectionID += 1
            return (.open(slot: empty, id: self.nextConnectionID), swept)
        }
        let open = self.slots.compactMap { $0 }
        if let best = open.max(by: { $0.freeStreams < $1.freeStreams }) {
            if best.freeStreams > 0 { return (.use(best), swept) }
            self.roundRobin &+= 1
            return (.use(open[self.roundRobin % open.count]), swept)
        }
        // Nothing open and nothing to open now: either a connect is under way, or a backoff just ended
        // while another slot connects.
        if self.connecting.contains(true) { return (.wait, swept) }
        return (.unreachable(until: self.retryAt ?? now), swept)
    }

    /// A connect into `slot` succeeded.
    mutating func connected(_ connection: Connection, slot: Int) {
        self.slots[slot] = connection
        self.connecting[slot] = false
        self.answeredSinceConnect = false
        self.retryAt = nil
    }

    /// A connect into `slot` failed: back off (1 s doubling to the cap). Returns the wait.
    mutating func connectFailed(slot: Int, now: ContinuousClock.Instant) -> Duration {
        self.connecting[slot] = false
        self.bumpBackoff(now: now)
        return self.backoff
    }

    /// The caller takes `connection` out (GOAWAY seen, PING unanswered, UnrelatedKeyIdInToken); returns
    /// whether it was still in a slot.
    mutating func discard(_ connection: Connection, now: ContinuousClock.Instant) -> Bool {
        guard let index = self.slots.firstIndex(where: { $0 === connection }) else { return false }
        self.slots[index] = nil
        self.connectionLost(now: now)
        return true
    }

    /// APNs answered a request: the endpoint works; reconnects need no backoff.
    mutating func answered() {
        guard !self.answeredSinceConnect else { return }
        self.answeredSinceConnect = true
        self.backoff = .zero
        self.retryAt = nil
    }

    /// Empties every slot; returns the connections to close.
    mutating func closeAll() -> [Connection] {
        defer { self.slots = self.slots.map { _ in nil } }
        return self.slots.compactMap { $0 }
    }

    private mutating func connectionLost(now: ContinuousClock.Instant) {
        // A connection that never got an answer went away: the next connect waits out the backoff.
        guard !self.answeredSinceConnect else { return }
        self.bumpBackoff(now: now)
    }

    private mutating func bumpBackoff(now: ContinuousClock.Instant) {
        self.backoff = self.backoff == .zero ? self.initialBackoff : min(self.backoff * 2, self.maximumBackoff)
        self.retryAt = now + self.backoff
    }
}
