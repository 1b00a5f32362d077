import Foundation
public import Logging
public import NIOCore
public import NIOPosix
import NIOSSL
public import PushCore
import Synchronization

/// Sends messages to FCM's HTTP v1 API: the shared HTTP/2 engine (``PushClient``) with FCM's provider
/// (``FCMProvider``) and its credentials (one service account per credential, its access token from
/// ``AccessTokenCache``). Within one call it resends at once what FCM certainly did not process, and
/// re-mints the access token once on a 401; everything else comes back to the caller, as for APNs.
public final class FCMClient: Sendable {
    /// Endpoint, pool size, deadlines and reconnect backoff.
    public struct Configuration: Sendable {
        /// Where sends go instead of `fcm.googleapis.com:443` (a stand-in); the token endpoint is each key
        /// file's `token_uri`.
        public var endpointOverride: PushEndpoint?
        /// Extra trusted CA certificates (PEM file) for the send and token endpoints.
        public var caFile: String?
        /// Connections per credential.
        public var connectionsPerPool: Int = 2
        /// Deadline of one request, from acquiring a stream to the end of the response.
        public var requestTimeout: Duration = .seconds(10)
        /// TCP + TLS connect deadline.
        public var connectTimeout: Duration = .seconds(10)
        /// A connection idle this long is PINGed before use.
        public var idlePingAfter: Duration = .seconds(60)
        /// First reconnect backoff after a failed connect; doubles to ``maximumReconnectBackoff``.
        public var initialReconnectBackoff: Duration = .seconds(1)
        /// The reconnect backoff cap.
        public var maximumReconnectBackoff: Duration = .seconds(60)
        /// The HTTP CONNECT proxy connections go through, unless its `NO_PROXY` list names the host.
        public var httpsProxy: HTTPSProxy?
        /// The monotonic clock of the pools' reconnect backoff.
        public var clock: any PushClock = ContinuousClock()

        public init(endpointOverride: PushEndpoint? = nil, caFile: String? = nil) {
            self.endpointOverride = endpointOverride
            self.caFile = caFile
        }

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
    }

    /// FCM's send host.
    public static let googleEndpoint = PushEndpoint(host: "fcm.googleapis.com", port: 443)

    let configuration: Configuration
    let accounts: [String: ServiceAccount]
    let tokenCaches: [String: AccessTokenCache]
    let engine: PushClient<FCMProvider>
    let logger: Logger

    /// - Parameters:
    ///   - accounts: service accounts by credential name (the job's `credential` column).
    ///   - tokenStore: where worker processes share access tokens (Postgres in the daemon).
    /// - Throws: ``TransportError`` (`connectFailed`) when the CA file cannot be loaded.
    public init(
        configuration: Configuration,
        accounts: [String: ServiceAccount],
        tokenStore: (any ProviderTokenStore)? = nil,
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger
    ) throws {
        self.configuration = configuration
        self.accounts = accounts
        self.logger = logger
        let tlsContext = try PushClient<FCMProvider>.context(
            try PushClient<FCMProvider>.clientTLS(caFile: configuration.caFile, flag: "--fcm-ca-file")
        )
        // The token exchange rides the same engine (a pool of its own per token endpoint, no bearer token, no
        // in-call rules), through the same TLS trust and proxy; the caches reach it weakly (it holds them).
        let exchanger = WeakEngine()
        var caches: [String: AccessTokenCache] = [:]
        for (name, account) in accounts {
            caches[name] = AccessTokenCache(account: account, store: tokenStore, clock: configuration.clock) {
                account,
                assertion in
                guard let engine = exchanger.engine else {
                    throw TransportError(
                        code: .shutdown,
                        mayHaveBeenProcessed: false,
                        message: "the FCM client was shut down"
                    )
                }
                return try await Self.exchange(assertion, for: account, on: engine, clock: configuration.clock)
            }
        }
        self.tokenCaches = caches
        self.engine = PushClient(
            provider: FCMProvider(
                endpoint: configuration.endpointOverride ?? Self.googleEndpoint,
                projects: accounts.mapValues(\.projectID)
            ),
            configuration: configuration.pool,
            authenticators: caches.mapValues { $0 },
            tlsContext: tlsContext,
            certificateContexts: [:],
            group: group,
            logger: logger
        )
        exchanger.engine = self.engine
    }

    /// The engine, held weakly by the access-token caches it holds.
    private final class WeakEngine: @unchecked Sendable {
        private let lock = NSLock()
        private weak var held: PushClient<FCMProvider>?
        var engine: PushClient<FCMProvider>? {
            get { self.lock.withLock { self.held } }
            set { self.lock.withLock { self.held = newValue } }
        }
    }

