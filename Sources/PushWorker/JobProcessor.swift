import Foundation
import Logging
import PushCore
import PushQueue
import PushTransport

/// Turns one claimed job into its outcome: build the request, send, decide (``Decision/decide``),
/// hand over. The only I/O is the send itself; the only interpretation of it is PushCore's.
struct JobProcessor: Sendable {
    /// APNs' client: which environments a certificate credential covers (checked before sending).
    let client: APNsClient
    let retry: RetryPolicy.Configuration
    let transportBudget: Int
    /// ``RetryPolicy/killSwitchVariable``, read once.
    let killSwitch: Bool
    let logger: Logger
    /// The process's clock: when an attempt started, how long it took, what a `Retry-After` date means.
    let clock: any PushClock

    init(
        client: APNsClient,
        retry: RetryPolicy.Configuration,
        transportBudget: Int,
        environment: [String: String],
        clock: any PushClock,
        logger: Logger
    ) {
        self.clock = clock
        self.client = client
        self.retry = retry
        self.transportBudget = transportBudget
        self.killSwitch = RetryPolicy.killSwitchIsSet(in: environment)
        self.logger = logger
    }

    /// A claimed job made ready: its request, or the reason nothing is sent. Indirect: boxed once, so the
    /// send path's copies (into its group, into each closure that reads it) retain one object, not every
    /// string and array of the job and its request.
    indirect enum Prepared: Sendable {
        /// Send this request.
        case send(Claimed, ProviderRequest)
        /// Refused before sending: the rejection says why.
        case refuse(Claimed, PreSendRejection)

        /// The job with what its processing needs whatever is sent.
        var claimed: Claimed {
            switch self {
            case .send(let claimed, _), .refuse(let claimed, _): claimed
            }
        }

        var job: PushJob { self.claimed.job }

        /// What to send; `nil` when the job is refused.
        var request: ProviderRequest? {
            if case .send(_, let request) = self { request } else { nil }
        }
    }

    /// A claimed job, its retry policy, when its processing started, and its payload's warnings.
    struct Claimed: Sendable {
        let job: PushJob
        let policy: RetryPolicy
        let started: ContinuousClock.Instant
        var warnings: [PayloadWarning] = []
    }

    /// One attempt of a job, decided: the row's outcome for the outcome writer, and the decision whose
    /// effects the worker applies (pause the credential, the topic or the endpoint; forget a streak).
    /// A class (its fields never change): handed from the decision through the health check, the reactions,
    /// the metrics and the outcome writer, one retain each, not one per string of the job and its outcome.
    final class Attempt: Sendable {
        let job: PushJob
        /// What is written to the job's row.
        let outcome: JobOutcome
        /// The decision, with its effects on this worker.
        let decided: DecidedOutcome

        init(job: PushJob, outcome: JobOutcome, decided: DecidedOutcome) {
            self.job = job
            self.outcome = outcome
            self.decided = decided
        }
    }

    /// Builds a job's request, or the reason it cannot be sent (no I/O).
    func prepare(_ job: PushJob, databaseNow: Date) -> Prepared {
        let policy = RetryPolicy(
            self.retry,
            priority: job.sendPriority,
            maxAttempts: job.maxAttempts,
            killSwitch: self.killSwitch
        )
        var claimed = Claimed(job: job, policy: policy, started: self.clock.now)
        if job.attempts > policy.maxAttempts {
            // A job reclaimed after crashes can arrive with its attempts already used.
            return .refuse(
                claimed,
                PreSendRejection(
                    reason: "AttemptsExhausted",
                    trapID: nil,
                    message:
                        "the job's attempt budget (\(policy.maxAttempts)) is spent: it was claimed \(job.attempts) times, some by workers that died before writing an outcome; replay it once the workers are healthy."
                )
            )
        }
        if job.platform == .fcm {
            // An FCM credential this worker lacks is the transport's credentialsMissing: paused, not dead.
            do throws(PreSendRejection) {
                return .send(claimed, .fcm(try FCMMessageBuilder.describe(job, now: databaseNow)))
            } catch {
                return .refuse(claimed, error)
            }
        }
        do throws(PreSendRejection) {
            let request = try RequestBuilder.describe(job, now: databaseNow)
            claimed.warnings = request.warnings
            if let covered = self.client.certificateEnvironments(of: job.credential),
                !covered.contains(job.environment)
            {
                throw PreSendRejection.certificateEnvironment(
                    credential: job.credential,
                    environment: job.environment,
                    covered: covered.sorted()
                )
            }
            return .send(claimed, .apns(request))
        } catch {
            return .refuse(claimed, error)
        }
    }

