import Foundation
import PushCore
import Testing

/// The decision table: every APNs reason × priority × attempt edge, and every transport fault class.
/// Pure: no socket, no database, no clock.
@Suite("Decision.decide: one interpretation of a send")
struct DecisionTests {

    /// Every reason with the class APNS.md gives it, written out here (not computed by the code under test).
    static let reasons: [(Int, String?, APNsResponseClass)] = ClassificationTests.table.compactMap {
        status,
        reason,
        expected,
        _ in
        status.map { ($0, reason, expected) }
    }

    func decide(_ outcome: SendOutcome, attempt: Int, priority: Int, transportRetries: Int = 0) -> DecidedOutcome {
        var random = SystemRandomNumberGenerator()
        let policy = RetryPolicy(
            .init(maxRetries: 3, baseDelay: .milliseconds(100), maxDelay: .seconds(5), jitter: false),
            priority: priority,
            environment: [:]
        )
        return Decision.decide(
            outcome,
            attempt: attempt,
            transportRetries: transportRetries,
            policy: policy,
            transportBudget: 10,
            using: &random
        )
    }

    @Test("every APNs reason × priority × first and last attempt", arguments: [5, 10], [true, false])
    func table(priority: Int, lastAttempt: Bool) {
        let maxAttempts = priority == 10 ? 3 : 4
        let attempt = lastAttempt ? maxAttempts : 1
        for (status, reason, expected) in Self.reasons {
            let decided = self.decide(
                .response(status: status, reason: reason, retryAfter: .seconds(7)),
                attempt: attempt,
                priority: priority
            )
            let verdict = APNsVerdict.classify(status: status, reason: reason)
            let label = "\(status) \(reason ?? "-") p\(priority) attempt \(attempt)"
            switch expected {
            case .delivered:
                #expect(decided.decision == .delivered, "\(label)")
            case .tokenInvalid:
                guard case .dead(let sentence) = decided.decision else {
                    Issue.record("\(label): \(decided)")
                    continue
                }
                #expect(decided.invalidatesToken && !sentence.isEmpty, "\(label)")
            case .permanent:
                guard case .dead = decided.decision else {
                    Issue.record("\(label): \(decided)")
                    continue
                }
                #expect(!decided.invalidatesToken, "\(label)")
            case .credentialFatal:
                #expect(
                    decided.decision == .requeue(after: Decision.requeueDelay) && decided.pausesCredential,
                    "\(label): the credential pauses, the job is not charged"
                )
            case .topicFatal:
                #expect(
                    decided.decision == .requeue(after: Decision.requeueDelay) && decided.pausesTopic
                        && !decided.pausesCredential,
                    "\(label): only the credential's topic pauses, the job is not charged"
                )
            case .retryable, .credentialRetry, .unknown:
                if lastAttempt {
                    guard case .dead(let sentence) = decided.decision else {
                        Issue.record("\(label): \(decided)")
                        continue
                    }
                    #expect(sentence.hasPrefix("gave up after \(maxAttempts) attempts"), "\(label)")
                } else if status == 429 {
                    #expect(
                        decided.decision == .retry(after: .seconds(7)),
                        "\(label): Retry-After replaces the backoff"
                    )
                } else {
                    #expect(
                        decided.decision == .retry(after: .milliseconds(priority == 10 ? 200 : 100)),
                        "\(label): the stretched base delay"
                    )
                }
                #expect(decided.unknownReason == (expected == .unknown), "\(label)")
            }
            #expect(decided.trapID == verdict.trapID, "\(label)")
        }
    }

    @Test(
        "transport faults: not processed and unreachable never count; unknown outcomes spend the transport budget, not the attempts"
    )
    func transport() {
        for attempt in [1, 3, 4] {
            #expect(
                self.decide(.transport(.notProcessed, reason: "GoAway"), attempt: attempt, priority: 10).decision
                    == .requeue(after: .zero)
            )
            #expect(
                self.decide(.transport(.cancelled, reason: "Shutdown"), attempt: attempt, priority: 10).decision
                    == .requeue(after: .zero)
            )
            let unreachable = self.decide(
                .transport(.unreachable, reason: "ConnectFailed"),
                attempt: attempt,
                priority: 5
            )
            #expect(unreachable.decision == .requeue(after: Decision.requeueDelay) && unreachable.endpointUnreachable)
            let missing = self.decide(
                .transport(.credentialMissing, reason: "CredentialsMissing"),
                attempt: attempt,
                priority: 5
            )
            #expect(missing.pausesCredential && missing.trapID == .credentialsMissing)
            // An unknown outcome on the last attempt is still retried: the attempts are about APNs' answers.
            guard
                case .transportRetry = self.decide(
                    .transport(.unknownOutcome, reason: "ConnectionReset"),
                    attempt: attempt,
                    priority: 10
                ).decision
            else {
                Issue.record("unknown outcome on attempt \(attempt) not retried")
                continue
            }
        }
        // Transport backoff: 100 ms doubling to 5 s, plus up to 100 ms of jitter.
        for (retries, low) in [(0, Duration.milliseconds(100)), (3, .milliseconds(800)), (9, .seconds(5))] {
            let delay = self.decide(
                .transport(.unknownOutcome, reason: "Timeout"),
                attempt: 1,
                priority: 10,
                transportRetries: retries
            ).decision.delay
            #expect(
                delay.map { $0 >= low && $0 <= low + .milliseconds(100) } == true,
                "after \(retries) unknown outcomes: \(String(describing: delay))"
            )
        }
        guard
            case .dead(let sentence) = self.decide(
                .transport(.unknownOutcome, reason: "ConnectionReset"),
                attempt: 1,
                priority: 10,
                transportRetries: 10
            ).decision
        else {
            Issue.record("a spent transport budget must dead-letter")
            return
        }
        #expect(sentence.contains("transport budget of 10 is spent") && sentence.contains("ConnectionReset"))
    }

    @Test("numbers from the peer are range-checked: a huge Retry-After is clamped to a day, never a trap")
    func clamps() {
        #expect(RetryAfter.parse("99999999999999999999", now: Date()) == .seconds(86_400))
        #expect(
            self.decide(
                .response(status: 429, reason: "TooManyRequests", retryAfter: .seconds(Int64.max / 2)),
                attempt: 1,
                priority: 5
            ).decision == .retry(after: Decision.maximumRetryAfter)
        )
    }

    @Test("one name per outcome, as SQL, metrics and logs spell it")
    func names() {
        #expect(
            [
                Decision.delivered, .retry(after: .zero), .requeue(after: .zero), .transportRetry(after: .zero),
                .dead(sentence: ""),
            ].map(\.name) == ["delivered", "retry", "requeue", "transport_retry", "dead"]
        )
    }

    @Test("an exhausted job's sentence names what capped it: the kill switch, max_attempts, the priority stretch")
    func exhaustedSentenceNamesTheLimit() {
        func sentence(priority: Int, maxAttempts: Int?, environment: [String: String], attempt: Int) -> String {
            var random = SystemRandomNumberGenerator()
            let policy = RetryPolicy(
                .init(maxRetries: 3, baseDelay: .milliseconds(100), maxDelay: .seconds(5), jitter: false),
                priority: priority,
                maxAttempts: maxAttempts,
                environment: environment
            )
            let decided = Decision.decide(
                .response(status: 503, reason: "ServiceUnavailable", retryAfter: nil),
                attempt: attempt,
                transportRetries: 0,
                policy: policy,
                transportBudget: 10,
                using: &random
            )
            guard case .dead(let sentence) = decided.decision else { return "not dead: \(decided.decision)" }
            return sentence
        }
        // A job waiting for its retry when the operator turns retries off dies on its next attempt, and says why.
        let killed = sentence(
            priority: 5,
            maxAttempts: nil,
            environment: [RetryPolicy.killSwitchVariable: "1"],
            attempt: 2
        )
        #expect(killed.contains("kill switch") && killed.contains(RetryPolicy.killSwitchVariable), "\(killed)")
        #expect(sentence(priority: 5, maxAttempts: 2, environment: [:], attempt: 2).contains("max_attempts 2"))
        #expect(sentence(priority: 10, maxAttempts: nil, environment: [:], attempt: 3).contains("priority 10"))
        #expect(sentence(priority: 5, maxAttempts: nil, environment: [:], attempt: 4).contains("--max-retries 3"))
    }
}
