import Foundation
public import Logging
public import NIOCore
public import NIOPosix
import NIOSSL
public import PushCore
import Synchronization

/// Sends requests to APNs over a small fixed pool of HTTP/2 connections per (environment, credential),
/// with one provider token per signing key shared by all of them.
///
/// Within one call it resends at once what APNs certainly did not process (refused before sending,
/// above a GOAWAY's last stream id), re-mints the token once on `ExpiredProviderToken`, and opens a new
/// connection once on `UnrelatedKeyIdInToken`. Everything else comes back to the caller: a response to
/// classify, or a ``TransportError`` to retry durably.
public final class APNsClient: Sendable {
    /// Endpoints, pool size, deadlines and reconnect backoff.
    public struct Configuration: Sendable {
        /// One endpoint for both environments (simulator, staging proxy); `nil` for Apple's hosts.
        public var endpointOverride: APNsEndpoint?
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
    let tokenCaches: [String: ProviderTokenCache]
    let group: any EventLoopGroup
    let logger: Logger
    let tlsContext: NIOSSLContext
    /// Certificate credentials: each has its own TLS context carrying its client certificate.
    let certificateContexts: [String: NIOSSLContext]
    /// Certificate credentials: the environments each certificate is for.
    let certificateEnvironments: [String: Set<String>]
    private let pools = Mutex<[PoolKey: ConnectionPool]>([:])

    struct PoolKey: Hashable {
        var endpoint: APNsEndpoint
        var credential: String
    }

    /// - Parameters:
    ///   - credentials: signing keys by credential name (the job's `credential` column).
    ///   - certificates: certificate credentials by name (TLS client auth, no provider token).
    ///   - tokenCaches: shared caches to use instead of making one per key (several clients, one token).
    ///   - group: the event loops connections run on.
    /// - Throws: ``TransportError`` (`connectFailed`) when the CA file cannot be loaded.
    ///   - tokenStore: where worker processes share provider tokens (Postgres in the daemon).
    public init(
        configuration: Configuration,
        credentials: [String: SigningKey],
        certificates: [String: ClientCertificate] = [:],
        tokenCaches: [String: ProviderTokenCache] = [:],
        tokenStore: (any ProviderTokenStore)? = nil,
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger
    ) throws {
        // Watching from now on: a stall is only seen by a detector that was running through it.
        _ = StallDetector.shared
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
            caches[name] = ProviderTokenCache(key: key, configuration: configuration.tokens, store: tokenStore)
        }
        self.tokenCaches = caches
        self.group = group
        self.logger = logger
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.applicationProtocols = ["h2"]
        tls.minimumTLSVersion = .tlsv12
        if let caFile = configuration.caFile {
            do {
                let extra = try NIOSSLCertificate.fromPEMFile(caFile)
                tls.additionalTrustRoots = [.certificates(extra)]
            } catch {
                throw TransportError(
                    code: .connectFailed,
                    mayHaveBeenProcessed: false,
                    message: "--apns-ca-file \(caFile) is not a readable PEM certificate file: \(error)"
                )
            }
        }
        do {
            self.tlsContext = try NIOSSLContext(configuration: tls)
            var contexts: [String: NIOSSLContext] = [:]
            for (name, certificate) in certificates {
                var withCertificate = tls
                certificate.apply(to: &withCertificate)
                contexts[name] = try NIOSSLContext(configuration: withCertificate)
            }
            self.certificateContexts = contexts
            self.certificateEnvironments = certificates.mapValues(\.environments)
        } catch {
            throw TransportError(
                code: .connectFailed,
                mayHaveBeenProcessed: false,
                message: "could not set up TLS: \(error)"
            )
        }
    }

    /// The credentials this client has a signing key for, sorted: what its worker may claim.
    public var credentialNames: [String] { Set(self.tokenCaches.keys).union(self.certificateContexts.keys).sorted() }

    /// The environments a certificate credential's certificate is for; `nil` for a token credential (a key
    /// serves both) or an unknown one.
    public func certificateEnvironments(of credential: String) -> Set<String>? {
        self.certificateEnvironments[credential]
    }

    /// The token cache of a credential, if it is configured.
    public func tokenCache(for credential: String) -> ProviderTokenCache? { self.tokenCaches[credential] }

