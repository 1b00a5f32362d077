/// The clock the worker's timers read: pauses, the outcome writer's batching and backoff, the connection
/// pool's reconnect backoff, the heartbeat's freshness. Monotonic, so a wall-clock step neither ends nor
/// stretches a wait. `ContinuousClock` in production; tests pass a `ManualClock` (PushClockTesting) and move
/// time by hand instead of sleeping (as postgres-nio's `ConnectionPool` takes its `Clock`).
///
/// Its instants are `ContinuousClock`'s, so the state machines that store them (`PoolStateMachine`,
/// `WorkerLiveness`, `Pauses`) need no generic parameter. What is written to Postgres or into a JWT (`iat`)
/// is wall time and stays `Date`: those instants are read by other machines.
public protocol MonotonicClock: Clock, Sendable
where Instant == ContinuousClock.Instant, Duration == Swift.Duration {}

extension ContinuousClock: MonotonicClock {}
