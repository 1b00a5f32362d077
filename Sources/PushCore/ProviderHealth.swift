/// Whether a provider is down, as its answers across distinct jobs show it ("Provider outages burn nothing"):
/// APNs production or development, or one FCM project. Pure: the caller passes the instants.
///
/// Up, it counts the answers of the last ``window`` in one-second buckets. When more than half of at least
/// ``minimumAnswers`` answers (each job counted once) are 5xx, the provider is down: the worker sends its jobs
/// back to `pending` uncounted, stops claiming them, and sends one probe request at a time, the first after
/// ``firstProbe``, each later one twice as late up to ``lastProbe``. The probe's answer decides: a 5xx keeps
/// it down, anything else brings it up (an answer to a request written before the outage was seen decides
/// nothing). A job's own 5xx while most answers succeed is no outage: it follows the priority-aware stretch.
/// "Within 10 s" is any span ending now of at most 10 s: the last second's answers, mostly 5xx, are an outage
/// even after 9 busy seconds of successes.
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
    /// When the newest request answered other than 5xx was written (the provider worked then). The write, not
    /// the answer: at an outage's onset, requests written just before it are still answered 200 after the
    /// first 5xx, and must not vouch for the provider after it.
    private var lastAnswered: ContinuousClock.Instant?
    /// When the newest answer other than 5xx was received (and counted: one read long after its request was
    /// written is not); `nil` before the first.
    private var lastHeard: ContinuousClock.Instant?
    /// First-wave requests given out and not yet ended: the wave is the provider's, shared by every batch of
    /// the worker (ten credentials' batches must not make ten waves).
    private var waveInFlight = 0
    /// When the provider came back up after an outage. For a minute after, while fewer than ``minimumAnswers``
    /// answers are counted since, it may be down: the evidence that judged it down is gone, and a brownout (half
    /// the answers 5xx) flaps down and up; a job's last 5xx is not taken for its own meanwhile.
    private var recoveredAt: ContinuousClock.Instant?

    public init() {}

    /// Whether the provider is taken for down.
    public var isDown: Bool { self.downSince != nil }

    /// Whether the provider may be down though the rule has not said so, for a job whose previous request was
    /// written `since` (by any worker; for a first attempt, this one): at least a quarter of the last 20
    /// answers were 5xx, or no request written since then has been answered other than 5xx, or nothing but 5xx
    /// came back for a window (unless `afterDoubt`: the job's previous attempt was itself sent back uncounted).
    /// A job's own 5xx is one "while others succeed" (the contract's words): only a success to a request
    /// written after the job's previous one, and a recent one, shows that.
    /// Without it, the job may have met the first moments of an outage at several workers (each judges alone,
    /// and none has seen enough yet), or the queue is too quiet to judge by, or this worker was frozen and
    /// knows nothing current (answers read late are not counted). When `since` is not known: nothing but 5xx
    /// for a window. Just back up after an outage, it may be down until 20 answers are counted again (for a
    /// minute at most). A 5xx that would end a job while the provider may be down sends it back uncounted
    /// instead (for an hour from its first attempt at most); one that leaves it attempts follows the stretch.
    public func mayBeDown(
        at now: ContinuousClock.Instant,
        since: ContinuousClock.Instant? = nil,
        afterDoubt: Bool = false
    ) -> Bool {
        if self.isDown || self.window.recentBad * 4 >= Self.minimumAnswers { return true }
        if let recovered = self.recoveredAt, now - recovered < Self.recoveryLimit,
            self.window.recentCount < Self.minimumAnswers
        {
            return true
        }
        guard let answered = self.lastAnswered else { return true }
        // Nothing else heard for a window: too quiet to judge by, whenever the job last failed. Once: a job
        // already sent back for that doubt is judged by what was answered since (in a quiet queue its own
        // failure would otherwise be doubted for an hour).
        if now - answered >= Self.window && !afterDoubt { return true }
        return since.map { answered < $0 } ?? false
    }

    /// How long after coming back up the provider may be down for want of answers (a quiet scope's jobs are
    /// not kept from their own end for longer).
    public static let recoveryLimit: Duration = .seconds(60)

    /// How long a job waits whose last attempt met a 5xx while the provider ``mayBeDown(at:since:)``.
    public static let doubtfulWait: Duration = .seconds(30)
    /// How long from its first attempt a job's last 5xx sends it back uncounted while the provider may be down
    /// (an outage of an hour leaves it deliverable; a job only its own provider answers 5xx ends after that).
    public static let doubtfulSpan: Duration = .seconds(3_600)

    /// How many requests a first wave holds: as many answers as a verdict needs.
    public static let firstWaveSize = minimumAnswers
    /// How long the rest of a batch waits for its first wave's answers at most (a provider slower than this
    /// is slow, not down: its answers over 5 s old are not counted, so it is never heard from "lately").
    public static let firstWaveWait: Duration = .seconds(1)
    /// How long without an answer other than 5xx before the next batch opens with a first wave.
    public static let quietSpan: Duration = .seconds(2)

    /// How many of a batch's requests may be written before their answers are read (`nil`: all of them):
    /// ``firstWaveSize`` while up but not heard from lately: nothing answered other than 5xx for
    /// ``quietSpan`` (a quiet spell, a worker just started or thawed: the answers it read late are not
    /// counted), or just back up with fewer than ``minimumAnswers`` answers since. A provider that went down
    /// meanwhile then costs a worker about 20 requests, not a whole claimed batch written before the first
    /// answer; one that answers costs one round trip (at most ``firstWaveWait``). Less what earlier batches
    /// took of the wave and has not ended (``takeWave(_:at:)``). While down, ``admits(job:at:)`` lets only
    /// the probe through.
    public func firstWave(at now: ContinuousClock.Instant) -> Int? {
        if self.isDown { return nil }
        let room = max(0, Self.firstWaveSize - self.waveInFlight)
        if let recovered = self.recoveredAt, now - recovered < Self.recoveryLimit,
            self.window.recentCount < Self.minimumAnswers
        {
            return room
        }
        guard let heard = self.lastHeard, now - heard < Self.quietSpan else { return room }
        return nil
    }

    /// Takes up to `wanted` requests of the first wave (`nil`: no wave now, write them all); each taken one is
    /// given back by ``waveEnded(_:)`` once it is answered or withdrawn.
    public mutating func takeWave(_ wanted: Int, at now: ContinuousClock.Instant) -> Int? {
        guard let room = self.firstWave(at: now) else { return nil }
        let granted = min(room, max(wanted, 0))
        self.waveInFlight += granted
        return granted
    }

    /// `count` requests of a first wave ended.
    public mutating func waveEnded(_ count: Int) {
        self.waveInFlight = max(0, self.waveInFlight - count)
    }

    /// Whether `job`'s request is the probe in flight.
    public func isProbe(_ job: Int64) -> Bool { self.probe == job }

    /// Records one answer of `job` (`serverError`: its status is 5xx), received `now` to a request written
    /// at `written` (`nil`: now); returns the change it made, if any.
    public mutating func record(
        serverError: Bool,
        job: Int64,
        at now: ContinuousClock.Instant,
        written: ContinuousClock.Instant? = nil
    ) -> Change? {
        if !serverError {
            let written = min(written ?? now, now)
            self.lastAnswered = max(self.lastAnswered ?? written, written)
            self.lastHeard = max(self.lastHeard ?? now, now)
        }
        if let since = self.downSince {
            // Only the probe's answer decides: a request written before the outage was seen (a frozen worker's,
            // one answered late) may come back 200 while the provider is still down.
            guard self.probe == job else { return nil }
            self.probe = nil
            if !serverError {
                let wave = self.waveInFlight
                self = ProviderHealth()
                self.waveInFlight = wave
                self.lastAnswered = now
                self.lastHeard = now
                self.recoveredAt = now
                return .up(after: now - since)
            }
            self.probeInterval = min(self.probeInterval * 2, Self.lastProbe)
            self.probeAt = now + self.probeInterval
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
    /// The last ``ProviderHealth/minimumAnswers`` answers (when, and whether bad), oldest overwritten first.
    private var recent = [(at: ContinuousClock.Instant, bad: Bool)]()
    private var next = 0

    /// How many of the last ``ProviderHealth/minimumAnswers`` answers were bad.
    public var recentBad: Int { self.recent.reduce(0) { $0 + ($1.bad ? 1 : 0) } }
    /// How many answers the last ``ProviderHealth/minimumAnswers`` hold (fewer only at the start).
    public var recentCount: Int { self.recent.count }

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
        // Not before the first answer seen (an instant read before another thread's answer set the origin).
        let second = max(0, Int64((now - origin).components.seconds))
        let slot = Int(second % span)
        if self.buckets[slot].second != second { self.buckets[slot] = Bucket(second: second) }
        if bad {
            if let previous = self.badJobs[job], second - previous < span { return nil }
            self.badJobs[job] = second
            self.buckets[slot].bad += 1
        }
        self.buckets[slot].answers += 1
        let minimum = ProviderHealth.minimumAnswers
        if self.recent.count < minimum {
            self.recent.append((now, bad))
        } else {
            self.recent[self.next] = (now, bad)
        }
        self.next = (self.next + 1) % minimum
        guard bad else { return nil }
        // The last 20 answers, all within the window, more than half bad: the verdict at any rate, within 20
        // answers of an outage's start (at 1,000 answers a second, a second's bucket would hold hundreds).
        if self.recent.count == minimum, now - self.recent[self.next].at < ProviderHealth.window {
            let badRecent = self.recentBad
            if badRecent * 2 > minimum { return (badRecent, minimum) }
        }
        if self.badJobs.count > 4 * ProviderHealth.minimumAnswers {
            self.badJobs = self.badJobs.filter { second - $0.value < span }
        }
        // The last second, then the last two, … up to the whole window: any such span of at least 20 answers
        // more than half bad tips it. A busy drain's successes of 9 s ago do not outvote an outage that began
        // this second (at 1,000 answers a second, the whole window's count would let every job meet the outage
        // several times before the verdict).
        var answers = 0
        var badAnswers = 0
        for back in 0..<min(span, second + 1) {
            let bucket = self.buckets[Int((second - back) % span)]
            guard bucket.second == second - back else { continue }
            answers += bucket.answers
            badAnswers += bucket.bad
            if answers >= ProviderHealth.minimumAnswers, badAnswers * 2 > answers { return (badAnswers, answers) }
        }
        return nil
    }
}
