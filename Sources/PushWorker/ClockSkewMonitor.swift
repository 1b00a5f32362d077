import Foundation
import Logging
import Metrics
import PushCore
import PushTransport

/// Compares the host clock with APNs' (`Date` response header) and warns, before provider tokens start
/// failing, when they are more than ``ClockSkew/limit`` apart. Samples at most one response every 10 s
/// (parsing a date per response would cost the drain), publishes `push_clock_skew_seconds` (APNs minus
/// host), and logs a warning at most every 10 minutes while the skew lasts.
final class ClockSkewMonitor: Sendable {
    let logger: Logger
    let gauge = Gauge(label: "push_clock_skew_seconds")
    private let state = Locked(State())

    struct State {
        var lastSample: ContinuousClock.Instant?
        var lastWarning: ContinuousClock.Instant?
        var skew: TimeInterval?
    }

    /// The process's clock: the samples' spacing, and the host's wall time.
    let clock: any PushClock

    init(clock: any PushClock, logger: Logger) {
        self.clock = clock
        self.logger = logger
    }

    /// The last measured skew (APNs minus host), or `nil` before a sample.
    var skew: TimeInterval? { self.state.withLock { $0.skew } }

    func observe(_ response: APNsResponse) {
        guard response.serverDate != nil else { return }
        let now = self.clock.now
        let due = self.state.withLock { state -> Bool in
            if let last = state.lastSample, now - last < .seconds(10) { return false }
            state.lastSample = now
            return true
        }
        guard due,
            let skew = ClockSkew.measure(
                serverDate: response.serverDate,
                receivedAt: self.clock.wallNow,
                latency: response.latency
            )
        else { return }
        self.gauge.record(skew)
        let warn = self.state.withLock { state -> Bool in
            state.skew = skew
            guard abs(skew) > ClockSkew.limit else {
                state.lastWarning = nil
                return false
            }
            if let last = state.lastWarning, now - last < .seconds(600) { return false }
            state.lastWarning = now
            return true
        }
        if warn {
            let direction = skew > 0 ? "behind" : "ahead of"
            self.logger.warning(
                "the host clock is \(Int(abs(skew).rounded())) s \(direction) APNs': provider tokens will be refused (InvalidProviderToken, BadDate); sync it (chrony or systemd-timesyncd)",
                metadata: ["push.clock_skew_seconds": "\(Int(skew.rounded()))"]
            )
        }
    }
}
