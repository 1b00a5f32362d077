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
        /// The connections the batch's requests went out on, held until it ends (a cancellation resets there).
        var connections: [HTTP2Connection] = []
        /// Answers the in-call rules send again, each as the work to do first (it returns the request's
        /// index to write again, or `nil` once the request has its result), for the batch's loop to take.
        var redos: [Redo] = []
        var redoWaiter: CheckedContinuation<Redo?, Never>?
    }

    /// What the batch's loop does for a request the in-call rules send again.
    typealias Redo = @Sendable () async -> Int?

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

    /// Hands a request the in-call rules send again to the batch's loop (called from the handler, before
    /// its answer counts as delivered, so the batch never looks finished in between): it stays outstanding
    /// until the loop has taken it (``redoTaken()``).
    func redo(_ work: @escaping Redo) {
        let waiter = self.state.withLock { state -> CheckedContinuation<Redo?, Never>? in
            state.outstanding += 1
            guard let waiter = state.redoWaiter else {
                state.redos.append(work)
                return nil
            }
            state.redoWaiter = nil
            return waiter
        }
        waiter?.resume(returning: work)
    }

    /// The next request the rules send again, waiting for one while answers are outstanding; `nil` once every
    /// request has its result. Only the batch's loop calls it.
    func nextRedo() async -> Redo? {
        await withCheckedContinuation { (continuation: CheckedContinuation<Redo?, Never>) in
            let ready = self.state.withLock { state -> Redo?? in
                if !state.redos.isEmpty { return .some(state.redos.removeFirst()) }
                if state.outstanding == 0 { return .some(nil) }
                state.redoWaiter = continuation
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }

    /// Every request the rules send again that is queued now, without waiting.
    func takeRedos() -> [Redo] {
        self.state.withLock { state in
            defer { state.redos.removeAll() }
            return state.redos
        }
    }

    /// The loop has done a redo's work: it no longer counts as outstanding (written again, its new attempt
    /// does).
    func redoTaken() { self.finishedOne() }

    private func finishedOne() {
        let (done, waiter) = self.state.withLock {
            state -> (CheckedContinuation<Void, Never>?, CheckedContinuation<Redo?, Never>?) in
            state.outstanding -= 1
            guard state.outstanding == 0 else { return (nil, nil) }
            defer { (state.done, state.redoWaiter) = (nil, nil) }
            return (state.done, state.redoWaiter)
        }
        done?.resume()
        waiter?.resume(returning: nil)
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
        let connections = self.state.withLock { $0.connections }
        for connection in connections { connection.exchange.cancel(self) }
    }
}
