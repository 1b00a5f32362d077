import Foundation
public import Logging
public import NIOCore
public import NIOPosix
import NIOSSL
public import PushCore
import Synchronization

/// Sends requests to APNs: the shared HTTP/2 engine (``PushClient``) with APNs' provider (``APNsProvider``:
/// its answers, its reason table's connection column, its header rules) and its credentials (a provider
/// token per signing key, shared by every connection and, through the store, every worker; or a TLS client
/// certificate).
///
/// Within one call it resends at once what APNs certainly did not process (refused before sending,
/// above a GOAWAY's last stream id), re-mints the token once on `ExpiredProviderToken`, adopts the fleet's
/// on `TooManyProviderTokenUpdates`, and opens a new connection once on `UnrelatedKeyIdInToken`.
/// Everything else comes back to the caller: a response to classify, or a ``TransportError`` to retry
/// durably.
public final class APNsClient: Sendable {
    /// Endpoints, pool size, deadlines and reconnect backoff.
    public struct Configuration: Sendable {
        /// One endpoint for both environments (simulator, staging proxy); `nil` for Apple's hosts.
        public var endpointOverride: APNsEndpoint?
        /// The development environment's own endpoint (a stand-in for the sandbox host); `nil` uses
        /// ``endpointOverride``.
        public var developmentEndpointOverride: APNsEndpoint?
        /// The port of Apple's send hosts: 443, or 2197 for networks that block 443 (`--apns-port`).
        public var applePort: Int = 443
        /// Channel-management endpoint override; `nil` uses ``endpointOverride`` or Apple's hosts.
        public var channelEndpointOverride: APNsEndpoint?
        /// Extra trusted CA certificates (PEM file) on top of the system's roots.
        public var caFile: String?
        /// Connections per (environment, credential); APNs treats connection churn as an attack.
        public var connectionsPerPool: Int
        /// Deadline of one request, from acquiring a stream to the end of the response.
        public var requestTimeout: Duration
        /// TCP + TLS connect deadline.
        public var connectTimeout: Duration
        /// A connection idle this long is PINGed before use.
        public var idlePingAfter: Duration
        /// First reconnect backoff after a failed connect; doubles to ``maximumReconnectBackoff``.
        public var initialReconnectBackoff: Duration
        /// The reconnect backoff cap.
        public var maximumReconnectBackoff: Duration
        /// Provider token lifetime rules.
        public var tokens: ProviderTokenCache.Configuration
        /// The monotonic clock the pools' reconnect backoff reads (tests pass a `ManualClock`). Request
        /// deadlines run on the connection's event loop, and a token's age on the wall clock (`iat`).
        public var clock: any PushClock = ContinuousClock()

        /// What the shared engine's pools need of it.
        var pool: PoolConfiguration {
            PoolConfiguration(
                connectionsPerPool: self.connectionsPerPool,
                requestTimeout: self.requestTimeout,
                connectTimeout: self.connectTimeout,
                idlePingAfter: self.idlePingAfter,
                initialReconnectBackoff: self.initialReconnectBackoff,
                maximumReconnectBackoff: self.maximumReconnectBackoff,
                httpsProxy: self.httpsProxy,
                clock: self.clock
            )
        }
        /// The HTTP CONNECT proxy every connection (sends and channel management) goes through, unless its
        /// `NO_PROXY` list names the host.
        public var httpsProxy: HTTPSProxy?

        /// Defaults: Apple's hosts, 2 connections per pool, 10 s request and connect deadlines, PING after
        /// 60 s idle, reconnect backoff 1 s → 60 s.
        public init(
            endpointOverride: APNsEndpoint? = nil,
            channelEndpointOverride: APNsEndpoint? = nil,
            caFile: String? = nil,
            connectionsPerPool: Int = 2,
            requestTimeout: Duration = .seconds(10),
            connectTimeout: Duration = .seconds(10),
            idlePingAfter: Duration = .seconds(60),
            initialReconnectBackoff: Duration = .seconds(1),
            maximumReconnectBackoff: Duration = .seconds(60),
            tokens: ProviderTokenCache.Configuration = .init(),
            httpsProxy: HTTPSProxy? = nil
        ) {
            self.endpointOverride = endpointOverride
            self.channelEndpointOverride = channelEndpointOverride
            self.caFile = caFile
            self.connectionsPerPool = connectionsPerPool
            self.requestTimeout = requestTimeout
            self.connectTimeout = connectTimeout
            self.idlePingAfter = idlePingAfter
            self.initialReconnectBackoff = initialReconnectBackoff
            self.maximumReconnectBackoff = maximumReconnectBackoff
            self.tokens = tokens
            self.httpsProxy = httpsProxy
        }
    }

