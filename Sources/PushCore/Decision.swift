/// Where a job goes after one send: the one place an outcome is interpreted. Every other layer (the
/// record statement, metrics, logs, counters) reads ``name``.
///
/// Delays, never instants: the queue adds them to Postgres's own `now()`, so one clock decides.
public enum Decision: Sendable, Hashable {
    /// APNs answered 200.
    case delivered
    /// An APNs answer worth retrying: back to `pending` after `delay`; the attempt counts.
    case retry(after: Duration)
    /// Not the job's fault and not sent (not processed, APNs unreachable, credential paused, shutdown):
    /// back to `pending` after `delay`; the attempt does not count.
    case requeue(after: Duration)
    /// The outcome is unknown (connection lost mid-request, stream reset, deadline): back to `pending`
    /// after `delay`, the attempt not counted but the transport budget charged one.
    case transportRetry(after: Duration)
    /// Never again: the job moves to the dead letters with this sentence.
    case dead(sentence: String)

    /// The outcome's one name in Swift, SQL (`kind`), metrics (`outcome` label), logs and history.
    public var name: String {
        switch self {
        case .delivered: "delivered"
        case .retry: "retry"
        case .requeue: "requeue"
        case .transportRetry: "transport_retry"
        case .dead: "dead"
        }
    }

    /// The wait before the job is due again, for the non-terminal outcomes.
    public var delay: Duration? {
        switch self {
        case .retry(let d), .requeue(let d), .transportRetry(let d): d
        case .delivered, .dead: nil
        }
    }
}

/// A decision with what the row must carry besides: the reason, trap ids, whether to record the token
/// as invalid, whether to pause the credential.
public struct DecidedOutcome: Sendable, Hashable {
    /// Where the job goes.
    public var decision: Decision
    /// APNs' reason, the transport fault's word, or the pre-send verdict.
    public var reason: String?
    /// The trap id this attempt met.
    public var trapID: TrapID?
    /// The token goes to `push.invalid_tokens` (a dead letter for a 410 / BadDeviceToken).
    public var invalidatesToken: Bool = false
    /// The job's credential must be paused (credential-fatal answer, missing key).
    public var pausesCredential: Bool = false
    /// How long the credential pauses, when the answer says (FCM's `QUOTA_EXCEEDED`: `Retry-After`); `nil`:
    /// the worker's doubling pause.
    public var pauseLength: Duration? = nil
    /// The job's credential must be paused for the job's topic only (TopicDisallowed).
    public var pausesTopic: Bool = false
    /// The endpoint could not be reached: stop claiming its jobs for a while.
    public var endpointUnreachable: Bool = false
    /// A reason this build does not know (logged raw).
    public var unknownReason: Bool = false
    /// An `environment = 'auto'` job goes to development next (``repairingEnvironment(of:)``).
    public var switchesEnvironment: Bool = false

    /// `environment = 'auto'` (the producer did not know the build): APNs production's BadDeviceToken (it
    /// processed nothing) says the token is a development build's, so the job is sent once more, to
    /// development, with the same apns_id and no attempt used, instead of ending; development's own
    /// BadDeviceToken then ends it as any job's. Any other job, answer or environment: unchanged.
    public func repairingEnvironment(of job: PushJob) -> DecidedOutcome {
        guard job.autoEnvironment, job.platform == .apns, job.environment == "production",
            self.reason == "BadDeviceToken", case .dead = self.decision
        else { return self }
        var repaired = self
        repaired.decision = .requeue(after: .zero)
        repaired.trapID = .tokenEnvironment
        repaired.invalidatesToken = false
        repaired.switchesEnvironment = true
        return repaired
    }
}

extension Decision {
    /// How long a job not sent for reasons not its own waits before it is due again.
    public static let requeueDelay: Duration = .seconds(1)
    /// The longest `Retry-After` honoured; a larger one (a peer bug, or hostile) is clamped.
    public static let maximumRetryAfter: Duration = .seconds(86_400)

