import Synchronization

/// Where a connection's ``FrameExchange`` hands each ended request, on the event loop as it ends (no task,
/// promise or thread hop per request): the engine's batch (``PushClient/Batch``, which reads the answer and
/// applies the in-call rules itself), or one lone request's caller (``LoneRequest``).
protocol AnswerSink: AnyObject, Sendable {
    /// Whether the caller gave up: requests not yet written are withdrawn.
    var isCancelled: Bool { get }

    /// `count` requests are about to be submitted to `exchange`: the sink waits for their answers, and a
    /// cancellation resets them there.
    func expect(_ count: Int, on exchange: FrameExchange.Handle)

    /// One request's answer (or failure), as its stream ended.
    func deliver(_ index: Int, _ result: Result<HTTP2Answer, TransportError>)
}

/// The bookkeeping every sink keeps: requests outstanding, the one waiter for the last of them, and the
/// exchanges to reset if the caller gives up.
struct Outstanding {
    var count = 0
    var done: CheckedContinuation<Void, Never>?
    /// The connections' exchanges the requests went out on, held until the end (a cancellation resets there).
    var exchanges: [FrameExchange.Handle] = []

    mutating func expect(_ count: Int, on exchange: FrameExchange.Handle) {
        self.count += count
        if !self.exchanges.contains(where: { $0.id == exchange.id }) { self.exchanges.append(exchange) }
    }

    /// Parks the one waiter for the last answer; `false` when none is outstanding (the caller resumes it).
    mutating func park(_ waiter: CheckedContinuation<Void, Never>) -> Bool {
        guard self.count > 0 else { return false }
        self.done = waiter
        return true
    }

    /// One fewer outstanding: the waiter to resume if it was the last.
    mutating func finishedOne() -> CheckedContinuation<Void, Never>? {
        self.count -= 1
        guard self.count == 0 else { return nil }
        defer { self.done = nil }
        return self.done
    }
}

/// One request sent alone without the in-call rules (FCM's OAuth token exchange): its answer, and the
/// caller's wait for it.
final class LoneRequest: AnswerSink {
    private struct State {
        var outstanding = Outstanding()
        var result: Result<HTTP2Answer, TransportError>?
    }

    private let state = Mutex(State())
    private let cancelledFlag = Atomic(false)

    var isCancelled: Bool { self.cancelledFlag.load(ordering: .acquiring) }

    func expect(_ count: Int, on exchange: FrameExchange.Handle) {
        self.state.withLock { $0.outstanding.expect(count, on: exchange) }
    }

    func deliver(_ index: Int, _ result: Result<HTTP2Answer, TransportError>) {
        let done = self.state.withLock { state in
            state.result = result
            return state.outstanding.finishedOne()
        }
        done?.resume()
    }

    /// Runs `submit` (which hands the request to an exchange) and waits for the answer (`nil`: none came).
    /// The cancellation handler is in place before the request leaves this task: a cancelled caller withdraws
    /// it if it has not reached the event loop, and resets it (an unknown outcome) if it has.
    func answer(submitting submit: () -> Void) async -> Result<HTTP2Answer, TransportError>? {
        await withTaskCancellationHandler {
            submit()
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                if !self.state.withLock({ $0.outstanding.park(continuation) }) { continuation.resume() }
            }
        } onCancel: {
            self.cancel()
        }
        return self.state.withLock { $0.result }
    }

    func cancel() {
        self.cancelledFlag.store(true, ordering: .releasing)
        for exchange in self.state.withLock({ $0.outstanding.exchanges }) { exchange.cancel(self) }
    }
}