    /// Sends a job's request with `credential`'s key and returns APNs' answer.
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
        try await self.perform(
            request,
            endpoint: self.configuration.endpointOverride
                ?? .apple(request.environment, port: self.configuration.applePort),
            credential: credential,
            mayWrite: mayWrite
        )
    }

    /// ``perform(endpoint:credential:method:path:headers:body:mayWrite:resuming:)`` for a push request.
    func perform(
        _ request: APNsRequest,
        endpoint: APNsEndpoint,
        credential: String,
        mayWrite: (@Sendable () -> Bool)?,
        resuming first: FirstAttempt? = nil
    ) async throws -> APNsResponse {
        try await self.perform(
            endpoint: endpoint,
            credential: credential,
            method: request.method,
            path: request.path,
            headers: request.headers,
            body: request.body,
            mayWrite: mayWrite,
            resuming: first
        )
    }

    /// How many times one call resends a request APNs certainly did not process before it gives the
    /// job back uncounted.
    static let maximumResends = 8

    /// Requests APNs certainly did not process, resent or given back (the `requests_not_processed` metric).
    public var notProcessedCount: Int { self.notProcessed.withLock { $0 } }
    private let notProcessed = Mutex(0)

    /// One request's attempt whose answer the in-call rules still have to judge (a batch's first attempt).
    struct FirstAttempt: Sendable {
        var connection: APNsConnection
        var token: ProviderToken?
        var result: Result<APNsResponse, TransportError>
    }

    /// The error for a credential with neither key nor certificate.
    static func missingCredential(_ credential: String) -> TransportError {
        TransportError(
            code: .credentialsMissing,
            mayHaveBeenProcessed: false,
            message:
                "no APNs signing key or certificate is configured for credential '\(credential)': set APNS_KEY_ID, APNS_TEAM_ID and APNS_KEY_PATH, or name it in the config file"
        )
    }

    /// Sends any request with a credential's token, with the in-call resend rules.
    ///
    /// - Parameter first: an attempt already made (by ``sendBatch(_:credential:mayWrite:onResult:)``): its
    ///   answer is judged first, as if this call had sent it.
    func perform(
        endpoint: APNsEndpoint,
        credential: String,
        method: String,
        path: String,
        headers: [(name: String, value: String)],
        body: [UInt8],
        mayWrite: (@Sendable () -> Bool)? = nil,
        resuming first: FirstAttempt? = nil
    ) async throws -> APNsResponse {
        let cache = self.tokenCaches[credential]
        guard cache != nil || self.certificateContexts[credential] != nil else {
            throw Self.missingCredential(credential)
        }
        let pool = self.pool(for: PoolKey(endpoint: endpoint, credential: credential))
        var reMinted = false
        var adoptedShared = false
        var reconnected = false
        var resends = 0
        var pending = first
        while true {
            let attempt: FirstAttempt
            if let made = pending {
                attempt = made
                pending = nil
            } else {
                let connection = try await pool.connection()
                // A certificate credential authenticates in TLS: no provider token, no authorization header.
                let token = try await cache?.token()
                let result: Result<APNsResponse, TransportError>
                do {
                    result = .success(
                        try await connection.send(
                            method: method,
                            path: path,
                            headers: headers,
                            body: body,
                            authorization: token?.jwt,
                            deadline: self.configuration.requestTimeout,
                            mayWrite: mayWrite
                        )
                    )
                } catch let error as TransportError {
                    result = .failure(error)
                }
                attempt = FirstAttempt(connection: connection, token: token, result: result)
            }
            let connection = attempt.connection
            let token = attempt.token
            switch attempt.result {
            case .success(let response):
                // Any answer proves the endpoint works: reconnects need no backoff.
                pool.succeeded()
                switch (response.status, response.reason) {
                case (403, "ExpiredProviderToken") where !reMinted && token != nil:
                    reMinted = true
                    _ = try await cache?.replace(token!)
                    continue
                case (429, "TooManyProviderTokenUpdates") where !adoptedShared && token != nil:
                    // APNs took another process's token for this key first: send with that one, once. A
                    // 429 is a refusal, so the resend cannot deliver twice.
                    adoptedShared = true
                    if try await cache?.adoptShared(rejecting: token!) != nil {
                        // On a new connection: APNs may count a token change on one connection as an update.
                        self.notProcessed.withLock { $0 += 1 }
                        self.logger.warning(
                            "APNs took another worker's provider token for this key first; sending with that one",
                            metadata: ["push.credential": "\(credential)"]
                        )
                        await pool.discard(connection)
                        continue
                    }
                case (403, "UnrelatedKeyIdInToken") where !reconnected:
                    reconnected = true
                    await pool.discard(connection)
                    continue
                default:
                    connection.limiter.noteAnswer(status: response.status)
                }
                return response
            case .failure(let error) where error.fault == .notProcessed:
                // Certainly not processed: resend at once, on another connection if this one is going.
                // Past the resend limit the caller gives the job back to the queue, uncounted.
                self.notProcessed.withLock { $0 += 1 }
                if !connection.isUsable { await pool.discard(connection) }
                resends += 1
                if resends > Self.maximumResends || Task.isCancelled { throw error }
                continue
            case .failure(let error):
                throw error
            }
        }
    }

    /// Sends many requests of one credential and environment, with the same rules as
    /// ``send(_:credential:mayWrite:)`` for each, at a fraction of the cost: stream slots are taken as many
    /// at a time as are free, requests go to the event loop in one hop per connection and are flushed
    /// together, and each answer is handed to `onResult` on the event loop as it arrives. An answer the
    /// in-call rules act on (a token to re-mint or adopt, a key id to reconnect for, a request APNs did not
    /// process) is taken up at once by ``perform``, in a task of its own. Returns when every request has its
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
        guard let environment = requests.first?.environment else { return }
        let endpoint = self.configuration.endpointOverride ?? .apple(environment, port: self.configuration.applePort)
        let cache = self.tokenCaches[credential]
        guard cache != nil || self.certificateContexts[credential] != nil else {
            let error = Self.missingCredential(credential)
            for index in requests.indices { onResult(index, .failure(error)) }
            return
        }
        let pool = self.pool(for: PoolKey(endpoint: endpoint, credential: credential))
        // Which connection and token each request went out with: an answer the in-call rules act on needs both.
        let attempts = Mutex(
            [(connection: APNsConnection, token: ProviderToken?)?](repeating: nil, count: requests.count)
        )
        let batch = RequestBatch { batch, index, result in
            if case .success = result { pool.succeeded() }
            let sent = attempts.withLock { attempts in
                defer { attempts[index] = nil }
                return attempts[index]
            }
            if Self.takesInCallRules(result), let sent {
                // The in-call rules take it from here, at once, in a task of its own (these answers are rare).
                let request = requests[index]
                let attempt = FirstAttempt(connection: sent.connection, token: sent.token, result: result)
                batch.followUp {
                    do {
                        let response = try await self.perform(
                            request,
                            endpoint: endpoint,
                            credential: credential,
                            mayWrite: { !batch.isCancelled && mayWrite() },
                            resuming: attempt
                        )
                        onResult(index, .success(response))
                    } catch {
                        onResult(index, .failure(error))
                    }
                }
                return
            }
            if case .success(let response) = result {
                sent?.connection.limiter.noteAnswer(status: response.status)
            }
            onResult(index, result.mapError { $0 })
        }
        // A caller that gives up (a drain past its grace period) cancels the batch wherever this task waits:
        // requests in flight are reset, follow-ups stop, and the rest are withdrawn.
        await withTaskCancellationHandler {
            await self.submit(
                requests,
                batch: batch,
                pool: pool,
                cache: cache,
                attempts: attempts,
                mayWrite: mayWrite,
                withdraws: withdraws,
                onResult: onResult
            )
            await batch.waitForAll()
        } onCancel: {
            batch.cancel()
        }
    }

    /// Whether ``perform`` acts on this first answer (a token to re-mint or adopt, a key id to reconnect for,
    /// a request APNs did not process) rather than hand it back: its special cases, before their once-only
    /// guards.
    static func takesInCallRules(_ result: Result<APNsResponse, TransportError>) -> Bool {
        switch result {
        case .success(let response):
            switch (response.status, response.reason) {
            case (403, "ExpiredProviderToken"), (429, "TooManyProviderTokenUpdates"), (403, "UnrelatedKeyIdInToken"):
                true
            default:
                false
            }
        case .failure(let error):
            error.fault == .notProcessed
        }
    }

    /// ``sendBatch(_:credential:mayWrite:onResult:)``'s loop: takes slots, writes, until every request is
    /// written or given its reason not to be.
    private func submit(
        _ requests: [APNsRequest],
        batch: RequestBatch,
        pool: ConnectionPool,
        cache: ProviderTokenCache?,
        attempts: borrowing Mutex<[(connection: APNsConnection, token: ProviderToken?)?]>,
        mayWrite: @escaping @Sendable () -> Bool,
        withdraws: (@Sendable (_ index: Int) -> Bool)?,
        onResult: @escaping @Sendable (_ index: Int, _ result: Result<APNsResponse, any Error>) -> Void
    ) async {
        var waiting = requests.indices[...]
        var failedRounds = 0
        while !waiting.isEmpty {
            let stop: TransportError?
            do {
                let connection = try await pool.connection(waitForNew: false)
                let token = try await cache?.token()
                let granted = await connection.limiter.acquire(upTo: waiting.count)
                if granted == 0 {
                    // The connection closed (or this task was cancelled) before a slot came free.
                    if Task.isCancelled {
                        stop = TransportError.withdrawn
                    } else {
                        // Each waiting request was refused a stream, as each would have been on its own.
                        self.notProcessed.withLock { $0 += waiting.count }
                        if !connection.isUsable { await pool.discard(connection) }
                        failedRounds += 1
                        stop =
                            failedRounds > Self.maximumResends
                            ? TransportError(
                                code: .connectionReset,
                                mayHaveBeenProcessed: false,
                                message: "the connection closed before the request was sent"
                            ) : nil
                    }
                } else if Task.isCancelled || batch.isCancelled || !mayWrite() {
                    connection.limiter.release(granted)
                    connection.closeIfRetiredAndIdle()
                    stop = TransportError.withdrawn
                } else if connection.observer.isDraining {
                    // Told to go away meanwhile: not sent on it; the pool gives another.
                    connection.limiter.release(granted)
                    connection.closeIfRetiredAndIdle()
                    self.notProcessed.withLock { $0 += granted }
                    await pool.discard(connection)
                    failedRounds += 1
                    stop =
                        failedRounds > Self.maximumResends
                        ? TransportError.notSentGoingAway : nil
                } else {
                    var chunk = Array(waiting.prefix(granted))
                    waiting = waiting.dropFirst(granted)
                    failedRounds = 0
                    if let withdraws {
                        // Requests withdrawn one by one (their jobs cancelled meanwhile) give their slots back.
                        let withdrawn = chunk.filter(withdraws)
                        if !withdrawn.isEmpty {
                            chunk.removeAll { withdrawn.contains($0) }
                            connection.limiter.release(withdrawn.count)
                            for index in withdrawn { onResult(index, .failure(TransportError.withdrawn)) }
                            if chunk.isEmpty {
                                connection.closeIfRetiredAndIdle()
                                continue
                            }
                        }
                    }
                    attempts.withLock { attempts in
                        for index in chunk { attempts[index] = (connection, token) }
                    }
                    connection.submit(
                        chunk.map { index in
                            let request = requests[index]
                            return (
                                index,
                                connection.requestHeaders(
                                    method: request.method,
                                    path: request.path,
                                    headers: request.headers,
                                    bodyCount: request.body.count,
                                    authorization: token?.jwt
                                ),
                                request.body
                            )
                        },
                        to: batch,
                        deadline: self.configuration.requestTimeout
                    )
                    stop = nil
                }
            } catch {
                // No connection or no token: nothing more goes out; the rest get this error, as each would
                // have on its own.
                for index in waiting { onResult(index, .failure(error)) }
                waiting = waiting.dropFirst(waiting.count)
                continue
            }
            if let stop {
                // Nothing more goes out: the rest get this error, as each would have on its own.
                for index in waiting { onResult(index, .failure(stop)) }
                waiting = waiting.dropFirst(waiting.count)
            }
        }
    }

    func pool(for key: PoolKey) -> ConnectionPool {
        self.pools.withLock { pools in
            if let pool = pools[key] { return pool }
            let pool = ConnectionPool(
                endpoint: key.endpoint,
                context: .init(
                    configuration: self.configuration,
                    tlsContext: self.certificateContexts[key.credential] ?? self.tlsContext,
                    clientCertificate: self.certificateContexts[key.credential] != nil,
                    group: self.group,
                    logger: self.logger
                )
            )
            pools[key] = pool
            return pool
        }
    }

    /// Opens one connection per credential to the production endpoint (the override, if set, serves every
    /// environment), at most `timeout` in all; failures are left for the first send to report. A worker
    /// warms up before its first claim, so jobs it claims are not held back by TCP and TLS set-up (and a
    /// rate limit's spacing survives into the requests).
    public func warmUp(credentials: [String], timeout: Duration) async {
        let endpoint = self.configuration.endpointOverride ?? .apple(.production, port: self.configuration.applePort)
        let pools = credentials.filter { self.tokenCaches[$0] != nil || self.certificateContexts[$0] != nil }.map {
            self.pool(for: PoolKey(endpoint: endpoint, credential: $0))
        }
        guard !pools.isEmpty else { return }
        // Whichever comes first: every pool connected (or failed), or the timeout. A connect still under way
        // then goes on by itself and serves the first send.
        let resumed = Mutex(false)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let finish: @Sendable () -> Void = {
                if resumed.withLock({ done in
                    defer { done = true }
                    return !done
                }) {
                    continuation.resume()
                }
            }
            Task {
                await withTaskGroup(of: Void.self) { group in
                    for pool in pools { group.addTask { _ = try? await pool.connection() } }
                }
                finish()
            }
            Task {
                try? await Task.sleep(for: timeout)
                finish()
            }
        }
    }

    /// Provider tokens this process has minted, across credentials (the `jwt_mints` metric).
    public var mintCount: Int {
        self.tokenCaches.values.reduce(0) { $0 + $1.mintCount }
    }

    /// Connections open now, across pools (the `connections` metric).
    public var openConnections: Int {
        self.pools.withLock { Array($0.values) }.reduce(0) { $0 + $1.openCount }
    }

    /// Closes every connection; in-flight requests fail with `connectionReset`.
    public func shutdown() async {
        let pools = self.pools.withLock { pools -> [ConnectionPool] in
            defer { pools.removeAll() }
            return Array(pools.values)
        }
        for pool in pools { await pool.closeAll() }
    }
}
