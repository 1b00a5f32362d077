/// Whether a provider is down, as its answers across distinct jobs show it ("Provider outages burn nothing"):
/// APNs production or development, or one FCM project. Pure: the caller passes the instants.
///
/// Up, it counts the answers of the last ``window`` in one-second buckets. When more than half of at least
/// ``minimumAnswers`` answers (each job counted once) are 5xx, the provider is down: the worker sends its jobs
/// back to `pending` uncounted, stops claiming them, and sends one probe request at a time, the first after
/// ``firstProbe``, each later one twice as late up to ``lastProbe``. The probe's answer decides: a 5xx keeps
/// it down, anything else brings it up; a 2xx from any request (one written before the outage was seen) does
/// too. A job's own 5xx while most answers succeed is no outage: it follows the priority-aware stretch.
public struct ProviderHealth: Sendable {
    /// How far back answers are counted.
    public static let window: Duration = .seconds(10)
    /// Answers needed in the window before any verdict.
    public static let minimumAnswers = 20
    /// The first probe's wait, and the longest.
    public static let firstProbe: Duration = .seconds(1)
    public static let lastProbe: Duration = .seconds(30)

    /// A change of state, for the log line, the metric and the alert.
    public enum Change: Sendable, Equatable {
        /// `serverErrors` of `answers` in the window were 5xx (distinct jobs).
        case down(serverErrors: Int, answers: Int)
        /// Answered again after `after` down.
        case up(after: Duration)
    }

    private var window = AnswerWindow()
    /// When the outage began; `nil` while up.
    public private(set) var downSince: ContinuousClock.Instant?
    private var probeAt: ContinuousClock.Instant?
    private var probeInterval = Self.firstProbe
    /// The job whose request is the probe in flight.
    private var probe: Int64?

    public init() {}

    /// Whether the provider is taken for down.
    public var isDown: Bool { self.downSince != nil }

    /// Records one answer of `job` (`serverError`: its status is 5xx); returns the change it made, if any.
    public mutating func record(
        serverError: Bool,
        status: Int,
        job: Int64,
        at now: ContinuousClock.Instant
    ) -> Change? {
        if let since = self.downSince {
            let isProbe = self.probe == job
            if isProbe { self.probe = nil }
            if (200..<300).contains(status) || (isProbe && !serverError) {
                self = ProviderHealth()
                return .up(after: now - since)
            }
            if isProbe {
                self.probeInterval = min(self.probeInterval * 2, Self.lastProbe)
                self.probeAt = now + self.probeInterval
            }
            return nil
        }
        guard let (errors, answers) = self.window.record(bad: serverError, job: job, at: now) else { return nil }
        self.downSince = now
        self.probeAt = now + Self.firstProbe
        self.probeInterval = Self.firstProbe
        self.window = AnswerWindow()
        return .down(serverErrors: errors, answers: answers)
    }

    /// While down: whether a probe is due (the claim may take this provider's jobs again, for one of them).
    public func probeDue(at now: ContinuousClock.Instant) -> Bool {
        guard self.isDown, self.probe == nil, let probeAt = self.probeAt else { return false }
        return now >= probeAt
    }

    /// While down: makes `job`'s request the probe if one is due (returns true: send it); any other request of
    /// this provider is withdrawn unsent. Up: always true.
    public mutating func admits(job: Int64, at now: ContinuousClock.Instant) -> Bool {
        guard self.isDown else { return true }
        if self.probe == job { return true }
        guard self.probeDue(at: now) else { return false }
        self.probe = job
        return true
    }

    /// The probe's request ended without an answer (withdrawn, lost, unreachable): the next one is due after
    /// the current interval.
    public mutating func probeEnded(job: Int64, at now: ContinuousClock.Instant) {
        guard self.probe == job else { return }
        self.probe = nil
        self.probeAt = now + self.probeInterval
    }
}

/// The answers of the last ``ProviderHealth/window`` (one-second buckets), and whether more than half of at
/// least ``ProviderHealth/minimumAnswers`` of them were bad, each job counted once: the rule behind an outage
/// (5xx answers) and behind a Firebase project's spent quota (`QUOTA_EXCEEDED` for many distinct tokens).
public struct AnswerWindow: Sendable {
    private struct Bucket: Sendable {
        // Long before the first answer (seconds count from 0).
        var second: Int64 = -1_000
        var answers = 0
        var bad = 0
    }

    private var buckets = [Bucket](repeating: Bucket(), count: 10)
    /// Jobs whose bad answer is counted in the window, with its second: a job's own retries count once.
    private var badJobs: [Int64: Int64] = [:]
    /// Where seconds are counted from (the first answer seen).
    private var origin: ContinuousClock.Instant?

    public init() {}

    /// Counts one answer of `job`; when it is bad and tips the window, returns the bad answers and all answers
    /// in it.
    public mutating func record(
        bad: Bool,
        job: Int64,
        at now: ContinuousClock.Instant
    ) -> (bad: Int, answers: Int)? {
        let origin = self.origin ?? now
        self.origin = origin
        let span = Int64(self.buckets.count)
        let second = Int64((now - origin).components.seconds)
        let slot = Int(second % span)
        if self.buckets[slot].second != second { self.buckets[slot] = Bucket(second: second) }
        if bad {
            if let previous = self.badJobs[job], second - previous < span { return nil }
            self.badJobs[job] = second
            self.buckets[slot].bad += 1
        }
        self.buckets[slot].answers += 1
        guard bad else { return nil }
        var answers = 0
        var badAnswers = 0
        for bucket in self.buckets where second - bucket.second < span {
            answers += bucket.answers
            badAnswers += bucket.bad
        }
        if self.badJobs.count > 4 * ProviderHealth.minimumAnswers {
            self.badJobs = self.badJobs.filter { second - $0.value < span }
        }
        guard answers >= ProviderHealth.minimumAnswers, badAnswers * 2 > answers else { return nil }
        return (badAnswers, answers)
    }
}