    /// Decides a job's fate after one send. Pure: no clock, no I/O.
    ///
    /// - Parameters:
    ///   - outcome: what the send came to.
    ///   - attempt: the job's attempts counting this one (1-based), as claimed.
    ///   - transportRetries: unknown outcomes the job has already had.
    ///   - policy: the job's retry policy (priority stretch and `max_attempts` applied).
    ///   - transportBudget: how many unknown outcomes a job may have before it is dead-lettered.
    ///   - platform: whose answer was lost, for a transport failure's sentence.
    ///   - random: jitter source, injectable for tests.
    public static func decide(
        _ outcome: SendOutcome,
        attempt: Int,
        transportRetries: Int,
        policy: RetryPolicy,
        transportBudget: Int,
        platform: Platform = .apns,
        using random: inout some RandomNumberGenerator
    ) -> DecidedOutcome {
        switch outcome {
        case .rejected(let rejection):
            return DecidedOutcome(
                decision: .dead(sentence: rejection.message),
                reason: rejection.reason,
                trapID: rejection.trapID
            )

        case .transport(let fault, let reason):
            switch fault {
            case .notProcessed, .cancelled:
                return DecidedOutcome(decision: .requeue(after: .zero), reason: reason)
            case .unreachable:
                return DecidedOutcome(
                    decision: .requeue(after: Self.requeueDelay),
                    reason: reason,
                    endpointUnreachable: true
                )
            case .credentialMissing:
                return DecidedOutcome(
                    decision: .requeue(after: Self.requeueDelay),
                    reason: reason,
                    trapID: .credentialsMissing,
                    pausesCredential: true
                )
            case .credentialRefused:
                return DecidedOutcome(
                    decision: .requeue(after: Self.requeueDelay),
                    reason: reason,
                    trapID: .fcmCredential,
                    pausesCredential: true
                )
            case .unknownOutcome:
                guard transportRetries < transportBudget else {
                    let sentence =
                        "\(platform == .fcm ? "FCM's" : "APNs'") answer was lost \(transportRetries + 1) times (the last: \(reason)); the transport budget of \(transportBudget) is spent. Check the network path to \(platform.providerName), then replay: the same \(platform == .fcm ? "data.push_id" : "apns-id") is sent."
                    return DecidedOutcome(decision: .dead(sentence: sentence), reason: reason)
                }
                // Transport backoff: 100 ms doubling to 5 s, with jitter; nothing to do with the token.
                let base = Duration.milliseconds(100)
                var delay = min(base * (1 << min(transportRetries, 10)), .seconds(5))
                delay += .milliseconds(Int64.random(in: 0...100, using: &random))
                return DecidedOutcome(decision: .transportRetry(after: delay), reason: reason)
            }

        case .response(let status, let reason, let retryAfter):
            let verdict = APNsVerdict.classify(status: status, reason: reason)
            return Self.decide(
                verdict,
                status: status,
                reason: reason,
                // APNs' Retry-After comes with a 429 only.
                retryAfter: status == 429 ? retryAfter : nil,
                attempt: attempt,
                policy: policy,
                sentence: { exhausted in
                    DeadLetterSentence.sentence(
                        status: status,
                        reason: reason,
                        attempts: attempt,
                        exhausted: exhausted,
                        limit: policy.limit
                    )
                },
                using: &random
            )

        case .fcm(let status, let code, let namesToken, var retryAfter, let projectQuota):
            let reason = status == 200 ? nil : code ?? "HTTP\(status)"
            let row = FCMReason.row(status: status, code: code, namesToken: namesToken, projectQuota: projectQuota)
            if row?.waitsCredential == true {
                // Not processed: the project's quota is spent. The credential waits, the job goes back uncounted.
                let wait = min(retryAfter ?? FCMReason.quotaWait, Self.maximumRetryAfter)
                var decided = DecidedOutcome(decision: .requeue(after: wait), reason: reason, trapID: .fcmQuota)
                decided.pausesCredential = true
                decided.pauseLength = wait
                return decided
            }
            if row?.trapID == .fcmQuota {
                // The message's target is over its rate: this job alone waits, 10 s doubling unless told.
                retryAfter = retryAfter ?? FCMReason.targetQuotaWait(attempt: attempt)
            }
            return Self.decide(
                FCMReason.classify(status: status, code: code, namesToken: namesToken),
                status: status,
                reason: reason,
                retryAfter: retryAfter,
                attempt: attempt,
                policy: policy,
                sentence: { exhausted in
                    // A target over its rate says what to do about it, exhausted or not.
                    exhausted && row?.trapID != .fcmQuota
                        ? DeadLetterSentence.sentence(
                            status: status,
                            reason: reason,
                            attempts: attempt,
                            exhausted: true,
                            limit: policy.limit,
                            provider: "FCM"
                        )
                        : FCMReason.sentence(status: status, code: code, namesToken: namesToken)
                },
                using: &random
            )
        }
    }

    /// What a provider's classified answer does to the job: the class's column, shared by every provider.
    private static func decide(
        _ verdict: APNsVerdict,
        status: Int,
        reason: String?,
        retryAfter: Duration?,
        attempt: Int,
        policy: RetryPolicy,
        sentence: (_ exhausted: Bool) -> String,
        using random: inout some RandomNumberGenerator
    ) -> DecidedOutcome {
        var decided = DecidedOutcome(decision: .delivered, reason: reason, trapID: verdict.trapID)
        switch verdict.responseClass {
        case .delivered:
            return decided
        case .tokenInvalid, .permanent:
            decided.invalidatesToken = verdict.responseClass == .tokenInvalid
            decided.decision = .dead(sentence: sentence(false))
        case .credentialFatal:
            decided.pausesCredential = true
            decided.decision = .requeue(after: Self.requeueDelay)
        case .topicFatal:
            decided.pausesTopic = true
            decided.decision = .requeue(after: Self.requeueDelay)
        case .retryable, .credentialRetry, .unknown:
            decided.unknownReason = verdict.responseClass == .unknown
            let honoured = retryAfter.map { min($0, Self.maximumRetryAfter) }
            switch policy.decide(
                after: attempt,
                responseClass: verdict.responseClass,
                retryAfter: honoured,
                using: &random
            ) {
            case .retry(let delay):
                decided.decision = .retry(after: delay)
            case .exhausted, .stop:
                decided.decision = .dead(sentence: sentence(true))
            }
        }
        return decided
    }

    /// ``decide(_:attempt:transportRetries:policy:transportBudget:using:)`` with the system's random numbers.
    public static func decide(
        _ outcome: SendOutcome,
        attempt: Int,
        transportRetries: Int,
        policy: RetryPolicy,
        transportBudget: Int,
        platform: Platform = .apns
    ) -> DecidedOutcome {
        var generator = SystemRandomNumberGenerator()
        return self.decide(
            outcome,
            attempt: attempt,
            transportRetries: transportRetries,
            policy: policy,
            transportBudget: transportBudget,
            platform: platform,
            using: &generator
        )
    }
}
