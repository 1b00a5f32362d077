public import Foundation
import Logging
public import PostgresNIO
public import PushCore

/// `push.provider_tokens`: the provider token of each signing key, shared by every worker process.
public struct ProviderTokenTable: ProviderTokenStore {
    let primary: PrimaryClient
    var client: PostgresClient { self.primary.client }
    let logger: Logger

    /// - Parameters:
    ///   - client: a running client.
    public init(client: PostgresClient, logger: Logger) {
        self.init(primary: PrimaryClient(client), logger: logger)
    }

    /// The table on a client a failover may switch to another host.
    public init(primary: PrimaryClient, logger: Logger) {
        self.primary = primary
        self.logger = logger
    }

    public func load(teamID: String, keyID: String) async throws -> ProviderToken? {
        let rows = try await self.client.query(
            ProviderTokensSQL.load.query {
                $0.bind("team_id", teamID)
                $0.bind("key_id", keyID)
            },
            logger: self.logger
        )
        for try await (jwt, issuedAt, expiresAt) in rows.decode((String, Date, Date?).self) {
            return ProviderToken(jwt: jwt, issuedAt: issuedAt, expiresAt: expiresAt)
        }
        return nil
    }

    public func save(
        _ token: ProviderToken,
        teamID: String,
        keyID: String,
        minimumRefreshInterval: TimeInterval
    ) async throws -> ProviderToken {
        // Insert, or replace a token minted at least the minimum interval before this one; the row as it now
        // stands comes back (`provider_tokens.sql`, save).
        let rows = try await self.client.query(
            ProviderTokensSQL.save.query {
                $0.bind("team_id", teamID)
                $0.bind("key_id", keyID)
                $0.bind("jwt", token.jwt)
                $0.bind("issued_at", token.issuedAt)
                $0.bind("expires_at", token.expiresAt)
                $0.bind("minimum_refresh_seconds", Double(minimumRefreshInterval))
            },
            logger: self.logger
        )
        for try await (jwt, issuedAt, expiresAt) in rows.decode((String, Date, Date?).self) {
            return ProviderToken(jwt: jwt, issuedAt: issuedAt, expiresAt: expiresAt)
        }
        return token
    }

    public func replace(
        _ stale: ProviderToken,
        with token: ProviderToken,
        teamID: String,
        keyID: String
    ) async throws -> ProviderToken? {
        // Compare and swap on the JWT; when another worker replaced it first, what it stored is read afresh.
        let rows = try await self.client.query(
            ProviderTokensSQL.replace.query {
                $0.bind("team_id", teamID)
                $0.bind("key_id", keyID)
                $0.bind("jwt", token.jwt)
                $0.bind("issued_at", token.issuedAt)
                $0.bind("expires_at", token.expiresAt)
                $0.bind("stale_jwt", stale.jwt)
            },
            logger: self.logger
        )
        for try await (jwt, issuedAt, expiresAt) in rows.decode((String, Date, Date?).self) {
            return ProviderToken(jwt: jwt, issuedAt: issuedAt, expiresAt: expiresAt)
        }
        return try await self.load(teamID: teamID, keyID: keyID)
    }
}

/// The statements of `Statements/provider_tokens.sql`, with their binds in order.
enum ProviderTokensSQL: StatementFile {
    static let file = "provider_tokens"

    static let load = named("load", "team_id", "key_id")
    static let save = named("save", "team_id", "key_id", "jwt", "issued_at", "expires_at", "minimum_refresh_seconds")
    static let replace = named("replace", "team_id", "key_id", "jwt", "issued_at", "expires_at", "stale_jwt")

    static let all = [load, save, replace]
}
