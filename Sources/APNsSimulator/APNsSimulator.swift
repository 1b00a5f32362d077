public import Crypto
public import Foundation
public import Logging
public import NIOCore
import NIOHTTP2
public import NIOPosix
import NIOSSL
import Synchronization

/// An APNs-faithful HTTP/2 TLS server for tests, the no-credentials default, benchmarks and staging.
///
/// It validates requests in Apple's order with Apple's reasons, verifies provider tokens against the
/// configured keys, allows one stream per connection until a request with a valid token succeeds and
/// then raises the limit by SETTINGS, echoes `apns-id`, adds `apns-unique-id`, serves broadcast and
/// channel-management endpoints, plays scripted behaviours per token, and records every request.
/// In fast mode it answers 200 at once with no checks (benchmarks).
public final class APNsSimulator: Sendable {
    /// A signing key the simulator trusts: its team and public key, by key id.
    public struct TrustedKey: Sendable {
        /// The team id the token's `iss` must name.
        public var teamID: String
        /// The public half of the `.p8`.
        public var publicKey: P256.Signing.PublicKey

        /// Creates a trusted key.
        public init(teamID: String, publicKey: P256.Signing.PublicKey) {
            self.teamID = teamID
            self.publicKey = publicKey
        }
    }

    /// How the simulator listens and answers.
    public struct Configuration: Sendable {
        /// Address to bind (loopback by default).
        public var host: String
        /// Port; 0 picks a free one (see ``APNsSimulator/port``).
        public var port: Int
        /// Trusted signing keys by key id.
        public var keys: [String: TrustedKey]
        /// Answer every request 200 at once, without validation or token checks.
        public var fastMode: Bool
        /// The stream limit announced after the first authenticated success (APNs: 500–1,500).
        public var authenticatedMaxStreams: Int
        /// Add `apns-unique-id` to successful device sends (as APNs development does).
        public var uniqueIDs: Bool
        /// Tokens older than this are `ExpiredProviderToken`.
        public var tokenMaxAge: TimeInterval
        /// A new token for the same key sooner than this after the previous one is `TooManyProviderTokenUpdates`.
        public var minimumTokenRefresh: TimeInterval
        /// Bundle ids the keys may send to; `nil` allows any (otherwise `TopicDisallowed`).
        public var allowedTopics: Set<String>?
        /// Keep a record of every request (turn off for long benchmarks).
        public var recordRequests: Bool
        /// Host names the server certificate is valid for besides `localhost` and 127.0.0.1 (a compose
        /// service name, a staging host).
        public var tlsNames: [String] = []
        /// Faults played on every connection (GOAWAY, drops, resets, throttling), seeded.
        public var faults = FaultPlan()
        /// The APNs environment this simulator plays for provider certificates: a certificate not issued for
        /// it is refused with BadCertificateEnvironment. `nil` accepts both.
        public var environment: String?
        /// Host names whose requests go to the development environment (Apple tells its environments apart
        /// by host: api.sandbox.push.apple.com); every other host is production. A worker pointed at
        /// `https://127.0.0.1:port` for development and `https://localhost:port` for production meets both in
        /// one simulator.
        public var sandboxHosts: Set<String> = []
        /// The wall clock that judges provider-token age (tests move it instead of sleeping).
        public var now: @Sendable () -> Date = Date.init
        /// iOS's budget for priority-10 Live Activity pushes, per device token: past it, `429
        /// TooManyRequests` (send routine updates at priority 5). `nil`: no budget.
        public var liveActivityBudget: Budget? = Budget(count: 12, window: 3600)
        /// Connections opened and closed without a single request: past this many in the window, a new
        /// connection is refused (GOAWAY `ENHANCE_YOUR_CALM`), as APNs treats connect/disconnect churn as an
        /// attack. `nil`: no limit.
        public var idleConnectionLimit: Budget? = Budget(count: 20, window: 60)
        /// FCM service accounts the token endpoint trusts, by client email (`push-worker simulator --fcm`).
        public var fcmAccounts: [String: FCMAccount] = [:]
        /// How long a granted FCM access token lives (`expires_in`).
        public var accessTokenLifetime: TimeInterval = 3600

        /// So many within a sliding window of seconds.
        public struct Budget: Sendable, Hashable {
            public var count: Int
            public var window: TimeInterval
            public init(count: Int, window: TimeInterval) {
                self.count = count
                self.window = window
            }
        }

        /// Defaults: loopback, free port, faithful mode, 1,000 streams once authenticated, unique ids on.
        public init(
            host: String = "127.0.0.1",
            port: Int = 0,
            keys: [String: TrustedKey] = [:],
            fastMode: Bool = false,
            authenticatedMaxStreams: Int = 1_000,
            uniqueIDs: Bool = true,
            tokenMaxAge: TimeInterval = 3600,
            minimumTokenRefresh: TimeInterval = 20 * 60,
            allowedTopics: Set<String>? = nil,
            recordRequests: Bool = true
        ) {
            self.host = host
            self.port = port
            self.keys = keys
            self.fastMode = fastMode
            self.authenticatedMaxStreams = authenticatedMaxStreams
            self.uniqueIDs = uniqueIDs
            self.tokenMaxAge = tokenMaxAge
            self.minimumTokenRefresh = minimumTokenRefresh
            self.allowedTopics = allowedTopics
            self.recordRequests = recordRequests
        }
    }

