import PushCore
import Synchronization

/// Keeps one worker's sends of each rate limit at least one interval apart. The claim gives every limited
/// job a send time from the limit's fleet-wide schedule; on a busy machine several sleeping sends can wake
/// late together, or queue behind other requests for a connection's streams, and would leave at once.
/// Each takes the next free slot here when it wakes (``slot(for:notBefore:)``), and is admitted to the wire
/// only an interval after the last request of its limit this worker wrote (``admit(_:now:)``); one that is
/// not is withdrawn unsent and uncounted, and its claim schedules it again.
final class SendSpacer: Sendable {
    private let last = Mutex<[Int64: ContinuousClock.Instant]>([:])
    private let written = Mutex<[Int64: ContinuousClock.Instant]>([:])

    /// The time to send a job of `spacing`'s limit, and records it as that limit's last send.
    func slot(for spacing: SendSpacing, notBefore earliest: ContinuousClock.Instant) -> ContinuousClock.Instant {
        let interval = Duration.nanoseconds(Int64(min(max(spacing.interval, 0), 86_400 * 30) * 1e9))
        return self.last.withLock { last in
            let slot = last[spacing.scope].map { max(earliest, $0 + interval) } ?? earliest
            last[spacing.scope] = slot
            return slot
        }
    }

    /// Whether a request of `spacing`'s limit may be written now (asked just before the write): at least
    /// nine tenths of an interval after the last one this worker wrote. Records the write when it may.
    func admit(_ spacing: SendSpacing, now: ContinuousClock.Instant) -> Bool {
        let interval = Duration.nanoseconds(Int64(min(max(spacing.interval, 0), 86_400 * 30) * 0.9e9))
        return self.written.withLock { written in
            if let last = written[spacing.scope], now - last < interval { return false }
            written[spacing.scope] = now
            return true
        }
    }
}
