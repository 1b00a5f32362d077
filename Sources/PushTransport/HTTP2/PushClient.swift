import Logging
import NIOCore
import NIOSSL
import PushCore
import Synchronization

/// The send engine every provider shares: a small fixed pool of HTTP/2 connections per (endpoint,
/// credential), requests written in batches on raw frames (``FrameExchange``), and the in-call rules. A
/// provider (``PushProvider``) says how its answers read and what they do to the connection; an
/// authenticator (``RequestAuthenticator``) per credential gives the bearer token.
///
/// Within one call it resends at once what the peer certainly did not process (refused before sending,
/// above a GOAWAY's last stream id), and acts once on an answer whose ``ConnectionEffect`` asks it (re-mint
/// or adopt the token, open a new connection). Everything else comes back to the caller: an answer to
/// classify, or a ``TransportError`` to retry durably.
final class PushClient<Provider: PushProvider>: Sendable {
    typealias Response = Provider.Response

    let provider: Provider
    let configuration: PoolConfiguration
    /// Bearer-token credentials by name.
    let authenticators: [String: any RequestAuthenticator]
    /// TLS for connections without a client certificate.
    let tlsContext: NIOSSLContext
    /// Certificate credentials: each has its own TLS context carrying its client certificate.
    let certificateContexts: [String: NIOSSLContext]
    let group: any EventLoopGroup
    let logger: Logger
    /// The pools by (endpoint, credential), opened on first use.
    let pools = Mutex<[PoolKey: ConnectionPool]>([:])

    /// One pool per (endpoint, credential).
    struct PoolKey: Hashable {
        var endpoint: PushEndpoint
        var credential: String
    }

    init(
        provider: Provider,
        configuration: PoolConfiguration,
        authenticators: [String: any RequestAuthenticator],
        tlsContext: NIOSSLContext,
        certificateContexts: [String: NIOSSLContext],
        group: any EventLoopGroup,
        logger: Logger
    ) {
        // Watching from now on: a stall is only seen by a detector that was running through it.
        _ = StallDetector.shared
        self.provider = provider
        self.configuration = configuration
        self.authenticators = authenticators
        self.tlsContext = tlsContext
        self.certificateContexts = certificateContexts
        self.group = group
        self.logger = logger
    }

    /// The one result of a batch of one: `send` is handed the `onResult` its batch calls.
    static func single<R: Sendable>(
        _ send: (_ onResult: @escaping @Sendable (Int, Result<R, any Error>) -> Void) async -> Void
    ) async throws -> R {
        let answer = Mutex<Result<R, any Error>?>(nil)
        await send { _, result in answer.withLock { $0 = result } }
        guard let result = answer.withLock({ $0 }) else { throw TransportError.withdrawn }
        return try result.get()
    }

    /// Whether `credential` has a token or a certificate here.
    func knows(_ credential: String) -> Bool {
        self.authenticators[credential] != nil || self.certificateContexts[credential] != nil
    }

    /// Requests the peer certainly did not process, resent or given back (the `requests_not_processed`
    /// metric).
    var notProcessedCount: Int { self.notProcessed.withLock { $0 } }
    private let notProcessed = Mutex(0)

    /// Runs a token operation; a caller cancelled while it waited (a shutdown past its grace, behind a slow
    /// mint) gets ``TransportError/withdrawn``: nothing was sent, and the job goes back uncounted, never as an
    /// unknown outcome.
    static func unsentIfCancelled<T>(_ operation: () async throws -> T) async throws -> T {
        do {
            return try await operation()
        } catch is CancellationError {
            throw TransportError.withdrawn
        }
    }

    /// Sends requests of one endpoint and credential (one request is a batch of one), with the in-call rules
    /// (``InCallRules``) for each: stream slots are taken as many at a time as are free, requests go to the
    /// event loop in one hop per connection and are flushed together, and each answer is handed to `onResult`
    /// on the event loop as it arrives. An answer the rules act on (a token to re-mint or adopt, a connection
    /// to replace, a request the peer did not process) goes back into the same loop, which does what the rule
    /// says and writes the request again. Returns when every request has its result.
    ///
    /// - Parameters:
    ///   - mayWrite: asked once per group of requests, once their stream slots are granted and just before
    ///     they are written; `false` withdraws them and all the batch's remaining ones unsent
    ///     (``TransportError/Code/shutdown``).
    ///   - withdraws: asked for each request just before it is written, once its slot is granted; `true`
    ///     withdraws that request alone, unsent (a job cancelled meanwhile).
    ///   - onResult: called exactly once per request, with its index in `requests`.
    func sendBatch(
        _ requests: [OutgoingRequest],
        endpoint: PushEndpoint,
        credential: String,
        mayWrite: @escaping @Sendable () -> Bool,
        withdraws: (@Sendable (_ index: Int) -> Bool)? = nil,
        onResult: @escaping @Sendable (_ index: Int, _ result: Result<Response, any Error>) -> Void
    ) async {
        guard !requests.isEmpty else { return }
        guard self.knows(credential) else {
            let error = self.provider.missingCredential(credential)
            for index in requests.indices { onResult(index, .failure(error)) }
            return
        }
        let authenticator = self.authenticators[credential]
        let pool = self.pool(for: PoolKey(endpoint: endpoint, credential: credential))
        let batch = Batch(
            count: requests.count,
            engine: self,
            pool: pool,
            bearer: authenticator != nil,
            onResult: onResult
        )
        // A caller that gives up (a drain past its grace period) cancels the batch wherever this task waits:
        // requests in flight are reset, and the rest are withdrawn.
        await withTaskCancellationHandler {
            await self.submit(
                requests,
                batch: batch,
                pool: pool,
                authenticator: authenticator,
                credential: credential,
                mayWrite: mayWrite,
                withdraws: withdraws
            )
            await batch.waitForAll()
        } onCancel: {
            batch.cancel()
        }
    }

