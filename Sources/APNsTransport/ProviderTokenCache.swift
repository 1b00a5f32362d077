public import Foundation
import Synchronization

/// One provider token per signing key, shared by every connection: minted lazily, reused for
/// ``Configuration-swift.struct/reuseFor`` (~50 minutes), never re-minted sooner than
/// ``Configuration-swift.struct/minimumRefreshInterval`` (20 minutes) except once for an
/// `ExpiredProviderToken`, and then only by the first of many concurrent callers.
public final class ProviderTokenCache: Sendable {
    /// Token lifetime rules.
    public struct Configuration: Sendable {
        /// How long a token is reused (Apple rejects one older than 60 minutes).
        public var reuseFor: TimeInterval
        /// The shortest time between two mints (Apple answers TooManyProviderTokenUpdates below 20 minutes).
        public var minimumRefreshInterval: TimeInterval

        /// 50 minutes of reuse, 20 minutes between mints.
        public init(reuseFor: TimeInterval = 50 * 60, minimumRefreshInterval: TimeInterval = 20 * 60) {
            self.reuseFor = reuseFor
            self.minimumRefreshInterval = minimumRefreshInterval
        }
    }

    private struct State {
        var current: ProviderToken?
        var mints = 0
    }

    /// The key tokens are minted with.
    public let key: SigningKey
    let configuration: Configuration
    let now: @Sendable () -> Date
    private let state = Mutex(State())

    /// - Parameters:
    ///   - now: the clock (tests inject one).
    public init(key: SigningKey, configuration: Configuration = .init(), now: @escaping @Sendable () -> Date = Date.init) {
        self.key = key
        self.configuration = configuration
        self.now = now
    }

    /// How many tokens this cache has minted (the `jwt_mints` metric).
    public var mintCount: Int { self.state.withLock { $0.mints } }

    /// The token to send now: the current one while it is younger than the reuse window, else a new one.
    public func token() throws -> ProviderToken {
        let now = self.now()
        return try self.state.withLock { state in
            if let current = state.current, now.timeIntervalSince(current.issuedAt) < self.configuration.reuseFor {
                return current
            }
            return try self.mint(&state, now: now)
        }
    }

    /// APNs answered `ExpiredProviderToken` for `rejected`: mint a replacement once. Concurrent callers
    /// holding the same rejected token all get the one replacement; a token minted less than the minimum
    /// interval ago is kept (another mint would trip TooManyProviderTokenUpdates, and cannot cure a
    /// token that young: the clock is wrong).
    public func replace(_ rejected: ProviderToken) throws -> ProviderToken {
        let now = self.now()
        return try self.state.withLock { state in
            if let current = state.current {
                if current != rejected { return current }
                let age = now.timeIntervalSince(current.issuedAt)
                if age >= 0 && age < self.configuration.minimumRefreshInterval { return current }
            }
            return try self.mint(&state, now: now)
        }
    }

    private func mint(_ state: inout State, now: Date) throws -> ProviderToken {
        let token = try ProviderToken.mint(for: self.key, at: now)
        state.current = token
        state.mints += 1
        return token
    }
}
