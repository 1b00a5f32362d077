import Synchronization

/// A statement that did not answer within its deadline: the caller stops waiting and retries. (Seen once in a
/// few dozen outages: after Postgres came back, one worker's outcome write never returned, and the worker held
/// its jobs for ever, silently. Seen once more in a test's own client: its 1,453rd INSERT in a row never
/// answered and never reached Postgres, and the run hung until its watchdog.)
public struct DeadlineExceeded: Error, CustomStringConvertible {
    /// What was waited for, in words ("the claim").
    public var what: String
    /// How long it was waited for.
    public var limit: Duration
    public var description: String { "\(self.what) did not answer within \(self.limit); no longer waiting for it" }
}

/// Runs `operation`, and stops waiting for it after `limit` (throwing ``DeadlineExceeded``). The operation runs
/// in a task of its own, cancelled at the deadline; one that ignores the cancellation finishes on its own and its
/// answer is dropped, so it must be safe to repeat (the outcome write is fenced, a claim unanswered leaves its
/// jobs to their lease). Runs once per claim and per outcome batch: two tasks, and the timer is cancelled as
/// soon as the operation answers, so no sleeping timer outlives it.
public func withDeadline<T: Sendable>(
    _ limit: Duration,
    _ what: String,
    _ operation: @escaping @Sendable () async throws -> T
) async throws -> T {
    let state = Mutex<(settled: Bool, work: Task<Void, Never>?, timer: Task<Void, Never>?)>((false, nil, nil))
    return try await withTaskCancellationHandler {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            // The first answer wins; it cancels the other side.
            let settle: @Sendable (Result<T, any Error>) -> Void = { result in
                let other = state.withLock { state -> [Task<Void, Never>]? in
                    guard !state.settled else { return nil }
                    state.settled = true
                    return [state.work, state.timer].compactMap { $0 }
                }
                guard let other else { return }
                for task in other { task.cancel() }
                continuation.resume(with: result)
            }
            let work = Task {
                do { settle(.success(try await operation())) } catch { settle(.failure(error)) }
            }
            let timer = Task {
                try? await Task.sleep(for: limit)
                if !Task.isCancelled { settle(.failure(DeadlineExceeded(what: what, limit: limit))) }
            }
            // Settled already (the operation answered at once): the tasks were not there to cancel.
            let settled = state.withLock { state in
                state.work = work
                state.timer = timer
                return state.settled
            }
            if settled { timer.cancel() }
        }
    } onCancel: {
        let work = state.withLock { $0.work }
        work?.cancel()
    }
}
