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
            // A token "issued" in the future (a worker whose clock runs fast minted it) would count as
            // fresh for the whole fleet for too long: ignore it, and let it be replaced.
            """
            SELECT jwt, issued_at, expires_at FROM push.provider_tokens
             WHERE team_id = \(teamID) AND key_id = \(keyID) AND issued_at <= now() + interval '60 seconds'
            """,
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
        // Insert, or replace a token minted at least the minimum interval before this one (or one "issued"
        // in the future, or one that has expired whatever its age); either way return the row as it now
        // stands: a token another worker minted moments before this one wins, so both send it. ON CONFLICT
        // sees the newest committed row even when this statement's snapshot predates it (two workers
        // inserting at once), so the answer always comes from the update's RETURNING, never from a second
        // read under the old snapshot.
        let replace = """
            (t.issued_at <= excluded.issued_at - make_interval(secs => \(Double(minimumRefreshInterval)))
             OR t.issued_at > now() + interval '60 seconds' OR t.expires_at <= now())
            """
        let rows = try await self.client.query(
            """
            INSERT INTO push.provider_tokens AS t (team_id, key_id, jwt, issued_at, expires_at)
            VALUES (\(teamID), \(keyID), \(token.jwt), \(token.issuedAt), \(token.expiresAt))
            ON CONFLICT (team_id, key_id) DO UPDATE SET
                jwt = CASE WHEN \(unescaped: replace) THEN excluded.jwt ELSE t.jwt END,
                issued_at = CASE WHEN \(unescaped: replace) THEN excluded.issued_at ELSE t.issued_at END,
                expires_at = CASE WHEN \(unescaped: replace) THEN excluded.expires_at ELSE t.expires_at END
            RETURNING jwt, issued_at, expires_at
            """,
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
        // Compare and swap on the JWT. When another worker replaced it first, the update matches nothing
        // (Postgres re-checks the row it waited for), and a fresh statement reads what that worker stored:
        // a read in the same statement would still see the stale row.
        let rows = try await self.client.query(
            """
            UPDATE push.provider_tokens
               SET jwt = \(token.jwt), issued_at = \(token.issuedAt), expires_at = \(token.expiresAt)
             WHERE team_id = \(teamID) AND key_id = \(keyID) AND jwt = \(stale.jwt)
            RETURNING jwt, issued_at, expires_at
            """,
            logger: self.logger
        )
        for try await (jwt, issuedAt, expiresAt) in rows.decode((String, Date, Date?).self) {
            return ProviderToken(jwt: jwt, issuedAt: issuedAt, expiresAt: expiresAt)
        }
        return try await self.load(teamID: teamID, keyID: keyID)
    }
}
