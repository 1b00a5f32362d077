public import Foundation
public import PushCore
import Synchronization

/// One provider token per signing key, shared by every connection of the process and, through an
/// optional ``ProviderTokenStore`` (Postgres in the daemon), by every worker process: minted lazily,
/// reused for ``Configuration-swift.struct/reuseFor`` (~50 minutes), never re-minted sooner than
/// ``Configuration-swift.struct/minimumRefreshInterval`` (20 minutes) after the last mint, and replaced
/// once for an `ExpiredProviderToken`, by the first of many concurrent callers.
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
    /// The process's clock: a token's age, on the wall clock (its `iat` is read by Apple).
    let clock: any PushClock
    let store: (any ProviderTokenStore)?
    private let state = Mutex(State())
    private let refreshLock = AsyncLock()

    /// - Parameters:
    ///   - store: where worker processes share tokens; `nil` keeps them in this process.
    ///   - clock: the process's clock.
    public init(
        key: SigningKey,
        configuration: Configuration = .init(),
        store: (any ProviderTokenStore)? = nil,
        clock: any PushClock
    ) {
        self.key = key
        self.configuration = configuration
        self.store = store
        self.clock = clock
    }

    /// How many tokens this process has minted (the `jwt_mints` metric).
    public var mintCount: Int { self.state.withLock { $0.mints } }

    /// The token to send now: the current one while it is younger than the reuse window, else a fresh
    /// one (another process's, from the store, when it is young enough; else newly minted).
    public func token() async throws -> ProviderToken {
        if let current = self.fresh() { return current }
        return try await self.refreshLock.withLock {
            if let current = self.fresh() { return current }
            return try await self.refresh(replacing: nil)
        }
    }

    /// APNs answered `ExpiredProviderToken` for `rejected`: replace it once. Concurrent callers holding
    /// the same rejected token all get the one replacement; a token minted less than the minimum
    /// interval ago is kept (another mint would trip TooManyProviderTokenUpdates, and cannot cure a
    /// token that young: the clock is wrong).
    public func replace(_ rejected: ProviderToken) async throws -> ProviderToken {
        try await self.refreshLock.withLock {
            if let current = self.state.withLock({ $0.current }), current != rejected { return current }
            return try await self.refresh(replacing: rejected)
        }
    }

    /// APNs answered `TooManyProviderTokenUpdates` for `rejected`: it took another token for this key
    /// first, another process's (two processes that raced to mint, a store that failed a save). Adopt the
    /// stored token if it differs and is young enough; never mint (a mint would be one more update).
    /// `nil`: nothing to adopt, the refusal stands.
    public func adoptShared(rejecting rejected: ProviderToken) async throws -> ProviderToken? {
        try await self.refreshLock.withLock {
            if let current = self.state.withLock({ $0.current }), current != rejected { return current }
            guard let store = self.store,
                let shared = try? await store.load(teamID: self.key.teamID, keyID: self.key.keyID),
                shared != rejected, self.clock.wallNow.timeIntervalSince(shared.issuedAt) < self.configuration.reuseFor,
                shared.isSigned(by: self.key)
            else { return nil }
            self.state.withLock { $0.current = shared }
            return shared
        }
    }

    /// ``replace(_:)`` for the token whose JWT is `jwt` (the engine knows tokens by the header it sent).
    /// Another token is current already: it is the replacement, as in ``replace(_:)``.
    func replace(jwt: String) async throws -> ProviderToken {
        guard let current = self.state.withLock({ $0.current }) else { return try await self.token() }
        return current.jwt == jwt ? try await self.replace(current) : current
    }

    /// ``adoptShared(rejecting:)`` for the token whose JWT is `jwt`: another token current already is the one
    /// to send with, as there; nothing is minted.
    func adoptShared(rejectingJWT jwt: String) async throws -> ProviderToken? {
        guard let current = self.state.withLock({ $0.current }) else { return nil }
        return current.jwt == jwt ? try await self.adoptShared(rejecting: current) : current
    }

    private func fresh() -> ProviderToken? {
        let now = self.clock.wallNow
        return self.state.withLock { state in
            guard let current = state.current, now.timeIntervalSince(current.issuedAt) < self.configuration.reuseFor
            else { return nil }
            return current
        }
    }

    /// Under the refresh lock: adopt a shared token if it is usable, else mint and share one. A shared
    /// token this key did not sign (the key file was replaced, its key id kept) is never sent, whatever its
    /// age: it is replaced in the store by this process's own.
    private func refresh(replacing rejected: ProviderToken?) async throws -> ProviderToken {
        let now = self.clock.wallNow
        var newest = self.state.withLock { $0.current }
        var foreign: ProviderToken?
        if let store = self.store, let shared = try? await store.load(teamID: self.key.teamID, keyID: self.key.keyID) {
            if !shared.isSigned(by: self.key) {
                foreign = shared
            } else if shared.issuedAt > (newest?.issuedAt ?? .distantPast) {
                newest = shared
            }
        }
        if let newest {
            let age = now.timeIntervalSince(newest.issuedAt)
            let usable = newest != rejected && age < self.configuration.reuseFor
            // Too young to replace: keep it whatever APNs said (a mint now would be TooManyProviderTokenUpdates).
            if usable || (age >= 0 && age < self.configuration.minimumRefreshInterval) {
                self.state.withLock { $0.current = newest }
                return newest
            }
        }
        var token = try ProviderToken.mint(for: self.key, at: now)
        self.state.withLock { $0.mints += 1 }
        if let store = self.store {
            let teamID = self.key.teamID
            let keyID = self.key.keyID
            var stored: ProviderToken?
            if let foreign {
                stored = try? await store.replace(foreign, with: token, teamID: teamID, keyID: keyID)
            }
            if stored == nil {
                stored = try? await store.save(
                    token,
                    teamID: teamID,
                    keyID: keyID,
                    minimumRefreshInterval: self.configuration.minimumRefreshInterval
                )
            }
            // A foreign token stored meanwhile (its young age kept it): replace it too, so this key's token is
            // the shared one and the rest of the fleet adopts it instead of minting its own.
            if let found = stored, !found.isSigned(by: self.key) {
                stored = try? await store.replace(found, with: token, teamID: teamID, keyID: keyID)
            }
            // Another process's token wins a race only if this key signed it too.
            if let stored, stored.isSigned(by: self.key) { token = stored }
        }
        self.state.withLock { $0.current = token }
        return token
    }
}

