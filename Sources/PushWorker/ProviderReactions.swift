import Logging
import PushCore
import PushQueue
import PushTransport

/// What a worker does about what the providers answered, apart from the job's own outcome: a credential
/// refused (or asked to wait) is paused, a topic APNs refused for a credential is paused, an endpoint that
/// cannot be reached backs off; a delivery lifts them. The claim leaves what they hold pending
/// (``exclusions(down:)``), and a request they hold is withdrawn just before its write.
final class ProviderReactions: Sendable {
    /// Credentials a provider refused or asked to wait (FCM's QUOTA_EXCEEDED), by platform: their jobs are
    /// not claimed or sent for a while. APNs refusing `default` holds APNs' jobs of that name only.
    let credentialPauses: Pauses<CredentialKey>
    /// A credential's topics APNs refused (TopicDisallowed): those jobs are not claimed for a while.
    let topicPauses: Pauses<TopicKey>
    /// Endpoints (environment and credential) that could not be reached: their jobs are not claimed for a
    /// while.
    let unreachableEndpoints: Pauses<EndpointKey>
    /// The (environment, credential) pairs this worker cannot send: a credential it has for one platform only
    /// leaves the other platform's jobs of that name to workers that can.
    let platformGaps: [EndpointKey]
    let metrics: WorkerMetrics
    let logger: Logger

    init(
        configuration: WorkerConfiguration,
        senders: [Platform: any PushSender],
        metrics: WorkerMetrics,
        clock: any PushClock,
        logger: Logger
    ) {
        self.credentialPauses = Pauses(
            initial: configuration.credentialPause,
            maximum: configuration.maximumCredentialPause,
            clock: clock
        )
        self.topicPauses = Pauses(
            initial: configuration.credentialPause,
            maximum: configuration.maximumCredentialPause,
            clock: clock
        )
        self.unreachableEndpoints = Pauses(initial: .seconds(1), maximum: .seconds(30), clock: clock)
        self.platformGaps = (configuration.credentials ?? []).flatMap { name in
            Platform.allCases.flatMap { platform in
                senders[platform]?.credentialNames.contains(name) == true
                    ? [] : CredentialKey(platform: platform, credential: name).endpoints
            }
        }
        self.metrics = metrics
        self.logger = logger
    }

    /// Whether `credential`'s requests are held now (the provider refused it, or asked it to wait).
    func holds(_ credential: CredentialKey) -> Bool { self.credentialPauses.isPaused(credential) }

    /// Whether APNs refused `job`'s credential for its topic, lately.
    func holdsTopic(of job: PushJob) -> Bool {
        job.platform == .apns && self.topicPauses.isPaused(TopicKey(credential: job.credential, topic: job.topic))
    }

    /// What the claim leaves pending: what these reactions hold, this worker's platform gaps, and what is
    /// `down` (``ProviderOutages/excluded()``).
    func exclusions(down: (environments: [String], endpoints: [EndpointKey])) -> ClaimExclusions {
        ClaimExclusions(
            environments: down.environments,
            endpoints: self.unreachableEndpoints.active() + self.credentialPauses.active().sorted().flatMap(\.endpoints)
                + self.platformGaps + down.endpoints,
            topics: self.topicPauses.active()
        )
    }

    /// How many credentials and topics are held now (a metric).
    var heldCount: Int { self.credentialPauses.active().count + self.topicPauses.active().count }

    /// A decided attempt's effects: pause a credential, a topic or an unreachable endpoint; a delivery lifts
    /// its credential's and endpoint's.
    func react(to attempt: JobProcessor.Attempt) {
        let (job, decided) = (attempt.job, attempt.decided)
        let endpoint = EndpointKey(environment: job.environment, credential: job.credential)
        if decided.decision == .delivered {
            self.credentialPauses.succeeded(CredentialKey(job))
            self.unreachableEndpoints.succeeded(endpoint)
        }
        if decided.pausesCredential {
            let key = CredentialKey(job)
            let (length, isNew) =
                decided.pauseLength.map { self.credentialPauses.pause(key, for: $0) }
                ?? self.credentialPauses.pause(key)
            if isNew { self.metrics.credentialRefused(platform: job.platform, reason: decided.reason ?? "-") }
            if isNew, decided.pauseLength != nil {
                self.logger.warning(
                    "\(job.platform.providerName) asked credential '\(job.credential)' to wait (\(decided.reason ?? "-")): its jobs stay pending for \(length), no attempt used",
                    metadata: ["push.credential": "\(job.credential)", "push.reason": "\(decided.reason ?? "-")"]
                )
            } else if isNew {
                let reason = decided.reason ?? "-"
                let what = job.platform == .fcm ? "its service account key file" : "its key or certificate"
                self.logger.error(
                    "\(job.platform.providerName) refused credential '\(job.credential)' (\(reason)): its jobs stay pending for \(length); fix the credential (\(what))",
                    metadata: ["push.credential": "\(job.credential)", "push.reason": "\(reason)"]
                )
            }
        }
        if decided.pausesTopic {
            let (length, isNew) = self.topicPauses.pause(TopicKey(credential: job.credential, topic: job.topic))
            if isNew {
                let reason = decided.reason ?? "-"
                self.logger.error(
                    "APNs refused credential '\(job.credential)' for topic '\(job.topic)' (\(reason)): its jobs of this topic stay pending for \(length); its other topics keep sending. Check the bundle id and that the key belongs to the app's team",
                    metadata: [
                        "push.credential": "\(job.credential)", "push.topic": "\(job.topic)",
                        "push.reason": "\(reason)",
                    ]
                )
            }
        }
        if decided.endpointUnreachable {
            let (_, isNew) = self.unreachableEndpoints.pause(endpoint)
            if isNew {
                self.logger.warning(
                    "\(job.platform.providerName) unreachable for \(job.environment) with credential '\(job.credential)': those jobs stay pending, unclaimed, while the pool reconnects",
                    metadata: ["push.environment": "\(job.environment)", "push.credential": "\(job.credential)"]
                )
            }
        }
    }
}
