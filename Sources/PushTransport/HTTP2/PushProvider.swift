import PushCore

/// What a push provider brings to the shared HTTP/2 transport (``PushClient``): how its answers read and
/// what they do to the connection. Everything else — the connection pool, the exchange state machine,
/// deadlines, GOAWAY and the not-processed/unknown split, resends, stream limits, the proxy — is shared.
/// A provider is a folder of its own files (`APNs/`), beside `HTTP2/`.
protocol PushProvider: Sendable {
    /// The provider's answer, parsed from what came off the stream.
    associatedtype Response: Sendable

    /// How errors and logs name the peer ("APNs").
    var peerName: String { get }

    /// The platform whose requests it carries.
    var platform: Platform { get }

    /// Where a warm-up opens its connections.
    var warmUpEndpoint: PushEndpoint { get }

    /// Where a batch of one credential's requests goes and what each is on the wire, or why the batch cannot
    /// go (another platform's request in it, a credential with no account): then each request fails with it.
    func route(_ requests: [ProviderRequest], credential: String) -> Result<RoutedBatch, TransportError>

    /// An answer as the worker reads it.
    func answer(_ response: Response) -> ProviderAnswer

    /// Whether a request header's value is new on (almost) every request: sent literally, never put in
    /// the HPACK dynamic table, so it never evicts the headers that repeat.
    func changesEveryRequest(_ headerName: String) -> Bool

    /// Reads an answer.
    func parse(_ answer: HTTP2Answer) -> Response

    /// The answer's status.
    func status(of response: Response) -> Int

    /// What the transport does about the answer on its connection (the provider's reason table column).
    func connectionEffect(of response: Response) -> ConnectionEffect

    /// The error for a credential with no key, certificate or account configured: names what to set.
    func missingCredential(_ name: String) -> TransportError

    /// Whether the answer proves the credential (`true`: the connection may use the peer's stream limit),
    /// refuses it (`false`: back to one stream), or says nothing (`nil`).
    func credentialAccepted(by response: Response) -> Bool?
}

/// How a credential's requests are authenticated with a bearer token: cached, re-minted once when the
/// peer refuses it, and (APNs) adopted from the fleet when the peer took another worker's first. Tokens
/// travel as their `authorization` header values and are compared as such. Never logged.
protocol RequestAuthenticator: Sendable {
    /// The `authorization` header value to send now.
    func authorization() async throws -> String
    /// The peer refused `rejected` as expired: its replacement (one for all callers holding it).
    func replace(_ rejected: String) async throws -> String
    /// The peer took another worker's token for this credential first: that one, or `nil` (the refusal
    /// stands).
    func adoptShared(rejecting rejected: String) async throws -> String?
}

/// Settings of a connection pool, whichever the provider.
struct PoolConfiguration: Sendable {
    /// Connections per pool.
    var connectionsPerPool: Int
    /// Deadline of one request, from its write to the end of the answer.
    var requestTimeout: Duration
    /// TCP + TLS connect deadline.
    var connectTimeout: Duration
    /// A connection idle this long is PINGed before use.
    var idlePingAfter: Duration
    /// First reconnect backoff after a failed connect; doubles to the maximum.
    var initialReconnectBackoff: Duration
    /// The reconnect backoff cap.
    var maximumReconnectBackoff: Duration
    /// The CONNECT proxy connections go through, unless its `NO_PROXY` list names the host.
    var httpsProxy: HTTPSProxy?
    /// The monotonic clock of the reconnect backoff.
    var clock: any PushClock = ContinuousClock()
}

/// A batch's requests as the shared transport sends them, and the endpoint they go to.
struct RoutedBatch: Sendable {
    var endpoint: PushEndpoint
    var requests: [OutgoingRequest]
}

/// A batch's requests as one provider's own, or why none of it goes.
typealias OwnRequests<Request> = Result<[Request], TransportError>

extension PushProvider {
    /// `requests` as this provider's own (`pick` gives each, or `nil` for another platform's), or the
    /// error that fails the whole batch: the worker groups requests by platform, so a mixed batch is a bug,
    /// and none of it is sent.
    func own<Request>(_ requests: [ProviderRequest], _ pick: (ProviderRequest) -> Request?) -> OwnRequests<Request> {
        var own: [Request] = []
        own.reserveCapacity(requests.count)
        for request in requests {
            guard let mine = pick(request) else {
                return .failure(
                    TransportError(
                        code: .credentialsMissing,
                        mayHaveBeenProcessed: false,
                        message:
                            "a batch for the \(self.platform.providerName) sender held an \(request.platform.providerName) request: none of it was sent"
                    )
                )
            }
            own.append(mine)
        }
        return .success(own)
    }
}

/// One request as the shared transport sends it; `headers` exclude pseudo-headers and `authorization`.
struct OutgoingRequest: Sendable {
    var method: String
    var path: String
    var headers: [(name: String, value: String)]
    var body: [UInt8]
}