/// A FIFO async mutex: one refresh at a time, without blocking a thread. A caller cancelled while it waits
/// leaves the queue at once with `CancellationError` (a shutdown does not wait behind a slow mint).
final class AsyncLock: Sendable {
    private struct State {
        var locked = false
        var nextID = 0
        var waiters: [(id: Int, continuation: CheckedContinuation<Void, any Error>)] = []
    }

    private let state = Mutex(State())

    func withLock<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        let id = self.state.withLock { state in
            defer { state.nextID += 1 }
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let acquired = self.state.withLock { state -> Bool? in
                    if !state.locked {
                        state.locked = true
                        return true
                    }
                    // Cancelled before it queued: the handler found nothing to remove.
                    if Task.isCancelled { return nil }
                    state.waiters.append((id, continuation))
                    return false
                }
                switch acquired {
                case true?: continuation.resume()
                case nil: continuation.resume(throwing: CancellationError())
                case false?: break
                }
            }
        } onCancel: {
            let waiter = self.state.withLock { state -> CheckedContinuation<Void, any Error>? in
                guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                return state.waiters.remove(at: index).continuation
            }
            waiter?.resume(throwing: CancellationError())
        }
        defer {
            let next = self.state.withLock { state -> CheckedContinuation<Void, any Error>? in
                if state.waiters.isEmpty {
                    state.locked = false
                    return nil
                }
                return state.waiters.removeFirst().continuation
            }
            next?.resume()
        }
        return try await body()
    }

    /// Callers waiting now (for tests).
    var waiting: Int { self.state.withLock { $0.waiters.count } }
}
