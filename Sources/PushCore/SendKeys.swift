/// The keys a worker groups, pauses and excludes its jobs by: typed from the claim to the send, spelled as
/// strings only where a statement binds them.

/// A credential of one platform: what a provider refuses or asks to wait. A team may name its APNs key and
/// its FCM service account alike; APNs refusing `default` holds APNs' jobs of that name only.
public struct CredentialKey: Hashable, Sendable, Comparable, CustomStringConvertible {
    public var platform: Platform
    public var credential: String

    public init(platform: Platform, credential: String) {
        self.platform = platform
        self.credential = credential
    }

    /// The key of `job`'s credential.
    public init(_ job: PushJob) {
        self.init(platform: job.platform, credential: job.credential)
    }

    /// The (environment, credential) pairs whose jobs it covers: APNs' two environments, or FCM's one.
    public var endpoints: [EndpointKey] {
        switch self.platform {
        case .apns:
            [
                EndpointKey(environment: "production", credential: self.credential),
                EndpointKey(environment: "development", credential: self.credential),
            ]
        case .fcm: [EndpointKey(environment: "fcm", credential: self.credential)]
        }
    }

    public var description: String { "\(self.platform.rawValue)/\(self.credential)" }

    public static func < (a: Self, b: Self) -> Bool {
        (a.platform.rawValue, a.credential) < (b.platform.rawValue, b.credential)
    }
}

/// Where a job's requests go: its environment (`production`, `development`, or `fcm` for Android) and
/// credential. APNs has a connection pool per pair.
public struct EndpointKey: Hashable, Sendable, CustomStringConvertible {
    public var environment: String
    public var credential: String

    public init(environment: String, credential: String) {
        self.environment = environment
        self.credential = credential
    }

    /// The key of `job`'s requests.
    public init(_ job: PushJob) {
        self.init(environment: job.environment, credential: job.credential)
    }

    /// `environment/credential`, as the claim excludes it.
    public var description: String { "\(self.environment)/\(self.credential)" }
}

/// A credential's topic (APNs refuses a key for a topic: TopicDisallowed).
public struct TopicKey: Hashable, Sendable, CustomStringConvertible {
    public var credential: String
    public var topic: String

    public init(credential: String, topic: String) {
        self.credential = credential
        self.topic = topic
    }

    /// `credential/topic`, as the claim excludes it.
    public var description: String { "\(self.credential)/\(self.topic)" }
}

/// The requests that go out as one batch: one platform, environment and credential, whatever their topics
/// (a batch per topic cost the worker a task and a submission per topic of a claim: 30 µs a job more at
/// 10,000 topics).
public struct SendGroup: Hashable, Sendable {
    public var platform: Platform
    public var endpoint: EndpointKey

    /// The group of `job`'s request.
    public init(_ job: PushJob) {
        self.platform = job.platform
        self.endpoint = EndpointKey(job)
    }
}