    /// The OAuth 2.0 JWT bearer grant (RFC 7523) at the account's `token_uri`.
    static func exchange(
        _ assertion: String,
        for account: ServiceAccount,
        on engine: PushClient<FCMProvider>,
        clock: any PushClock
    ) async throws -> AccessTokenCache.Grant {
        let endpoint = try PushEndpoint(url: account.tokenURI, flag: "token_uri")
        let path = URL(string: account.tokenURI).map { $0.path.isEmpty ? "/" : $0.path } ?? "/"
        let body = "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=" + assertion
        let started = clock.wallNow
        let answer: HTTP2Answer
        do {
            answer = try await engine.exchange(
                OutgoingRequest(
                    method: "POST",
                    path: path,
                    headers: [("content-type", "application/x-www-form-urlencoded")],
                    body: Array(body.utf8)
                ),
                endpoint: endpoint
            )
        } catch let error as TransportError where error.code != .shutdown {
            // Whatever happened to the exchange, no message was sent: the jobs wait uncounted, as for an
            // unreachable endpoint, never charged an unknown outcome.
            throw TransportError(
                code: .connectFailed,
                mayHaveBeenProcessed: false,
                message: "could not get an access token from \(endpoint.host) for \(account): \(error.message)"
            )
        }
        let object = (try? JSONSerialization.jsonObject(with: Data(answer.body))) as? [String: Any]
        guard answer.status == 200 else {
            // OAuth's error words only: the body never carries the assertion back.
            let error = (object?["error"] as? String).map { " (\($0))" } ?? ""
            if (400..<500).contains(answer.status) {
                throw TransportError(
                    code: .credentialRefused,
                    mayHaveBeenProcessed: false,
                    message:
                        "the token endpoint \(endpoint.host) refused \(account) with \(answer.status)\(error): check the key file is current (not deleted in Google Cloud) and the account may send FCM messages"
                )
            }
            throw TransportError(
                code: .connectFailed,
                mayHaveBeenProcessed: false,
                message: "the token endpoint \(endpoint.host) answered \(answer.status)\(error) for \(account)"
            )
        }
        guard let token = object?["access_token"] as? String, !token.isEmpty else {
            throw TransportError(
                code: .connectFailed,
                mayHaveBeenProcessed: false,
                message: "the token endpoint \(endpoint.host) answered 200 without an access_token for \(account)"
            )
        }
        let lifetime = (object?["expires_in"] as? NSNumber)?.doubleValue ?? 3600
        return AccessTokenCache.Grant(token: token, grantedAt: started, lifetime: min(max(lifetime, 10), 86_400))
    }

    /// Obtains an access token for `credential` (the token exchange only: no message is sent), proving the
    /// key file is accepted. Throws ``TransportError`` naming what refused it.
    public func verify(credential: String) async throws {
        guard let cache = self.tokenCaches[credential] else { throw FCMProvider().missingCredential(credential) }
        _ = try await cache.token()
    }

    /// The credentials this client has a service account for, sorted: what its worker may claim.
    public var credentialNames: [String] { self.accounts.keys.sorted() }

    /// The Firebase project a credential sends for.
    public func project(of credential: String) -> String? { self.accounts[credential]?.projectID }

    /// What the worker sends Android jobs through: the engine itself, with FCM's provider.
    public var sender: any PushSender { self.engine }

    /// Sends one message with `credential`'s account: a batch of one.
    public func send(
        _ message: FCMMessage,
        credential: String,
        mayWrite: (@Sendable () -> Bool)? = nil
    ) async throws -> FCMResponse {
        try await PushClient<FCMProvider>.single { onResult in
            await self.sendBatch([message], credential: credential, mayWrite: mayWrite ?? { true }, onResult: onResult)
        }
    }

    /// Sends many messages of one credential, with the engine's rules for each: each answer is handed to
    /// `onResult` as it arrives; returns when every message has its result.
    public func sendBatch(
        _ messages: [FCMMessage],
        credential: String,
        mayWrite: @escaping @Sendable () -> Bool,
        withdraws: (@Sendable (_ index: Int) -> Bool)? = nil,
        onResult: @escaping @Sendable (_ index: Int, _ result: Result<FCMResponse, any Error>) -> Void
    ) async {
        await self.engine.sendBatch(
            wrapping: messages.map { ProviderRequest.fcm($0) },
            credential: credential,
            mayWrite: mayWrite,
            withdraws: withdraws,
            unwrap: { if case .fcm(let response) = $0 { response } else { nil } },
            onResult: onResult
        )
    }

    /// Opens one connection per credential, at most `timeout` in all.
    public func warmUp(credentials: [String], timeout: Duration) async {
        await self.engine.warmUp(credentials: credentials, timeout: timeout)
    }

    /// Access tokens this process obtained, across credentials.
    public var exchangeCount: Int { self.tokenCaches.values.reduce(0) { $0 + $1.exchangeCount } }

    /// Requests FCM certainly did not process, resent or given back.
    public var notProcessedCount: Int { self.engine.notProcessedCount }

    /// Connections open now, across pools.
    public var openConnections: Int { self.engine.openConnections }

    /// Closes every connection.
    public func shutdown() async {
        await self.engine.shutdown()
    }
}
