import Synchronization

/// How many requests one connection may have in flight: 1 until a request with a valid token has
/// succeeded on it, then the peer's live `SETTINGS_MAX_CONCURRENT_STREAMS`. Waiters queue in order.
///
/// A lock around a small state machine (STYLE rule 6); `acquire` suspends only when the connection is full.
final class StreamLimiter: Sendable {
    struct State {
        var peerMaxStreams: Int = 1
        var authenticated = false
        var inFlight = 0
        var closed = false
        /// Callers waiting for slots, in order; each wants up to `want` (a batch takes what is free).
        var waiters: [(id: UInt64, want: Int, continuation: CheckedContinuation<Int, Never>)] = []
        var nextWaiterID: UInt64 = 0

        /// The number of streams allowed right now.
        var limit: Int { self.authenticated ? max(self.peerMaxStreams, 1) : 1 }

        /// Up to `want` slots at once when free and nobody queues before; 0 when closed; `nil` to wait.
        mutating func grantNow(_ want: Int) -> Int? {
            if self.closed { return 0 }
            guard self.inFlight < self.limit && self.waiters.isEmpty else { return nil }
            let granted = min(self.limit - self.inFlight, want)
            self.inFlight += granted
            return granted
        }

        /// Hands free slots to queued waiters, in order; returns the ones to resume with their grants.
        mutating func admitWaiters() -> [(CheckedContinuation<Int, Never>, Int)] {
            var admitted: [(CheckedContinuation<Int, Never>, Int)] = []
            while self.inFlight < self.limit, !self.waiters.isEmpty {
                let waiter = self.waiters.removeFirst()
                let granted = min(self.limit - self.inFlight, waiter.want)
                self.inFlight += granted
                admitted.append((waiter.continuation, granted))
            }
            return admitted
        }
    }

    private let state = Mutex(State())

    /// The current limit, for metrics and tests.
    var limit: Int { self.state.withLock { $0.limit } }
    /// Requests in flight now.
    var inFlight: Int { self.state.withLock { $0.inFlight } }
    /// Callers waiting for a slot now (tests).
    var waiting: Int { self.state.withLock { $0.waiters.count } }
    /// Free slots now (0 when closed).
    var available: Int { self.state.withLock { $0.closed ? 0 : max($0.limit - $0.inFlight, 0) } }

    /// Takes a slot, waiting for one if the connection is full. Returns `false` if the connection closed
    /// (or the task was cancelled) before a slot came free.
    func acquire() async -> Bool {
        await self.acquire(upTo: 1) == 1
    }

    /// Takes between 1 and `count` slots: as many as are free, waiting (in turn with the other callers)
    /// while none is. Returns 0 if the connection closed (or the task was cancelled) first.
    func acquire(upTo count: Int) async -> Int {
        let want = max(count, 1)
        let immediate = self.state.withLock { $0.grantNow(want) }
        if let immediate { return immediate }
        let id = self.state.withLock { state -> UInt64 in
            state.nextWaiterID += 1
            return state.nextWaiterID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let resume: Int? = self.state.withLock { state in
                    if Task.isCancelled { return 0 }
                    if let granted = state.grantNow(want) { return granted }
                    state.waiters.append((id, want, continuation))
                    return nil
                }
                if let resume { continuation.resume(returning: resume) }
            }
        } onCancel: {
            let waiter = self.state.withLock { state -> CheckedContinuation<Int, Never>? in
                guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                return state.waiters.remove(at: index).continuation
            }
            waiter?.resume(returning: 0)
        }
    }

    /// Gives `count` slots back.
    func release(_ count: Int = 1) {
        guard count > 0 else { return }
        let admitted = self.state.withLock { state in
            state.inFlight = max(state.inFlight - count, 0)
            return state.admitWaiters()
        }
        for (waiter, granted) in admitted { waiter.resume(returning: granted) }
    }

    /// A request with a valid token succeeded: from now on the peer's SETTINGS value applies.
    func markAuthenticated() {
        let admitted = self.state.withLock { state -> [(CheckedContinuation<Int, Never>, Int)] in
            guard !state.authenticated else { return [] }
            state.authenticated = true
            return state.admitWaiters()
        }
        for (waiter, granted) in admitted { waiter.resume(returning: granted) }
    }

    /// An answer on this connection: one that proves the credential (``markAuthenticated()``) widens the
    /// limit to the peer's, one that refuses it may drop it back (``markUnauthenticated()``); `nil` changes
    /// nothing.
    func noteCredential(accepted: Bool?) {
        switch accepted {
        case true?: self.markAuthenticated()
        case false?: self.markUnauthenticated()
        case nil: break
        }
    }

    /// A credential rejection: APNs may drop the limit back to 1 until the next success.
    func markUnauthenticated() {
        self.state.withLock { $0.authenticated = false }
    }

    /// The peer sent `SETTINGS_MAX_CONCURRENT_STREAMS`. A decrease applies to new requests at once.
    func updatePeerMaxStreams(_ value: Int) {
        let admitted = self.state.withLock { state in
            state.peerMaxStreams = value
            return state.admitWaiters()
        }
        for (waiter, granted) in admitted { waiter.resume(returning: granted) }
    }

    /// The connection is gone: wake every waiter with `false`; later acquires fail at once.
    func close() {
        let waiters = self.state.withLock { state -> [CheckedContinuation<Int, Never>] in
            state.closed = true
            defer { state.waiters.removeAll() }
            return state.waiters.map(\.continuation)
        }
        for waiter in waiters { waiter.resume(returning: 0) }
    }
}
