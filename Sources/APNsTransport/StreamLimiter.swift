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
        var waiters: [(id: UInt64, continuation: CheckedContinuation<Bool, Never>)] = []
        var nextWaiterID: UInt64 = 0

        /// The number of streams allowed right now.
        var limit: Int { self.authenticated ? max(self.peerMaxStreams, 1) : 1 }

        /// Hands free slots to queued waiters; returns the ones to resume.
        mutating func admitWaiters() -> [CheckedContinuation<Bool, Never>] {
            var admitted: [CheckedContinuation<Bool, Never>] = []
            while self.inFlight < self.limit, !self.waiters.isEmpty {
                self.inFlight += 1
                admitted.append(self.waiters.removeFirst().continuation)
            }
            return admitted
        }
    }

    private let state = Mutex(State())

    /// The current limit, for metrics and tests.
    var limit: Int { self.state.withLock { $0.limit } }
    /// Requests in flight now.
    var inFlight: Int { self.state.withLock { $0.inFlight } }
    /// Free slots now (0 when closed).
    var available: Int { self.state.withLock { $0.closed ? 0 : max($0.limit - $0.inFlight, 0) } }

    /// Takes a slot, waiting for one if the connection is full. Returns `false` if the connection closed
    /// (or the task was cancelled) before a slot came free.
    func acquire() async -> Bool {
        let immediate: Bool? = self.state.withLock { state in
            if state.closed { return false }
            if state.inFlight < state.limit && state.waiters.isEmpty {
                state.inFlight += 1
                return true
            }
            return nil
        }
        if let immediate { return immediate }
        let id = self.state.withLock { state -> UInt64 in
            state.nextWaiterID += 1
            return state.nextWaiterID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let resume: Bool? = self.state.withLock { state in
                    if state.closed || Task.isCancelled { return false }
                    if state.inFlight < state.limit && state.waiters.isEmpty {
                        state.inFlight += 1
                        return true
                    }
                    state.waiters.append((id, continuation))
                    return nil
                }
                if let resume { continuation.resume(returning: resume) }
            }
        } onCancel: {
            let waiter = self.state.withLock { state -> CheckedContinuation<Bool, Never>? in
                guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                return state.waiters.remove(at: index).continuation
            }
            waiter?.resume(returning: false)
        }
    }

    /// Gives a slot back.
    func release() {
        let admitted = self.state.withLock { state in
            state.inFlight = max(state.inFlight - 1, 0)
            return state.admitWaiters()
        }
        for waiter in admitted { waiter.resume(returning: true) }
    }

    /// A request with a valid token succeeded: from now on the peer's SETTINGS value applies.
    func markAuthenticated() {
        let admitted = self.state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            guard !state.authenticated else { return [] }
            state.authenticated = true
            return state.admitWaiters()
        }
        for waiter in admitted { waiter.resume(returning: true) }
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
        for waiter in admitted { waiter.resume(returning: true) }
    }

    /// The connection is gone: wake every waiter with `false`; later acquires fail at once.
    func close() {
        let waiters = self.state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            state.closed = true
            defer { state.waiters.removeAll() }
            return state.waiters.map(\.continuation)
        }
        for waiter in waiters { waiter.resume(returning: false) }
    }
}
