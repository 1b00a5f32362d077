import Foundation
import PushCore

/// APNs as a provider of the shared HTTP/2 engine: its answers (``APNsResponse``), what they do to the
/// connection (the ``APNsReason`` table's `connection` column), which request headers change on every
/// request, and the sentence for a credential with nothing configured.
struct APNsProvider: PushProvider {
    var peerName: String { "APNs" }

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
