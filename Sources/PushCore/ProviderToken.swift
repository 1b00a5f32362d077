public import Foundation

/// An ES256 provider token (JWT) for one signing key, and when it was minted. Never log the JWT.
public struct ProviderToken: Sendable, Hashable {
    /// The compact JWT.
    public var jwt: String
    /// When it was minted (`iat`, whole seconds).
    public var issuedAt: Date
    /// When it stops being accepted, for a token whose issuer says (an FCM access token's `expires_in`);
    /// `nil` for an APNs provider token, whose rule is its age.
    public var expiresAt: Date?

    /// Wraps a token.
    public init(jwt: String, issuedAt: Date, expiresAt: Date? = nil) {
        self.jwt = jwt
        self.issuedAt = issuedAt
        self.expiresAt = expiresAt
    }
}

/// Where worker processes share their provider tokens, so a fleet mints one token per key per
/// refresh instead of one per process (a known cause of TooManyProviderTokenUpdates).
public protocol ProviderTokenStore: Sendable {
    /// The newest token stored for a key, if any.
    func load(teamID: String, keyID: String) async throws -> ProviderToken?
    /// Stores `token` unless the stored one was minted less than `minimumRefreshInterval` before it, or
    /// after it; returns the one that is stored now.
    ///
    /// The first of concurrent mints wins: two processes that both found no token and both minted one must
    /// end up sending the same token, since APNs refuses a second token for a key within 20 minutes of the
    /// first (TooManyProviderTokenUpdates) and keeps refusing it.
    func save(
        _ token: ProviderToken,
        teamID: String,
        keyID: String,
        minimumRefreshInterval: TimeInterval
    ) async throws -> ProviderToken
    /// Replaces `stale` with `token` only if `stale` is still the one stored (another process may have
    /// replaced it meanwhile); returns the one stored now, or `nil` if none is. For a stored token this
    /// process cannot use at all (signed by another key under the same key id), whatever its age.
    func replace(
        _ stale: ProviderToken,
        with token: ProviderToken,
        teamID: String,
        keyID: String
    ) async throws -> ProviderToken?
}
