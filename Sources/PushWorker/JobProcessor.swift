import Foundation
import Logging
import PushCore
import PushQueue
import PushTransport

/// Makes claimed jobs ready to send: each one's request (``RequestBuilder``, ``FCMMessageBuilder``) or the
/// reason nothing is sent, with its retry policy; and the shapes a job takes on its way (``Prepared``,
/// ``Attempt``). No I/O; the worker's `settle` decides what came back.
struct JobProcessor: Sendable {
    /// APNs' client: which environments a certificate credential covers (checked before sending).
    let client: APNsClient
    let retry: RetryPolicy.Configuration
    /// ``RetryPolicy/killSwitchVariable``, read once.
    let killSwitch: Bool
    /// The process's clock: when an attempt started.
    let clock: any PushClock

    init(client: APNsClient, retry: RetryPolicy.Configuration, environment: [String: String], clock: any PushClock) {
        self.clock = clock
        self.client = client
        self.retry = retry
        self.killSwitch = RetryPolicy.killSwitchIsSet(in: environment)
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
}
