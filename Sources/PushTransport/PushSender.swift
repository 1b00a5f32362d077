public import PushCore

/// A request to any provider, as the worker sends it.
public enum ProviderRequest: Sendable {
    case apns(APNsRequest)
    case fcm(FCMMessage)

    /// The platform it goes to.
    public var platform: Platform {
        switch self {
        case .apns: .apns
        case .fcm: .fcm
        }
    }
}

/// A provider's answer to a ``ProviderRequest``.
public enum ProviderAnswer: Sendable {
    case apns(APNsResponse)
    case fcm(FCMResponse)
}

/// What a worker sends through, one per platform: the send engine with APNs' provider and with FCM's
/// implements it (``APNsClient/sender`` and ``FCMClient/sender``), and the worker holds them by ``platform``
/// (as APNSwift's `APNSClientProtocol` gives every transport one `send`).
public protocol PushSender: Sendable {
    /// The platform whose requests it sends.
    var platform: Platform { get }
    /// The credentials it can sign for, sorted: what its worker may claim for this platform.
    var credentialNames: [String] { get }
    /// Requests the provider certainly did not process, resent or given back (a metric).
    var notProcessedCount: Int { get }
    /// Connections open now (a metric).
    var openConnections: Int { get }

    /// Opens one connection per credential, at most `timeout` in all; failures are left for the first send.
    func warmUp(credentials: [String], timeout: Duration) async

    /// Sends requests of one credential (and, for APNs, one environment) with the engine's rules for each:
    /// each answer is handed to `onResult` with its index as it arrives; returns when every request has its
    /// result. A batch holding another platform's request is not sent: each of its requests fails
    /// (``TransportError/Code/credentialsMissing``).
    ///
    /// - Parameters:
    ///   - mayWrite: asked just before a group of requests is written; `false` withdraws the batch's
    ///     remaining ones unsent.
    ///   - withdraws: asked for each request just before it is written; `true` withdraws it alone, unsent.
    func sendBatch(
        _ requests: [ProviderRequest],
        credential: String,
        mayWrite: @escaping @Sendable () -> Bool,
        withdraws: (@Sendable (_ index: Int) -> Bool)?,
        onResult: @escaping @Sendable (_ index: Int, _ result: Result<ProviderAnswer, any Error>) -> Void
    ) async
}

extension PushClient: PushSender {
    var platform: Platform { self.provider.platform }

    var credentialNames: [String] {
        Set(self.authenticators.keys).union(self.certificateContexts.keys).sorted()
    }

    func warmUp(credentials: [String], timeout: Duration) async {
        await self.warmUp(credentials: credentials, endpoint: self.provider.warmUpEndpoint, timeout: timeout)
    }

    /// The worker's way in: the provider routes the batch (its endpoint, each request on the wire), and the
    /// engine sends it. The seam is this engine, so it adds no step to a job's path.
    func sendBatch(
        _ requests: [ProviderRequest],
        credential: String,
        mayWrite: @escaping @Sendable () -> Bool,
        withdraws: (@Sendable (_ index: Int) -> Bool)?,
        onResult: @escaping @Sendable (_ index: Int, _ result: Result<ProviderAnswer, any Error>) -> Void
    ) async {
        let provider = self.provider
        switch provider.route(requests, credential: credential) {
        case .failure(let error):
            for index in requests.indices { onResult(index, .failure(error)) }
        case .success(let routed):
            await self.sendBatch(
                routed.requests,
                endpoint: routed.endpoint,
                credential: credential,
                mayWrite: mayWrite,
                withdraws: withdraws
            ) { index, result in
                onResult(index, result.map(provider.answer))
            }
        }
    }

    /// A typed client's `sendBatch` (APNs' requests, FCM's messages): the worker's own path, its answers
    /// unwrapped (an answer of another kind, which the engine never gives, is a failure).
    func sendBatch<Answer>(
        wrapping requests: [ProviderRequest],
        credential: String,
        mayWrite: @escaping @Sendable () -> Bool,
        withdraws: (@Sendable (_ index: Int) -> Bool)?,
        unwrap: @escaping @Sendable (ProviderAnswer) -> Answer?,
        onResult: @escaping @Sendable (_ index: Int, _ result: Result<Answer, any Error>) -> Void
    ) async {
        let peerName = self.provider.peerName
        await self.sendBatch(requests, credential: credential, mayWrite: mayWrite, withdraws: withdraws) {
            index,
            result in
            onResult(
                index,
                result.flatMap { answer in
                    unwrap(answer).map { .success($0) }
                        ?? .failure(
                            TransportError(
                                code: .connectionReset,
                                mayHaveBeenProcessed: true,
                                message: "\(peerName) gave an answer of another provider's kind"
                            )
                        )
                }
            )
        }
    }
}
