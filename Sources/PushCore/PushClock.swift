public import Foundation

/// The one clock of a process, made by its composition root (`push-worker`'s commands) and passed to every
/// service: the worker's timers, the outcome writer's batching and backoff, the connection pool's reconnect
/// backoff, the heartbeat's freshness, the token caches, the console's sessions.
///
/// Two readings of one source:
/// - ``now`` (the `Clock`): monotonic, so a wall-clock step neither ends nor stretches a wait. Its instants are
///   `ContinuousClock`'s, so the state machines that store them (`PoolStateMachine`, `WorkerLiveness`,
///   `Pauses`) need no generic parameter.
/// - ``wallNow``: wall time, for what other machines read (a row's time, a JWT's `iat`, a webhook's signed
///   timestamp, a certificate's dates, an HTTP `Retry-After` date).
///
/// `ContinuousClock` in production; tests pass a `ManualClock` (PushClockTesting) and move both readings by hand
/// instead of sleeping (as postgres-nio's `ConnectionPool` takes its `Clock`).
public protocol PushClock: Clock, Sendable
where Instant == ContinuousClock.Instant, Duration == Swift.Duration {
    /// Wall time now.
    var wallNow: Date { get }
}

extension ContinuousClock: PushClock {
    /// The system's wall time: the one place production code reads it.
    public var wallNow: Date { Date() }
}