    /// Counts requests the peer certainly did not process.
    func countNotProcessed(_ count: Int) { self.notProcessed.withLock { $0 += count } }

    /// Does what the in-call rules said for a request's answer, in the batch's own loop: returns the
    /// request's index to write it again, or `nil` once it has its result.
    private func redo(
        _ redo: Batch.Redo,
        batch: Batch,
        pool: ConnectionPool,
        authenticator: (any RequestAuthenticator)?,
        credential: String
    ) async -> Int? {
        let (step, index, sent, answer, onResult) = (redo.step, redo.index, redo.sent, redo.answer, batch.onResult)
        guard !batch.isCancelled && !Task.isCancelled else {
            // Nothing more goes out: the answer in hand was a refusal, so the job goes back uncounted.
            onResult(index, .failure(TransportError.withdrawn))
            return nil
        }
        do {
            switch step {
            case .reMintToken:
                if let authenticator, let used = sent.authorization {
                    _ = try await Self.unsentIfCancelled { try await authenticator.replace(used) }
                }
            case .adoptSharedToken:
                // The peer took another process's token for this key first: send with that one, once. A
                // refusal is not a delivery, so the resend cannot deliver twice.
                if let authenticator, let used = sent.authorization,
                    try await Self.unsentIfCancelled({ try await authenticator.adoptShared(rejecting: used) })
                        != nil
                {
                    // On a new connection: the peer may count a token change on one connection as an update.
                    self.countNotProcessed(1)
                    self.logger.warning(
                        "\(self.provider.peerName) took another worker's token for this credential first; sending with that one",
                        metadata: ["push.credential": "\(credential)"]
                    )
                    await pool.discard(sent.connection)
                } else if case .success(let response) = answer {
                    // No other token to adopt: the answer is the job's.
                    sent.connection.limiter.noteCredential(accepted: self.provider.credentialAccepted(by: response))
                    onResult(index, .success(response))
                    return nil
                }
            case .reconnect:
                await pool.discard(sent.connection)
            case .resend:
                if !sent.connection.isUsable { await pool.discard(sent.connection) }
            case .deliver, .fail:
                break
            }
        } catch {
            onResult(index, .failure(error))
            return nil
        }
        return index
    }

    /// ``sendBatch``'s loop: takes slots, writes, until every request is written or given its reason not
    /// to be, then writes again each one the in-call rules send back, until every request has its result.
    private func submit(
        _ requests: [OutgoingRequest],
        batch: Batch,
        pool: ConnectionPool,
        authenticator: (any RequestAuthenticator)?,
        credential: String,
        mayWrite: @escaping @Sendable () -> Bool,
        withdraws: (@Sendable (_ index: Int) -> Bool)?
    ) async {
        let onResult = batch.onResult
        var waiting = Array(requests.indices)[...]
        var failedRounds = 0
        // A request the rules send again goes out on a new connection where the pool has room for one (the old
        // one was discarded, or may be bound to another key): the round after it waits for the new one.
        var fresh = false
        while true {
            // Requests the rules send again, all that are queued, each after its rule's step (a token re-minted
            // or adopted, a connection discarded); when every request is written, wait for one or for the end.
            var redos = batch.takeRedos()
            if waiting.isEmpty && redos.isEmpty {
                guard let work = await batch.nextRedo() else { return }
                redos = [work]
            }
            for work in redos {
                if let index = await self.redo(
                    work,
                    batch: batch,
                    pool: pool,
                    authenticator: authenticator,
                    credential: credential
                ) {
                    waiting.append(index)
                    fresh = true
                }
                batch.redoTaken()
            }
            if waiting.isEmpty { continue }
            let stop: TransportError?
            do {
                let connection = try await pool.connection(waitForNew: fresh)
                fresh = false
                let authorization = try await Self.unsentIfCancelled { try await authenticator?.authorization() }
                let granted = await connection.limiter.acquire(upTo: waiting.count)
                if granted == 0 {
                    // The connection closed (or this task was cancelled) before a slot came free.
                    if Task.isCancelled {
                        stop = TransportError.withdrawn
                    } else {
                        // Each waiting request was refused a stream, as each would have been on its own.
                        self.countNotProcessed(waiting.count)
                        if !connection.isUsable { await pool.discard(connection) }
                        failedRounds += 1
                        stop =
                            failedRounds > InCallRules.maximumResends
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
                    self.countNotProcessed(granted)
                    await pool.discard(connection)
                    failedRounds += 1
                    stop = failedRounds > InCallRules.maximumResends ? TransportError.notSentGoingAway : nil
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
                    batch.sending(chunk, on: connection, authorization: authorization)
                    // Straight to the connection's frame exchange: one hop to its event loop, one flush. (The
                    // connection's idle clock needs no touch here: it reads busy while slots are held, and
                    // the exchange touches it when it gives them back.)
                    connection.exchange.submit(
                        chunk.map { index in
                            let request = requests[index]
                            return (
                                index,
                                connection.requestHeaders(
                                    method: request.method,
                                    path: request.path,
                                    headers: request.headers,
                                    bodyCount: request.body.count,
                                    authorization: authorization
                                ),
                                request.body
                            )
                        },
                        to: batch,
                        timeout: self.configuration.requestTimeout
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
}
