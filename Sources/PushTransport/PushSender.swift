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

/// What a worker sends through, one per platform: APNs' client and FCM's implement it, and the worker holds
/// them by ``platform`` (as APNSwift's `APNSClientProtocol` gives every transport one `send`).
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

extension PushSender {
    /// A typed client's `sendBatch` (APNs' requests, FCM's messages): through the worker's own path, this
    /// protocol's `sendBatch`, its answers unwrapped (an answer of another kind, which a sender never gives, is
    /// a failure).
    func sendBatch<Answer>(
        wrapping requests: [ProviderRequest],
        credential: String,
        mayWrite: @escaping @Sendable () -> Bool,
        withdraws: (@Sendable (_ index: Int) -> Bool)?,
        unwrap: @escaping @Sendable (ProviderAnswer) -> Answer?,
        onResult: @escaping @Sendable (_ index: Int, _ result: Result<Answer, any Error>) -> Void
    ) async {
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
                                message: "\(self.platform.providerName) gave an answer of another provider's kind"
                            )
                        )
                }
            )
        }
    }

    /// `requests` as this platform's own, or `nil` once each has failed: a sender takes one platform's
    /// requests (the worker groups them by platform), and a batch holding another's is sent not at all.
    func own<Request>(
        _ requests: [ProviderRequest],
        _ pick: (ProviderRequest) -> Request?,
        onResult: @Sendable (_ index: Int, _ result: Result<ProviderAnswer, any Error>) -> Void
    ) -> [Request]? {
        var own: [Request] = []
        own.reserveCapacity(requests.count)
        for request in requests {
            guard let mine = pick(request) else {
                let error = TransportError(
                    code: .credentialsMissing,
                    mayHaveBeenProcessed: false,
                    message:
                        "a \(request.platform.providerName) request reached the \(self.platform.providerName) sender: its batch was not sent"
                )
                for index in requests.indices { onResult(index, .failure(error)) }
                return nil
            }
            own.append(mine)
        }
        return own
    }
}

extension APNsClient: PushSender {
    public var platform: Platform { .apns }

    /// Straight to the engine, as the typed `sendBatch` does: the seam adds no step to a job's path.
    public func sendBatch(
        _ requests: [ProviderRequest],
        credential: String,
        mayWrite: @escaping @Sendable () -> Bool,
        withdraws: (@Sendable (_ index: Int) -> Bool)?,
        onResult: @escaping @Sendable (_ index: Int, _ result: Result<ProviderAnswer, any Error>) -> Void
    ) async {
        guard
            let own: [APNsRequest] = self.own(
                requests,
                { request in if case .apns(let apns) = request { apns } else { nil } },
                onResult: onResult
            ),
            let environment = own.first?.environment
        else { return }
        await self.engine.sendBatch(
            own.map { OutgoingRequest(method: $0.method, path: $0.path, headers: $0.headers, body: $0.body) },
            endpoint: self.endpoint(for: environment),
            credential: credential,
            mayWrite: mayWrite,
            withdraws: withdraws
        ) { index, result in
            onResult(index, result.map { ProviderAnswer.apns($0) })
        }
    }
}

extension FCMClient: PushSender {
    public var platform: Platform { .fcm }

    /// Straight to the engine, as the typed `sendBatch` does: the seam adds no step to a job's path.
    public func sendBatch(
        _ requests: [ProviderRequest],
        credential: String,
        mayWrite: @escaping @Sendable () -> Bool,
        withdraws: (@Sendable (_ index: Int) -> Bool)?,
        onResult: @escaping @Sendable (_ index: Int, _ result: Result<ProviderAnswer, any Error>) -> Void
    ) async {
        guard
            let own: [FCMMessage] = self.own(
                requests,
                { request in if case .fcm(let message) = request { message } else { nil } },
                onResult: onResult
            ),
            !own.isEmpty
        else { return }
        guard let project = self.project(of: credential) else {
            let error = FCMProvider().missingCredential(credential)
            for index in own.indices { onResult(index, .failure(error)) }
            return
        }
        await self.engine.sendBatch(
            own.map { self.outgoing($0, project: project) },
            endpoint: self.endpoint,
            credential: credential,
            mayWrite: mayWrite,
            withdraws: withdraws
        ) { index, result in
            onResult(index, result.map { ProviderAnswer.fcm($0) })
        }
    }
}
