public import Foundation
public import PushCore
import Synchronization

/// One OAuth 2.0 access token per FCM service account, shared by every connection of the process and,
/// through an optional ``ProviderTokenStore`` (Postgres in the daemon), by every worker: the first worker to
/// need one exchanges the account's signed JWT at its `token_uri` and stores the token; the others adopt it.
/// Refreshed 5 minutes before it expires, replaced once when FCM answers 401, never logged.
public final class AccessTokenCache: Sendable {
    /// A granted token: what the exchange returned.
    public struct Grant: Sendable, Hashable {
        /// The bearer token.
        public var token: String
        /// When it was granted (the exchange's start, on the wall clock).
        public var grantedAt: Date
        /// How long it lives (`expires_in`).
        public var lifetime: TimeInterval

        public init(token: String, grantedAt: Date, lifetime: TimeInterval) {
            self.token = token
            self.grantedAt = grantedAt
            self.lifetime = lifetime
        }
    }

    /// Exchanges a signed assertion for a grant; throws ``TransportError`` (`credentialRefused` when the
    /// endpoint refuses the account, `connectFailed` when it cannot be reached or fails).
    public typealias Exchange = @Sendable (_ account: ServiceAccount, _ assertion: String) async throws -> Grant

    /// How long before its expiry a token is replaced.
    public static let refreshMargin: TimeInterval = 300
    /// The lifetime assumed for a token adopted from the store without an expiry (Google's: one hour).
    public static let sharedLifetime: TimeInterval = 3600

    public let account: ServiceAccount
    let exchange: Exchange
    let store: (any ProviderTokenStore)?
    /// The process's clock: a grant's age, on the wall clock.
    let clock: any PushClock
    private let current = Mutex<Grant?>(nil)
    private let exchanges = Mutex(0)
    private let refreshLock = AsyncLock()

    /// - Parameters:
    ///   - store: where worker processes share tokens; `nil` keeps them in this process.
    ///   - clock: the process's clock.
    public init(
        account: ServiceAccount,
        store: (any ProviderTokenStore)? = nil,
        clock: any PushClock,
        exchange: @escaping Exchange
    ) {
        self.account = account
        self.store = store
        self.clock = clock
        self.exchange = exchange
    }

    /// How many exchanges this process made.
    public var exchangeCount: Int { self.exchanges.withLock { $0 } }

    /// The store's key for the account: FCM tokens live beside APNs ones, under a team id no Apple team has.
    var storeKey: (team: String, key: String) { ("fcm:" + self.account.projectID, self.account.clientEmail) }

    /// The token to send now.
    public func token() async throws -> Grant {
        if let fresh = self.fresh() { return fresh }
        return try await self.refreshLock.withLock {
            if let fresh = self.fresh() { return fresh }
            return try await self.refresh(rejected: nil)
        }
    }

    /// FCM answered 401 for `rejected`: replace it once (every caller holding it gets the one replacement).
    public func replaceToken(_ rejected: String) async throws -> Grant {
        try await self.refreshLock.withLock {
            if let current = self.current.withLock({ $0 }), current.token != rejected,
                self.isFresh(current)
            {
                return current
            }
            return try await self.refresh(rejected: rejected)
        }
    }

    /// A token from the store as a grant: it lives until its stored expiry, or (stored by a worker from before
    /// schema 15) an hour, Google's lifetime.
    static func grant(_ stored: ProviderToken) -> Grant {
        Grant(
            token: stored.jwt,
            grantedAt: stored.issuedAt,
            lifetime: stored.expiresAt.map { max(0, $0.timeIntervalSince(stored.issuedAt)) } ?? Self.sharedLifetime
        )
    }

    /// Younger than its lifetime less the margin (5 minutes, or half a lifetime shorter than 10 minutes).
    private func isFresh(_ grant: Grant) -> Bool {
        self.clock.wallNow.timeIntervalSince(grant.grantedAt) < grant.lifetime
            - min(Self.refreshMargin, grant.lifetime / 2)
    }

    private func fresh() -> Grant? {
        guard let current = self.current.withLock({ $0 }), self.isFresh(current) else { return nil }
        return current
    }

    /// Under the refresh lock: adopt the fleet's token if it is fresh and not the rejected one, else exchange
    /// and share a new one (the first stored wins).
    private func refresh(rejected: String?) async throws -> Grant {
        let (team, key) = self.storeKey
        var stale: ProviderToken?
        if let store = self.store, let shared = try? await store.load(teamID: team, keyID: key) {
            let grant = Self.grant(shared)
            if shared.jwt != rejected && self.isFresh(grant) {
                self.current.withLock { $0 = grant }
                return grant
            }
            stale = shared
        }
        let issuedAt = self.clock.wallNow
        let assertion: String
        do {
            assertion = try self.account.assertion(issuedAt: issuedAt)
        } catch {
            throw TransportError(
                code: .credentialRefused,
                mayHaveBeenProcessed: false,
                message: "could not sign the FCM access token request for \(self.account): \(error)"
            )
        }
        var grant = try await self.exchange(self.account, assertion)
        self.exchanges.withLock { $0 += 1 }
        if let store = self.store {
            let token = ProviderToken(
                jwt: grant.token,
                issuedAt: grant.grantedAt,
                expiresAt: grant.grantedAt.addingTimeInterval(grant.lifetime)
            )
            var stored: ProviderToken?
            if let stale {
                stored = try? await store.replace(stale, with: token, teamID: team, keyID: key)
            } else {
                // A token stored by another worker meanwhile wins (any age under a minute apart).
                // (A quarter of a lifetime shorter than 4 minutes: a short-lived token is not kept for
                // longer than it lives.)
                stored = try? await store.save(
                    token,
                    teamID: team,
                    keyID: key,
                    minimumRefreshInterval: min(60, grant.lifetime / 4)
                )
            }
            if let stored, stored.jwt != grant.token, stored.jwt != rejected {
                let adopted = Self.grant(stored)
                if self.isFresh(adopted) { grant = adopted }
            }
        }
        self.current.withLock { $0 = grant }
        return grant
    }
}

/// An access token as the engine's bearer authorization (`Bearer <token>`).
extension AccessTokenCache: RequestAuthenticator {
    func authorization() async throws -> String {
        "Bearer " + (try await self.token()).token
    }

    func replace(_ rejected: String) async throws -> String {
        "Bearer " + (try await self.replaceToken(String(rejected.dropFirst("Bearer ".count)))).token
    }

    /// FCM has no answer that asks for another worker's token.
    func adoptShared(rejecting rejected: String) async throws -> String? { nil }
}
