import NIOCore
import NIOSSL
import Synchronization

/// The engine's connections: TLS for them, a pool per (endpoint, credential), warming up, the token exchange
/// that needs no bearer token, and shutting down.
extension PushClient {
    /// TLS for a provider's connections: ALPN `h2`, TLS 1.2 or later, the system's roots and the PEM file
    /// `caFile` (named by `flag` in the error) on top. Verification is never switched off.
    static func clientTLS(caFile: String?, flag: String) throws -> TLSConfiguration {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.applicationProtocols = ["h2"]
        tls.minimumTLSVersion = .tlsv12
        if let caFile {
            do {
                tls.additionalTrustRoots = [.certificates(try NIOSSLCertificate.fromPEMFile(caFile))]
            } catch {
                throw TransportError(
                    code: .connectFailed,
                    mayHaveBeenProcessed: false,
                    message: "\(flag) \(caFile) is not a readable PEM certificate file: \(error)"
                )
            }
        }
        return tls
    }

    /// A TLS context, or the error that says TLS could not be set up.
    static func context(_ tls: TLSConfiguration) throws -> NIOSSLContext {
        do {
            return try NIOSSLContext(configuration: tls)
        } catch {
            throw TransportError(
                code: .connectFailed,
                mayHaveBeenProcessed: false,
                message: "could not set up TLS: \(error)"
            )
        }
    }

    /// Sends one request that carries no bearer token (an OAuth token exchange) to `endpoint`, on a pool of
    /// its own through the same TLS trust, proxy and deadlines; no in-call rules.
    func exchange(_ request: OutgoingRequest, endpoint: PushEndpoint) async throws -> HTTP2Answer {
        let connection = try await self.pool(for: PoolKey(endpoint: endpoint, credential: "")).connection()
        return try await connection.send(
            method: request.method,
            path: request.path,
            headers: request.headers,
            body: request.body,
            authorization: nil,
            deadline: self.configuration.requestTimeout
        )
    }

    func pool(for key: PoolKey) -> ConnectionPool {
        self.pools.withLock { pools in
            if let pool = pools[key] { return pool }
            let provider = self.provider
            let pool = ConnectionPool(
                endpoint: key.endpoint,
                context: .init(
                    configuration: self.configuration,
                    peer: provider.peerName,
                    changesEveryRequest: { provider.changesEveryRequest($0) },
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

    /// Opens one connection per credential to `endpoint`, at most `timeout` in all; failures are left for
    /// the first send to report.
    func warmUp(credentials: [String], endpoint: PushEndpoint, timeout: Duration) async {
        let pools = credentials.filter(self.knows).map { self.pool(for: PoolKey(endpoint: endpoint, credential: $0)) }
        guard !pools.isEmpty else { return }
        // Whichever comes first: every pool connected (or failed), or the timeout. A connect still under way
        // then goes on by itself (an unstructured task, not cancelled) and serves the first send.
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

    /// Connections open now, across pools (the `connections` metric).
    var openConnections: Int {
        self.pools.withLock { Array($0.values) }.reduce(0) { $0 + $1.openCount }
    }

    /// Closes every connection; in-flight requests fail with `connectionReset`.
    func shutdown() async {
        let pools = self.pools.withLock { pools -> [ConnectionPool] in
            defer { pools.removeAll() }
            return Array(pools.values)
        }
        for pool in pools { await pool.closeAll() }
    }
}