    /// Decides a prepared job's outcome from its send's result (`nil`: it was refused before sending).
    func decide(_ prepared: Prepared, with result: Result<ProviderAnswer, any Error>?) -> Attempt {
        let claimed = prepared.claimed
        let job = claimed.job
        let started = claimed.started
        let policy = claimed.policy
        let warnings = claimed.warnings
        var status: Int?
        var response: APNsResponse?
        var fcmResponse: FCMResponse?
        let sendOutcome: SendOutcome
        switch result {
        case .success(.apns(let answer)):
            response = answer
            status = answer.status
            sendOutcome = .response(
                status: answer.status,
                reason: answer.reason,
                retryAfter: answer.status == 429 ? RetryAfter.parse(answer.retryAfter, now: self.clock.wallNow) : nil
            )
        case .success(.fcm(let answer)):
            fcmResponse = answer
            status = answer.status
            sendOutcome = answer.sendOutcome(at: self.clock.wallNow)
        case .failure(let error as TransportError):
            sendOutcome = .transport(error.fault, reason: error.reason)
        case .failure:
            sendOutcome = .transport(.unknownOutcome, reason: "TransportError")
        case nil:
            if case .refuse(_, let rejection) = prepared {
                sendOutcome = .rejected(rejection)
            } else {
                sendOutcome = .rejected(
                    PreSendRejection(reason: "InvalidJob", trapID: nil, message: "the job could not be prepared.")
                )
            }
        }
        var decided = Decision.decide(
            sendOutcome,
            attempt: job.attempts,
            transportRetries: job.transportRetries,
            policy: policy,
            transportBudget: self.transportBudget,
            platform: job.platform
        )
        // Only APNs' own answer repairs the environment (a token refused before sending is not the build's).
        if case .response = sendOutcome { decided = decided.repairingEnvironment(of: job) }
        let sent: Bool
        switch sendOutcome {
        case .response, .fcm: sent = true
        case .transport(let fault, _): sent = fault == .unknownOutcome
        case .rejected: sent = false
        }
        let outcome = JobOutcome(
            jobID: job.id,
            attempt: job.attempts,
            disposition: decided.decision,
            attemptedAt: started,
            status: status,
            reason: decided.reason,
            // Warnings first: they describe the payload the attempt carried, whatever APNs answered.
            trapIDs: warnings.map(\.trapID) + (decided.trapID.map { [$0] } ?? []),
            // A broadcast's answer carries apns-request-id instead: the same column keeps it. An FCM job's
            // message name goes to provider_message_id (the statement picks the column by platform).
            apnsUniqueID: response?.apnsUniqueID ?? response?.requestID ?? fcmResponse?.messageName,
            latencyMs: sent
                ? Int(
                    ((response?.latency ?? fcmResponse?.latency ?? (self.clock.now - started)).seconds * 1000)
                        .rounded()
                ) : nil,
            sent: sent,
            invalidatesToken: decided.invalidatesToken,
            apnsTimestampMs: response?.timestampMs,
            switchesEnvironment: decided.switchesEnvironment
        )
        if !warnings.isEmpty {
            self.logger.debug(
                "payload warnings",
                metadata: [
                    "push.job_id": "\(job.id)",
                    "push.traps": "\(warnings.map(\.trapID.rawValue).joined(separator: ","))",
                ]
            )
        }
        if decided.unknownReason || { if case .rejected = sendOutcome { return true } else { return false } }() {
            var logger = self.logger
            logger[metadataKey: "push.job_id"] = "\(job.id)"
            logger[metadataKey: "push.apns_id"] = "\(job.apnsID.uuidString.lowercased())"
            logger[metadataKey: "push.token_fp"] = "\(job.tokenFingerprint)"
            if decided.unknownReason {
                logger.warning(
                    "unknown \(job.platform.providerName) reason; retrying with the normal budget",
                    metadata: ["push.status": "\(status ?? 0)", "push.reason": "\(decided.reason ?? "-")"]
                )
            } else {
                logger.info(
                    "job refused before sending",
                    metadata: [
                        "push.reason": "\(decided.reason ?? "-")", "push.trap": "\(decided.trapID?.rawValue ?? "-")",
                    ]
                )
            }
        }
        return Attempt(job: job, outcome: outcome, decided: decided)
    }
}
