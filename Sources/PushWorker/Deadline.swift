import Synchronization

/// A statement that did not answer within its deadline: the caller stops waiting and retries. (Seen once in a
/// few dozen outages: after Postgres came back, one worker's outcome write never returned, and the worker held
/// its jobs for ever, silently.)
struct DeadlineExceeded: Error, CustomStringConvertible {
    var what: String
    var limit: Duration
    var description: String { "\(self.what) did not answer within \(self.limit); no longer waiting for it" }
}

/// Runs `operation`, and stops waiting for it after `limit` (throwing ``DeadlineExceeded``). The operation runs
/// in a task of its own, cancelled at the deadline; one that ignores the cancellation finishes on its own and its
/// answer is dropped, so it must be safe to repeat (the outcome write is fenced, a claim unanswered leaves its
/// jobs to their lease).
func withDeadline<T: Sendable>(
    _ limit: Duration,
    _ what: String,
    _ operation: @escaping @Sendable () async throws -> T
) async throws -> T {
    let settled = Mutex(false)
    let task = Task { try await operation() }
    return try await withTaskCancellationHandler {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            let resume: @Sendable (Result<T, any Error>) -> Void = { result in
                let first = settled.withLock { done in
                    defer { done = true }
                    return !done
                }
                if first { continuation.resume(with: result) }
            }
            Task {
                do { resume(.success(try await task.value)) } catch { resume(.failure(error)) }
            }
            Task {
                try? await Task.sleep(for: limit)
                task.cancel()
                resume(.failure(DeadlineExceeded(what: what, limit: limit)))
            }
        }
    } onCancel: {
        task.cancel()
    }
}