    let configuration: Configuration

    /// The monotonic clock its pools read (``Configuration/clock``); the worker's timers read the same one.
    public var clock: any PushClock { self.configuration.clock }
    let tokenCaches: [String: ProviderTokenCache]
    /// Certificate credentials: the environments each certificate is for.
    let certificateEnvironments: [String: Set<String>]
    /// The shared engine, with APNs' provider.
    let engine: PushClient<APNsProvider>
    let logger: Logger

    /// One pool per (endpoint, credential).
    typealias PoolKey = PushClient<APNsProvider>.PoolKey

    /// - Parameters:
    ///   - credentials: signing keys by credential name (the job's `credential` column).
    ///   - certificates: certificate credentials by name (TLS client auth, no provider token).
    ///   - tokenCaches: shared caches to use instead of making one per key (several clients, one token).
    ///   - tokenStore: where worker processes share provider tokens (Postgres in the daemon).
    ///   - group: the event loops connections run on.
    /// - Throws: ``TransportError`` (`connectFailed`) when the CA file cannot be loaded.
    public init(
        configuration: Configuration,
        credentials: [String: SigningKey],
        certificates: [String: ClientCertificate] = [:],
        tokenCaches: [String: ProviderTokenCache] = [:],
        tokenStore: (any ProviderTokenStore)? = nil,
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger
    ) throws {
        if let both = Set(credentials.keys).intersection(certificates.keys).sorted().first {
            throw TransportError(
                code: .invalidKey,
                mayHaveBeenProcessed: false,
                message:
                    "credential '\(both)' is configured both as a key and as a certificate: give each its own name"
            )
        }
        self.configuration = configuration
        var caches = tokenCaches
        for (name, key) in credentials where caches[name] == nil {
            caches[name] = ProviderTokenCache(
                key: key,
                configuration: configuration.tokens,
                store: tokenStore,
                clock: configuration.clock
            )
        }
        self.tokenCaches = caches
        self.logger = logger
        let tls = try PushClient<APNsProvider>.clientTLS(caFile: configuration.caFile, flag: "--apns-ca-file")
        let tlsContext: NIOSSLContext
        var contexts: [String: NIOSSLContext] = [:]
        do {
            tlsContext = try NIOSSLContext(configuration: tls)
            for (name, certificate) in certificates {
                var withCertificate = tls
                certificate.apply(to: &withCertificate)
                contexts[name] = try NIOSSLContext(configuration: withCertificate)
            }
        } catch {
            throw TransportError(
                code: .connectFailed,
                mayHaveBeenProcessed: false,
                message: "could not set up TLS: \(error)"
            )
        }
        self.certificateEnvironments = certificates.mapValues(\.environments)
        self.engine = PushClient(
            provider: APNsProvider(
                endpointOverride: configuration.endpointOverride,
                developmentEndpointOverride: configuration.developmentEndpointOverride,
                applePort: configuration.applePort
            ),
            configuration: configuration.pool,
            authenticators: caches.mapValues { $0 },
            tlsContext: tlsContext,
            certificateContexts: contexts,
            group: group,
            logger: logger
        )
    }

    /// The credentials this client has a signing key for, sorted: what its worker may claim.
    public var credentialNames: [String] {
        Set(self.tokenCaches.keys).union(self.certificateEnvironments.keys).sorted()
    }

    /// The environments a certificate credential's certificate is for; `nil` for a token credential (a key
    /// serves both) or an unknown one.
    public func certificateEnvironments(of credential: String) -> Set<String>? {
        self.certificateEnvironments[credential]
    }

    /// The token cache of a credential, if it is configured.
    public func tokenCache(for credential: String) -> ProviderTokenCache? { self.tokenCaches[credential] }

    /// Where a request for `environment` goes.
    func endpoint(for environment: APNsEnvironment) -> APNsEndpoint { self.engine.provider.endpoint(for: environment) }

