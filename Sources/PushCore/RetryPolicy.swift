public import Foundation

/// How often and how far apart a job is retried, with the priority-aware stretch (APNS.md, "Retry").
public struct RetryPolicy: Sendable, Hashable {
    /// The configured policy, before any stretch.
    public struct Configuration: Sendable, Hashable {
        /// Retries after the first attempt (default 3, so 4 attempts).
        public var maxRetries: Int
        /// The first backoff (default 100 ms).
        public var baseDelay: Duration
        /// The cap of the exponential part (default 5 s).
        public var maxDelay: Duration
        /// Add `random(0, baseDelay)` after the cap (default on).
        public var jitter: Bool

        /// The defaults: 3 retries, 100 ms base, 5 s cap, jitter on.
        public init(
            maxRetries: Int = 3,
            baseDelay: Duration = .milliseconds(100),
            maxDelay: Duration = .seconds(5),
            jitter: Bool = true
        ) {
            self.maxRetries = maxRetries
            self.baseDelay = baseDelay
            self.maxDelay = maxDelay
            self.jitter = jitter
        }
    }

    /// The environment variable that, set to any non-empty value, forces `maxRetries` 0 for the process.
    public static let killSwitchVariable = "PUSH_WORKER_DISABLE_RETRY"

    /// Retries after the first attempt, for this job.
    public var maxRetries: Int
    /// The first backoff, for this job.
    public var baseDelay: Duration
    /// The cap of the exponential part, for this job.
    public var maxDelay: Duration
    /// Whether jitter is added.
    public var jitter: Bool
    /// What set ``maxRetries``, for the dead letter's sentence ("the job's max_attempts 2", the kill switch…);
    /// written only when a sentence needs it (a policy is made for every job).
    public var limit: String {
        get { self.sentence }
        set { self.limitCause = .written(newValue) }
    }

    private var sentence: String {
        switch self.limitCause {
        case .configuration(let retries): return "the worker's --max-retries \(retries)"
        case .priorityStretch: return "priority 10's stretch (at most 3 attempts)"
        case .maxAttempts(let attempts): return "the job's max_attempts \(attempts)"
        case .killSwitch: return "the operator's kill switch \(Self.killSwitchVariable), which turns retries off"
        case .written(let text): return text
        }
    }

    enum LimitCause: Sendable, Hashable {
        case configuration(Int)
        case priorityStretch
        case maxAttempts(Int)
        case killSwitch
        case written(String)
    }

    var limitCause: LimitCause = .configuration(3)

    /// The policy for one job: the configuration stretched for priority 10 (fewer retries, wider
    /// backoff), narrowed by the job's own `max_attempts`, and zeroed by the kill switch.
    ///
    /// - Parameters:
    ///   - priority: the priority the job is sent with.
    ///   - maxAttempts: the job's `max_attempts`; it can only narrow.
    ///   - environment: the process environment (for ``killSwitchVariable``).
    public init(
        _ configuration: Configuration,
        priority: Int,
        maxAttempts: Int? = nil,
        environment: [String: String] = ProcessInfo.processInfo.environment
    ) {
        self.init(
            configuration,
            priority: priority,
            maxAttempts: maxAttempts,
            killSwitch: Self.killSwitchIsSet(in: environment)
        )
    }

    /// Whether `environment` sets ``killSwitchVariable`` (to anything but the empty string). A worker reads
    /// it once at start, not per job.
    public static func killSwitchIsSet(in environment: [String: String]) -> Bool {
        !(environment[Self.killSwitchVariable] ?? "").isEmpty
    }

    /// The policy for one job, with the kill switch already read.
    public init(_ configuration: Configuration, priority: Int, maxAttempts: Int?, killSwitch: Bool) {
        var retries = max(configuration.maxRetries, 0)
        var base = configuration.baseDelay
        var cap = configuration.maxDelay
        if priority == 10 {
            retries = min(retries, 2)
            base = base * 2
            cap = cap * 2
        }
        var limit = LimitCause.configuration(configuration.maxRetries)
        if priority == 10 && retries < configuration.maxRetries { limit = .priorityStretch }
        if let maxAttempts, maxAttempts - 1 < retries {
            retries = max(maxAttempts - 1, 0)
            limit = .maxAttempts(maxAttempts)
        }
        if killSwitch {
            retries = 0
            limit = .killSwitch
        }
        self.maxRetries = retries
        self.limitCause = limit
        self.baseDelay = base
        self.maxDelay = cap
        self.jitter = configuration.jitter
    }

    /// Attempts in all: the first plus the retries.
    public var maxAttempts: Int { self.maxRetries + 1 }

    /// The wait before retry `n` (0-based): `min(base × 2^n, max) + random(0, base)`, jitter after the cap.
    public func backoff(beforeRetry n: Int, using generator: inout some RandomNumberGenerator) -> Duration {
        let exponent = min(max(n, 0), 30)
        let exponential = self.baseDelay * (1 << exponent)
        var delay = min(exponential, self.maxDelay)
        if self.jitter {
            let baseNanos = self.baseDelay.nanoseconds
            if baseNanos > 0 { delay += .nanoseconds(Int64.random(in: 0...baseNanos, using: &generator)) }
        }
        return delay
    }

    /// The wait before retry `n` with the system's random numbers.
    public func backoff(beforeRetry n: Int) -> Duration {
        var generator = SystemRandomNumberGenerator()
        return self.backoff(beforeRetry: n, using: &generator)
    }

    /// What to do after attempt number `attempt` (1-based) ended in `responseClass`: retry after a delay,
    /// or stop. Terminal classes never retry, whatever the configuration; a 429's `Retry-After`
    /// replaces the computed delay and is not capped.
    public func decide(
        after attempt: Int,
        responseClass: APNsResponseClass,
        retryAfter: Duration? = nil,
        using generator: inout some RandomNumberGenerator
    ) -> RetryDecision {
        switch responseClass {
        case .delivered: return .stop
        case .tokenInvalid, .permanent, .credentialFatal, .topicFatal: return .stop
        case .retryable, .credentialRetry, .unknown: break
        }
        guard attempt < self.maxAttempts else { return .exhausted }
        return .retry(after: retryAfter ?? self.backoff(beforeRetry: attempt - 1, using: &generator))
    }

    /// ``decide(after:responseClass:retryAfter:using:)`` with the system's random numbers.
    public func decide(
        after attempt: Int,
        responseClass: APNsResponseClass,
        retryAfter: Duration? = nil
    ) -> RetryDecision {
        var generator = SystemRandomNumberGenerator()
        return self.decide(after: attempt, responseClass: responseClass, retryAfter: retryAfter, using: &generator)
    }
}

/// The retry policy's answer for one attempt.
public enum RetryDecision: Sendable, Hashable {
    /// Send again after this wait (durably: the job returns to `pending` with `run_at` = now + wait).
    case retry(after: Duration)
    /// The attempts are used up: dead-letter.
    case exhausted
    /// The outcome is final (delivered, or a class no retry can fix).
    case stop
}

extension Duration {
    /// The whole duration in nanoseconds, saturating.
    public var nanoseconds: Int64 {
        let (seconds, attoseconds) = self.components
        let (product, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? .min : .max }
        return product &+ attoseconds / 1_000_000_000
    }

    /// The whole duration in milliseconds, saturating.
    public var milliseconds: Int64 { self.nanoseconds / 1_000_000 }

    /// The duration in seconds as a `Double`.
    public var seconds: Double {
        Double(self.components.seconds) + Double(self.components.attoseconds) / 1e18
    }
}
