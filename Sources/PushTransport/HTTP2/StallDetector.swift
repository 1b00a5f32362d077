import Foundation
import NIOCore
import Synchronization

/// Notices when this whole process stopped running for a while (SIGSTOP, a paused VM, a throttled
/// container): a thread that sleeps a quarter second and finds that much more time passed. Request
/// deadlines that fall due just after such a stall are no evidence against the request: the answer may be
/// sitting unread in the socket since long before (``FrameExchange`` gives those streams a grace period).
final class StallDetector: Sendable {
    static let shared = StallDetector()

    /// How much longer than its sleep a tick may take before the process counts as having been stalled.
    static let threshold = TimeAmount.seconds(1)
    static let tick = TimeAmount.milliseconds(250)

    /// When the last stall ended, in `NIODeadline` uptime nanoseconds; 0: none seen.
    private let lastStallEnd = Atomic<UInt64>(0)

    private init() {
        let thread = Thread { [self] in
            // This detector reads the system's clock itself, not the process's injected one: it measures this
            // process's own time against the system's, on NIO's timer clock (the deadlines it excuses are NIO's).
            var previous: NIODeadline?
            while true {
                let now = NIODeadline.now()
                if let previous, now - previous > Self.tick + Self.threshold {
                    self.lastStallEnd.store(now.uptimeNanoseconds, ordering: .relaxed)
                }
                previous = now
                Thread.sleep(forTimeInterval: Double(Self.tick.nanoseconds) / 1e9)
            }
        }
        thread.name = "push-stall-detector"
        thread.start()
    }

    /// When the last stall this process noticed ended, if any.
    var lastStall: NIODeadline? {
        let nanos = self.lastStallEnd.load(ordering: .relaxed)
        return nanos == 0 ? nil : NIODeadline.uptimeNanoseconds(nanos)
    }
}
