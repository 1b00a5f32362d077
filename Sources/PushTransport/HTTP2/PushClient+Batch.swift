import Synchronization

extension PushClient {
    /// The requests of one ``PushClient/sendBatch(_:endpoint:credential:mayWrite:withdraws:onResult:)`` call in
    /// flight. The frame exchange hands each ended request straight to it, on the event loop: it reads the
    /// answer with the provider, applies the in-call rules (``InCallRules``), and either hands the result to
    /// the caller or queues the request for the batch's loop to write again. The caller waits once, for the
    /// last result.
    final class Batch: AnswerSink {
        /// Which connection and token a request went out with: an answer the rules act on needs both.
        typealias Sent = (connection: HTTP2Connection, authorization: String?)
        typealias OnResult = @Sendable (_ index: Int, _ result: Result<Response, any Error>) -> Void

        /// A request the in-call rules send again: what its answer was and what to do first.
        struct Redo: Sendable {
            var step: InCallRules.Step
            var index: Int
            var sent: Sent
            var answer: Result<Response, TransportError>
        }

        private struct State {
            var outstanding = Outstanding()
            var sent: [Sent?]
            var rules: [InCallRules]
            /// Requests the rules send again, for the batch's loop to take.
            var redos: [Redo] = []
            var redoWaiter: CheckedContinuation<Redo?, Never>?
        }

        private let engine: PushClient
        private let pool: ConnectionPool
        /// Whether the credential sends a bearer token (an answer about a token can be acted on).
        private let bearer: Bool
        let onResult: OnResult
        private let state: Mutex<State>
        private let cancelledFlag = Atomic(false)

        init(count: Int, engine: PushClient, pool: ConnectionPool, bearer: Bool, onResult: @escaping OnResult) {
            self.engine = engine
            self.pool = pool
            self.bearer = bearer
            self.onResult = onResult
            self.state = Mutex(
                State(
                    sent: [Sent?](repeating: nil, count: count),
                    rules: [InCallRules](repeating: InCallRules(), count: count)
                )
            )
        }

        /// Whether the caller gave up: requests not yet written are withdrawn.
        var isCancelled: Bool { self.cancelledFlag.load(ordering: .acquiring) }

        func expect(_ count: Int, on exchange: FrameExchange.Handle) {
            self.state.withLock { $0.outstanding.expect(count, on: exchange) }
        }

        /// The requests at `indices` are about to be written on `connection` with `authorization`.
        func sending(_ indices: [Int], on connection: HTTP2Connection, authorization: String?) {
            self.state.withLock { state in
                for index in indices { state.sent[index] = (connection, authorization) }
            }
        }

        /// One request's answer (or failure), as its stream ended: read, ruled on, and handed on.
        func deliver(_ index: Int, _ answer: Result<HTTP2Answer, TransportError>) {
            let provider = self.engine.provider
            let result = answer.map(provider.parse)
            var notProcessed = false
            switch result {
            case .success: self.pool.succeeded()
            case .failure(let error):
                // Certainly not processed: sent again at once, on another connection if this one is going.
                // Past the resend limit the caller gives the job back to the queue, uncounted.
                notProcessed = error.fault == .notProcessed
                if notProcessed { self.engine.countNotProcessed(1) }
            }
            let cancelled = self.isCancelled
            let (step, sent) = self.state.withLock { state -> (InCallRules.Step, Sent?) in
                let sent = state.sent[index]
                state.sent[index] = nil
                switch result {
                case .success(let response):
                    // What the answer does to the connection is its reason's row, acted on once per request;
                    // the same answer again is the job's.
                    return (
                        state.rules[index].answered(
                            effect: provider.connectionEffect(of: response),
                            carriedToken: self.bearer && sent?.authorization != nil
                        ), sent
                    )
                case .failure:
                    return (state.rules[index].failed(notProcessed: notProcessed, cancelled: cancelled), sent)
                }
            }
            switch (step, sent) {
            case (.deliver, _), (.fail, _), (_, nil):
                if case .success(let response) = result {
                    sent?.connection.limiter.noteCredential(accepted: provider.credentialAccepted(by: response))
                }
                self.onResult(index, result.mapError { $0 })
                self.finishedOne()
            case (_, let sent?):
                // Back to the batch's loop, still outstanding (so the batch never looks finished in between)
                // until the loop has taken it (``redoTaken()``).
                let redo = Redo(step: step, index: index, sent: sent, answer: result)
                let waiter = self.state.withLock { state -> CheckedContinuation<Redo?, Never>? in
                    guard let waiter = state.redoWaiter else {
                        state.redos.append(redo)
                        return nil
                    }
                    state.redoWaiter = nil
                    return waiter
                }
                waiter?.resume(returning: redo)
            }
        }

        /// The next request the rules send again, waiting for one while answers are outstanding; `nil` once
        /// every request has its result. Only the batch's loop calls it.
        func nextRedo() async -> Redo? {
            await withCheckedContinuation { (continuation: CheckedContinuation<Redo?, Never>) in
                let ready = self.state.withLock { state -> Redo?? in
                    if !state.redos.isEmpty { return .some(state.redos.removeFirst()) }
                    if state.outstanding.count == 0 { return .some(nil) }
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

        /// The loop has done a redo's work: it no longer counts as outstanding (written again, its new
        /// attempt does).
        func redoTaken() { self.finishedOne() }

        private func finishedOne() {
            let (done, waiter) = self.state.withLock {
                state -> (CheckedContinuation<Void, Never>?, CheckedContinuation<Redo?, Never>?) in
                let done = state.outstanding.finishedOne()
                guard state.outstanding.count == 0 else { return (nil, nil) }
                defer { state.redoWaiter = nil }
                return (done, state.redoWaiter)
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
                    if !self.state.withLock({ $0.outstanding.park(continuation) }) { continuation.resume() }
                }
            } onCancel: {
                self.cancel()
            }
        }

        /// Gives up on the batch: see ``waitForAll()``.
        func cancel() {
            self.cancelledFlag.store(true, ordering: .releasing)
            for exchange in self.state.withLock({ $0.outstanding.exchanges }) { exchange.cancel(self) }
        }
    }
}
