import APNsTransport
import Foundation
import Logging
import PushCore
import PushQueue

/// Turns one claimed job into its outcome: pre-send checks, the send, the classification, the retry
/// decision. The only I/O is the send itself.
struct JobProcessor: Sendable {
    /// What happened, and whether the job's credential must be paused.
    struct Result: Sendable {
        var outcome: JobOutcome
        var pauseCredential: String?
    }

    /// How long a job waits when APNs could not be reached at all.
    static let unreachableRetry: Duration = .seconds(2)

    let client: APNsClient
    let retry: RetryPolicy.Configuration
    let environment: [String: String]
    let logger: Logger

    func process(_ job: PushJob, pauseUntil: @Sendable (_ credential: String, _ reason: String) -> Date) async -> Result {
        var logger = self.logger
        logger[metadataKey: "push.job_id"] = "\(job.id)"
        logger[metadataKey: "push.apns_id"] = "\(job.apnsID.uuidString.lowercased())"
        logger[metadataKey: "push.token_fp"] = "\(job.tokenFingerprint)"
        let now = Date()
        let pushType = PushType(rawValue: job.pushType)
        let priority = job.priority ?? pushType?.defaultPriority ?? 10
        let policy = RetryPolicy(self.retry, priority: priority, maxAttempts: job.maxAttempts, environment: self.environment)

        // A job reclaimed after crashes can arrive with its attempts already used.
        if job.attempts > policy.maxAttempts {
            let sentence = "the job was claimed \(job.attempts) times without an outcome (worker crashes or lost leases); replay it once the workers are healthy."
            return Result(outcome: JobOutcome(jobID: job.id, attempt: job.attempts, disposition: .dead(error: sentence), reason: "AttemptsExhausted", attemptedAt: now, sent: false))
        }
        let request: APNsRequest
        do {
            request = try RequestBuilder.describe(job, now: now)
        } catch {
            logger.info("job refused before sending", metadata: ["push.reason": "\(error.reason)", "push.trap": "\(error.trapID?.rawValue ?? "-")"])
            return Result(outcome: JobOutcome(
                jobID: job.id, attempt: job.attempts, disposition: .dead(error: error.message), reason: error.reason,
                trapIDs: error.trapID.map { [$0.rawValue] } ?? [], attemptedAt: now, sent: false))
        }

        let started = ContinuousClock.now
        do {
            let response = try await self.client.send(request, credential: job.credential)
            let latency = Int((response.latency.seconds * 1000).rounded())
            let verdict = response.verdict
            var outcome = JobOutcome(
                jobID: job.id, attempt: job.attempts, disposition: .delivered, status: response.status, reason: response.reason,
                trapIDs: verdict.trapID.map { [$0.rawValue] } ?? [], apnsUniqueID: response.apnsUniqueID, latencyMs: latency,
                attemptedAt: now, sent: true, apnsTimestampMs: response.timestampMs)
            switch verdict.responseClass {
            case .delivered:
                return Result(outcome: outcome)
            case .tokenInvalid:
                outcome.invalidatesToken = true
                outcome.disposition = .dead(error: DeadLetterSentence.sentence(status: response.status, reason: response.reason, attempts: job.attempts, exhausted: false))
                return Result(outcome: outcome)
            case .permanent:
                outcome.disposition = .dead(error: DeadLetterSentence.sentence(status: response.status, reason: response.reason, attempts: job.attempts, exhausted: false))
                return Result(outcome: outcome)
            case .credentialFatal:
                outcome.disposition = .requeue(at: pauseUntil(job.credential, response.reason ?? "HTTP \(response.status)"))
                return Result(outcome: outcome, pauseCredential: job.credential)
            case .retryable, .credentialRetry, .unknown:
                if verdict.responseClass == .unknown {
                    logger.warning("unknown APNs reason; retrying with the normal budget", metadata: ["push.status": "\(response.status)", "push.reason": "\(response.reason ?? "-")"])
                }
                let retryAfter = response.status == 429 ? RetryAfter.parse(response.retryAfter) : nil
                outcome.disposition = self.retryOrDie(policy, job: job, status: response.status, reason: response.reason, retryAfter: retryAfter, responseClass: verdict.responseClass)
                return Result(outcome: outcome)
            }
        } catch let error as TransportError {
            let latency = Int(((ContinuousClock.now - started).seconds * 1000).rounded())
            var outcome = JobOutcome(jobID: job.id, attempt: job.attempts, disposition: .delivered, reason: error.reason, latencyMs: latency, attemptedAt: now, sent: error.mayHaveBeenProcessed)
            if error.code == .credentialsMissing || error.code == .invalidKey {
                outcome.trapIDs = [TrapID.credentialsMissing.rawValue]
                outcome.disposition = .requeue(at: pauseUntil(job.credential, error.reason))
                return Result(outcome: outcome, pauseCredential: job.credential)
            }
            if error.code == .connectFailed || error.code == .protocolNotNegotiated {
                // APNs unreachable: nothing was sent, so the attempt is not counted; the job waits while the
                // pool reconnects with backoff, instead of an outage burning every job's retry budget.
                outcome.disposition = .requeue(at: now.addingTimeInterval(Self.unreachableRetry.seconds))
                return Result(outcome: outcome)
            }
            outcome.disposition = self.retryOrDie(policy, job: job, status: nil, reason: error.reason, retryAfter: nil, responseClass: .retryable)
            return Result(outcome: outcome)
        } catch {
            let outcome = JobOutcome(jobID: job.id, attempt: job.attempts, disposition: self.retryOrDie(policy, job: job, status: nil, reason: "TransportError", retryAfter: nil, responseClass: .retryable), reason: "TransportError", attemptedAt: now, sent: true)
            return Result(outcome: outcome)
        }
    }

    func retryOrDie(_ policy: RetryPolicy, job: PushJob, status: Int?, reason: String?, retryAfter: Duration?, responseClass: APNsResponseClass) -> JobOutcome.Disposition {
        switch policy.decide(after: job.attempts, responseClass: responseClass, retryAfter: retryAfter) {
        case .retry(let delay):
            return .retry(at: Date().addingTimeInterval(delay.seconds))
        case .exhausted, .stop:
            return .dead(error: DeadLetterSentence.sentence(status: status, reason: reason, attempts: job.attempts, exhausted: true))
        }
    }
}
