import Foundation
import PushCore

/// APNs as a provider of the shared HTTP/2 engine: its answers (``APNsResponse``), what they do to the
/// connection (the ``APNsReason`` table's `connection` column), which request headers change on every
/// request, where each environment's requests go, and the sentence for a credential with nothing configured.
struct APNsProvider: PushProvider {
    /// One endpoint for both environments (a stand-in); `nil` for Apple's hosts.
    var endpointOverride: APNsEndpoint? = nil
    /// The development environment's own endpoint; `nil` uses ``endpointOverride``.
    var developmentEndpointOverride: APNsEndpoint? = nil
    /// The port of Apple's send hosts (443 or 2197).
    var applePort = 443

    var peerName: String { "APNs" }

    var platform: Platform { .apns }

    /// Where a request for `environment` goes.
    func endpoint(for environment: APNsEnvironment) -> APNsEndpoint {
        (environment == .development ? self.developmentEndpointOverride : nil)
            ?? self.endpointOverride ?? .apple(environment, port: self.applePort)
    }

    /// The production endpoint (an override, if set, serves every environment).
    var warmUpEndpoint: PushEndpoint { self.endpoint(for: .production) }

    /// A batch is one environment's (the worker groups them so): the first request's names the endpoint.
    func route(_ requests: [ProviderRequest], credential: String) -> Result<RoutedBatch, TransportError> {
        self.own(requests) { request in if case .apns(let apns) = request { apns } else { nil } }.map { own in
            RoutedBatch(
                endpoint: self.endpoint(for: own.first?.environment ?? .production),
                requests: own.map {
                    OutgoingRequest(method: $0.method, path: $0.path, headers: $0.headers, body: $0.body)
                }
            )
        }
    }

    func answer(_ response: APNsResponse) -> ProviderAnswer { .apns(response) }

    /// `apns-id`, `apns-expiration` and `apns-request-id` are new on (almost) every request. (Plain
    /// comparisons: a set lookup hashes the name on every header of every request.)
    func changesEveryRequest(_ headerName: String) -> Bool {
        headerName == "apns-id" || headerName == "apns-expiration" || headerName == "apns-request-id"
    }

    func parse(_ answer: HTTP2Answer) -> APNsResponse { APNsResponse(answer) }

    func status(of response: APNsResponse) -> Int { response.status }

    func connectionEffect(of response: APNsResponse) -> ConnectionEffect { response.connectionEffect }

    func credentialAccepted(by response: APNsResponse) -> Bool? { response.credentialAccepted }

    func missingCredential(_ name: String) -> TransportError {
        TransportError(
            code: .credentialsMissing,
            mayHaveBeenProcessed: false,
            message:
                "no APNs signing key or certificate is configured for credential '\(name)': set APNS_KEY_ID, APNS_TEAM_ID and APNS_KEY_PATH, or name it in the config file"
        )
    }
}

/// A signing key's provider tokens as the engine's bearer authorization (`bearer <jwt>`).
extension ProviderTokenCache: RequestAuthenticator {
    func authorization() async throws -> String {
        "bearer " + (try await self.token()).jwt
    }

    func replace(_ rejected: String) async throws -> String {
        "bearer " + (try await self.replace(jwt: String(rejected.dropFirst("bearer ".count)))).jwt
    }

    func adoptShared(rejecting rejected: String) async throws -> String? {
        try await self.adoptShared(rejectingJWT: String(rejected.dropFirst("bearer ".count))).map { "bearer " + $0.jwt }
    }
}