    let configuration: Configuration
    let logger: Logger
    let certificates: SimulatorCertificates
    let state = Mutex(SimulatorState())
    let verifier: JWTVerifier
    private let boundPort = Mutex(0)

    /// The PEM of the CA that signed the simulator's certificate: trust it (`--apns-ca-file`).
    public var caPEM: String { self.certificates.caPEM }
    /// The port it listens on, once running.
    public var port: Int { self.boundPort.withLock { $0 } }
    /// `https://127.0.0.1:<port>` for `--apns-endpoint`.
    public var endpointURL: String { "https://\(self.configuration.host):\(self.port)" }

    /// Creates a simulator with a fresh throwaway certificate authority.
    public init(configuration: Configuration, logger: Logger) throws {
        self.configuration = configuration
        self.logger = logger
        self.certificates = try SimulatorCertificates.make(extraNames: configuration.tlsNames)
        self.verifier = JWTVerifier(keys: configuration.keys, maximumAge: configuration.tokenMaxAge)
        self.state.withLock { $0.faultRandom = SeededGenerator(seed: configuration.faults.seed) }
    }

    /// Writes the CA certificate to `path` (PEM) and returns the path.
    @discardableResult
    public func writeCACertificate(to path: String) throws -> String {
        try self.caPEM.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    /// Makes `token` a device token of an app built for `environment` (`production` or `development`): sent
    /// to the other environment, it is answered 400 BadDeviceToken, as APNs answers a sandbox token sent to
    /// production (Apple: "the device token … matches the environment").
    public func register(token: String, environment: String) {
        self.state.withLock { $0.tokenEnvironments[token] = environment }
    }

    /// Makes `token` (a device token or channel id) behave as scripted from now on.
    public func script(_ token: String, _ behaviour: SimulatorBehaviour) {
        self.state.withLock { $0.scripts[token] = behaviour }
    }

    /// Every request received so far, in arrival order.
    public var requests: [RecordedRequest] { self.state.withLock { $0.requests } }

    /// Forgets the recorded requests.
    public func clearRequests() { self.state.withLock { $0.requests.removeAll() } }

    /// Refuses every provider token of `keyID` with 403 `reason` (InvalidProviderToken, Forbidden, …) until
    /// called again with `nil`: a key revoked, or not yet enabled, and then fixed.
    public func refuseKey(_ keyID: String, reason: String?) {
        self.state.withLock { $0.refusedKeys[keyID] = reason }
    }

    /// Answers every send (APNs' and FCM's, not the token endpoint), or the given share of them at random, with
    /// `status` (500 or 503, Apple's `InternalServerError` / `ServiceUnavailable`, FCM's `INTERNAL` /
    /// `UNAVAILABLE`) until called with `nil`: a regional outage, or a brownout, and its end.
    public func setOutage(_ status: Int?, share: Double = 1) {
        self.state.withLock { $0.outage = status.map { ($0, share) } }
    }

    /// The most streams open at once since the last ``resetStreamHighWater()``.
    public var maxConcurrentStreamsSeen: Int { self.state.withLock { $0.maxOpenStreams } }

    /// Starts counting ``maxConcurrentStreamsSeen`` afresh.
    /// Streams being served now (a request read, its handler not yet done).
    public var openStreamCount: Int { self.state.withLock { $0.openStreams } }

    public func resetStreamHighWater() { self.state.withLock { $0.maxOpenStreams = $0.openStreams } }

    /// What the fault plan did so far, and the 200s written per apns-id.
    public var faultCounters: FaultCounters { self.state.withLock { $0.faults } }

    /// Connections accepted so far.
    public var connectionsAccepted: Int { self.state.withLock { $0.connectionCount } }

    /// Announces a new `SETTINGS_MAX_CONCURRENT_STREAMS` on every open connection (a mid-burst decrease).
    public func announceMaxConcurrentStreams(_ value: Int) {
        let channels = self.state.withLock { state in
            state.announcedMaxStreams = value
            return Array(state.connections.values)
        }
        for channel in channels {
            let frame = HTTP2Frame(
                streamID: .rootStream,
                payload: .settings(.settings([HTTP2Setting(parameter: .maxConcurrentStreams, value: value)]))
            )
            channel.writeAndFlush(frame, promise: nil)
        }
    }

    /// Binds, serves until `body` returns (or throws), then closes every connection.
    public func run<T: Sendable>(
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        _ body: @Sendable (APNsSimulator) async throws -> T
    ) async throws -> T {
        let server = try await self.bind(group: group)
        self.boundPort.withLock { $0 = server.channel.localAddress?.port ?? 0 }
        return try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask {
                try await self.serve(server)
                return nil
            }
            defer { group.cancelAll() }
            let result = try await body(self)
            try? await server.channel.close()
            let connections = self.state.withLock { Array($0.connections.values) }
            for connection in connections { connection.close(promise: nil) }
            return result
        }
    }
}