    /// What the worker sends APNs jobs through: the engine itself, with APNs' provider.
    public var sender: any PushSender { self.engine }

    /// Sends a job's request with `credential`'s key and returns APNs' answer: a batch of one, on the same
    /// path as ``sendBatch(_:credential:mayWrite:withdraws:onResult:)``.
    ///
    /// - Throws: ``TransportError``: `credentialsMissing` when no key is configured for `credential`
    ///   (trap MS028), or a transport failure with ``TransportError/mayHaveBeenProcessed``.
    ///   - mayWrite: asked once a stream is granted, just before the request is written; `false`
    ///     withdraws it unsent (``TransportError/Code/shutdown``): a job whose lease lapsed while it
    ///     waited for a stream is never sent.
    public func send(
        _ request: APNsRequest,
        credential: String,
        mayWrite: (@Sendable () -> Bool)? = nil
    ) async throws -> APNsResponse {
        try await PushClient<APNsProvider>.single { onResult in
            await self.sendBatch([request], credential: credential, mayWrite: mayWrite ?? { true }, onResult: onResult)
        }
    }

    /// Sends any request (channel management) with a credential's token, with the in-call rules.
    func perform(
        endpoint: APNsEndpoint,
        credential: String,
        method: String,
        path: String,
        headers: [(name: String, value: String)],
        body: [UInt8]
    ) async throws -> APNsResponse {
        try await PushClient<APNsProvider>.single { onResult in
            await self.engine.sendBatch(
                [OutgoingRequest(method: method, path: path, headers: headers, body: body)],
                endpoint: endpoint,
                credential: credential,
                mayWrite: { true },
                onResult: onResult
            )
        }
    }

    /// Requests APNs certainly did not process, resent or given back (the `requests_not_processed` metric).
    public var notProcessedCount: Int { self.engine.notProcessedCount }

    /// Sends many requests of one credential and environment, with the same rules as
    /// ``send(_:credential:mayWrite:)`` for each (``PushClient/sendBatch(_:endpoint:credential:mayWrite:withdraws:onResult:)``):
    /// each answer is handed to `onResult` on the event loop as it arrives. Returns when every request has its
    /// result.
    ///
    /// - Parameters:
    ///   - mayWrite: asked once per group of requests, once their stream slots are granted and just before
    ///     they are written; `false` withdraws them and all the batch's remaining ones unsent
    ///     (``TransportError/Code/shutdown``).
    ///   - withdraws: asked for each request just before it is written, once its slot is granted; `true`
    ///     withdraws that request alone, unsent (a job cancelled meanwhile).
    ///   - onResult: called exactly once per request, with its index in `requests`.
    public func sendBatch(
        _ requests: [APNsRequest],
        credential: String,
        mayWrite: @escaping @Sendable () -> Bool,
        withdraws: (@Sendable (_ index: Int) -> Bool)? = nil,
        onResult: @escaping @Sendable (_ index: Int, _ result: Result<APNsResponse, any Error>) -> Void
    ) async {
        await self.engine.sendBatch(
            wrapping: requests.map { ProviderRequest.apns($0) },
            credential: credential,
            mayWrite: mayWrite,
            withdraws: withdraws,
            unwrap: { if case .apns(let response) = $0 { response } else { nil } },
            onResult: onResult
        )
    }

    func pool(for key: PoolKey) -> ConnectionPool { self.engine.pool(for: key) }

    /// Opens one connection per credential to the production endpoint (the override, if set, serves every
    /// environment), at most `timeout` in all; failures are left for the first send to report. A worker
    /// warms up before its first claim, so jobs it claims are not held back by TCP and TLS set-up (and a
    /// rate limit's spacing survives into the requests).
    public func warmUp(credentials: [String], timeout: Duration) async {
        await self.engine.warmUp(credentials: credentials, timeout: timeout)
    }

    /// Provider tokens this process has minted, across credentials (the `jwt_mints` metric).
    public var mintCount: Int {
        self.tokenCaches.values.reduce(0) { $0 + $1.mintCount }
    }

    /// Connections open now, across pools (the `connections` metric).
    public var openConnections: Int { self.engine.openConnections }

    /// Closes every connection; in-flight requests fail with `connectionReset`.
    public func shutdown() async { await self.engine.shutdown() }
}
