import Synchronization

/// The requests of one ``PushClient/sendBatch(_:endpoint:credential:mayWrite:withdraws:onResult:)`` call in flight: their
/// answers are handed to `handler` on the event loop as they arrive (no task, promise or thread hop per
/// request), and the caller waits once for the last of them.
final class RequestBatch: Sendable {
    typealias Handler =
        @Sendable (_ batch: RequestBatch, _ index: Int, _ result: Result<HTTP2Answer, TransportError>) -> Void

    private struct State {
        var outstanding = 0
        var done: CheckedContinuation<Void, Never>?
        var cancelled = false
        /// The connections the batch's requests went out on, held until it ends (a cancellation resets there).
        var connections: [HTTP2Connection] = []
        var followUps: [Task<Void, Never>] = []
    }

    private let handler: Handler
    private let state = Mutex(State())
    private let cancelledFlag = Atomic(false)

    init(handler: @escaping Handler) {
        self.handler = handler
    }

    /// Whether the caller gave up: requests not yet written are withdrawn.
    var isCancelled: Bool { self.cancelledFlag.load(ordering: .acquiring) }

    /// `count` requests are about to be submitted on `connection`: the batch waits for their answers, and a
    /// cancellation resets them there.
    func expect(_ count: Int, on connection: HTTP2Connection) {
        self.state.withLock { state in
            state.outstanding += count
            if !state.connections.contains(where: { $0 === connection }) {
                state.connections.append(connection)
            }
        }
    }

    /// One request's answer (or failure), as its stream ended.
    func deliver(_ index: Int, _ result: Result<HTTP2Answer, TransportError>) {
        self.handler(self, index, result)
        self.finishedOne()
    }

    /// Runs `operation` in a task of its own at once (a request the in-call rules resend or re-mint for),
    /// and waits for it as for an answer: called from the handler, before its answer counts as delivered,
    /// so the batch never looks finished in between. A cancelled batch cancels it.
    func followUp(_ operation: @escaping @Sendable () async -> Void) {
        self.state.withLock { $0.outstanding += 1 }
        let task = Task {
            // A batch cancelled before this task started: its operation sees the cancellation at once.
            if self.isCancelled { withUnsafeCurrentTask { $0?.cancel() } }
            await operation()
            self.finishedOne()
        }
        let cancelled = self.state.withLock { state -> Bool in
            state.followUps.append(task)
            return state.cancelled
        }
        if cancelled { task.cancel() }
    }

    private func finishedOne() {
        let done = self.state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.outstanding -= 1
            guard state.outstanding == 0 else { return nil }
            defer { state.done = nil }
            return state.done
        }
        done?.resume()
    }

    /// Waits until every expected request has its answer. A cancelled caller resets the ones in flight
    /// (unknown outcomes) and withdraws the ones not yet written; it still waits for those answers, which
    /// then come at once.
    func waitForAll() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let finished = self.state.withLock { state -> Bool in
                    if state.outstanding == 0 { return true }
                    state.done = continuation
                    return false
                }
                if finished { continuation.resume() }
            }
        } onCancel: {
            self.cancel()
        }
    }

    /// Gives up on the batch: see ``waitForAll()``.
    func cancel() {
        self.cancelledFlag.store(true, ordering: .releasing)
        let (connections, followUps) = self.state.withLock { state in
            state.cancelled = true
            return (state.connections, state.followUps)
        }
        for connection in connections { connection.exchange.cancel(self) }
        for task in followUps { task.cancel() }
    }
}
