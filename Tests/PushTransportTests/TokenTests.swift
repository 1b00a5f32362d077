import APNsSimulator
import Crypto
import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import PushClockTesting
import PushCore
import Synchronization
import Testing

@testable import PushTransport

@Suite("Provider tokens and signing keys")
struct TokenTests {
    static let key = SigningKey(teamID: "TEAM123456", keyID: "KEY1234567", privateKey: P256.Signing.PrivateKey())

    @Test("the JWT is ES256 with kid, iss, iat and a 64-byte raw signature that verifies")
    func jwtShape() throws {
        let token = try ProviderToken.mint(for: Self.key, at: Date(timeIntervalSince1970: 1_800_000_000.7))
        let parts = token.jwt.split(separator: ".").map(String.init)
        #expect(parts.count == 3)
        #expect(!token.jwt.contains("=") && !token.jwt.contains("+") && !token.jwt.contains("/"))
        func decode(_ text: String) -> Data {
            var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
            while base64.count % 4 != 0 { base64 += "=" }
            return Data(base64Encoded: base64)!
        }
        #expect(String(decoding: decode(parts[0]), as: UTF8.self) == #"{"alg":"ES256","kid":"KEY1234567"}"#)
        #expect(String(decoding: decode(parts[1]), as: UTF8.self) == #"{"iss":"TEAM123456","iat":1800000000}"#)
        let signature = decode(parts[2])
        #expect(signature.count == 64)
        #expect(
            Self.key.privateKey.publicKey.isValidSignature(
                try P256.Signing.ECDSASignature(rawRepresentation: signature),
                for: Data((parts[0] + "." + parts[1]).utf8)
            )
        )
    }

    @Test("reused within its window, re-minted after it; a replacement happens once and never within 20 minutes")
    func cacheRules() async throws {
        let clock = ManualWallClock()
        let cache = ProviderTokenCache(key: Self.key, clock: WallClock({ clock.now }))
        let first = try await cache.token()
        clock.advance(by: 49 * 60)
        #expect(try await cache.token() == first)
        #expect(cache.mintCount == 1)
        clock.advance(by: 2 * 60)
        let second = try await cache.token()
        #expect(second != first)
        #expect(cache.mintCount == 2)
        // A late ExpiredProviderToken for the old token: the current one is already newer.
        #expect(try await cache.replace(first) == second)
        // Expired for a token minted 5 minutes ago: keep it, another mint would trip TooManyProviderTokenUpdates.
        clock.advance(by: 5 * 60)
        #expect(try await cache.replace(second) == second)
        #expect(cache.mintCount == 2)
        // 25 minutes old: replaced, once, however many callers report it.
        clock.advance(by: 20 * 60)
        let replacements = try await withThrowingTaskGroup(of: ProviderToken.self) { group in
            for _ in 0..<50 { group.addTask { try await cache.replace(second) } }
            var tokens: [ProviderToken] = []
            for try await token in group { tokens.append(token) }
            return tokens
        }
        #expect(Set(replacements).count == 1)
        #expect(replacements[0] != second)
        #expect(cache.mintCount == 3)
    }

    @Test("processes share tokens through a store: a second process adopts a young token instead of minting")
    func sharedStore() async throws {
        let clock = ManualWallClock()
        let store = MemoryTokenStore()
        let first = ProviderTokenCache(key: Self.key, store: store, clock: WallClock({ clock.now }))
        let token = try await first.token()
        clock.advance(by: 5 * 60)
        let restarted = ProviderTokenCache(key: Self.key, store: store, clock: WallClock({ clock.now }))
        #expect(try await restarted.token() == token)
        #expect(restarted.mintCount == 0)
        // Past the reuse window the next caller mints, stores, and the other process adopts it.
        clock.advance(by: 50 * 60)
        let renewed = try await restarted.token()
        #expect(renewed != token && restarted.mintCount == 1)
        #expect(try await first.replace(token) == renewed)
        #expect(first.mintCount == 1)
    }

    @Test(
        "a stored token another key signed under the same key id (the .p8 was replaced) is never sent: the worker mints with its own key and replaces it, whatever its age"
    )
    func storedTokenOfAReplacedKey() async throws {
        let clock = ManualWallClock()
        let store = MemoryTokenStore()
        let replaced = SigningKey(teamID: Self.key.teamID, keyID: Self.key.keyID, privateKey: P256.Signing.PrivateKey())
        // Minted a minute ago by a worker that still had the wrong key: young enough to be adopted by age.
        let foreign = try ProviderToken.mint(for: replaced, at: clock.now.addingTimeInterval(-60))
        store.seed(foreign)
        #expect(!foreign.isSigned(by: Self.key) && foreign.isSigned(by: replaced))
        let cache = ProviderTokenCache(key: Self.key, store: store, clock: WallClock({ clock.now }))
        let token = try await cache.token()
        #expect(token != foreign && token.isSigned(by: Self.key) && cache.mintCount == 1)
        #expect(try await store.load(teamID: Self.key.teamID, keyID: Self.key.keyID) == token, "replaced in the store")
        // The rest of the fleet (the right key) adopts it without minting; TooManyProviderTokenUpdates never
        // adopts a foreign one either.
        let other = ProviderTokenCache(key: Self.key, store: store, clock: WallClock({ clock.now }))
        #expect(try await other.token() == token && other.mintCount == 0)
        store.seed(foreign)
        #expect(try await other.adoptShared(rejecting: token) == nil)
        // A load that failed (so nothing looked foreign) and a save that kept the young foreign token: it is
        // replaced all the same, and the token sent is the one stored.
        let blind = ProviderTokenCache(
            key: Self.key,
            store: FailingTokenStore(inner: store, loadsFail: true),
            clock: WallClock({ clock.now })
        )
        let sent = try await blind.token()
        #expect(sent.isSigned(by: Self.key))
        #expect(try await store.load(teamID: Self.key.teamID, keyID: Self.key.keyID) == sent)
    }

    @Test(
        "two processes that find no token and mint at once, a second apart, both send the first one stored, in either order"
    )
    func concurrentMintsShareTheFirst() async throws {
        let base = Date(timeIntervalSince1970: 1_800_000_000)
        for first in [base, base.addingTimeInterval(1)] {
            let store = RacingTokenStore(firstToSave: first)
            let a = ProviderTokenCache(key: Self.key, store: store, clock: WallClock({ base }))
            let b = ProviderTokenCache(key: Self.key, store: store, clock: WallClock({ base.addingTimeInterval(1) }))
            async let fromA = a.token()
            async let fromB = b.token()
            let (x, y) = try await (fromA, fromB)
            #expect(a.mintCount == 1 && b.mintCount == 1, "both found no token and minted")
            #expect(x == y, "one token for the key, or APNs answers TooManyProviderTokenUpdates to one of them")
            #expect(x.issuedAt == first, "the first stored wins")
        }
    }

    @Test(
        "TooManyProviderTokenUpdates: a worker whose own token lost to another's adopts the stored one and is delivered"
    )
    func adoptsTheStoredTokenAfterTooManyUpdates() async throws {
        let shared = MemoryTokenStore()
        try await Fixture.run(
            // This worker's store takes no saves (a failed write): it keeps the token it mints.
            tokenCache: { key in
                ProviderTokenCache(
                    key: key,
                    store: FailingTokenStore(inner: shared, writesFail: true),
                    clock: ContinuousClock()
                )
            }
        ) { f in
            let cache = try #require(f.client.tokenCache(for: "default"))
            let own = try await cache.token()
            // Another worker, its clock 2 minutes behind, mints, stores and sends first: APNs takes its token.
            let caFile = FileManager.default.temporaryDirectory.appendingPathComponent("sim-ca-\(UUID()).pem").path
            try f.simulator.writeCACertificate(to: caFile)
            defer { try? FileManager.default.removeItem(atPath: caFile) }
            let other = try APNsClient(
                configuration: .init(
                    endpointOverride: APNsEndpoint(host: "localhost", port: f.simulator.port),
                    caFile: caFile,
                    connectionsPerPool: 1,
                    requestTimeout: .seconds(5)
                ),
                credentials: ["default": f.key],
                tokenCaches: [
                    "default": ProviderTokenCache(
                        key: f.key,
                        store: shared,
                        clock: WallClock({ Date().addingTimeInterval(-120) })
                    )
                ],
                logger: Fixture.logger
            )
            let first = try await other.send(try Fixture.alert(Fixture.token()), credential: "default")
            await other.shutdown()
            #expect(first.status == 200)
            let stored = try #require(try await shared.load(teamID: f.key.teamID, keyID: f.key.keyID))
            #expect(stored != own)

            let response = try await f.send(try Fixture.alert(Fixture.token()))
            #expect(response.status == 200, "\(response.status) \(response.reason ?? "")")
            let lastTwo = Array(f.simulator.requests.suffix(2))
            #expect(lastTwo.map(\.status) == [429, 200], "refused with its own token, then delivered")
            #expect(lastTwo.last?.tokenIssuedAt == Int64(stored.issuedAt.timeIntervalSince1970), "with the stored one")
            #expect(cache.mintCount == 1, "no mint after the refusal")
            #expect(try await cache.token() == stored)
        }
    }

    @Test("concurrent senders share one token: the simulator sees one iat and the cache minted once")
    func sharedToken() async throws {
        try await Fixture.run { f in
            _ = try await f.send(try Fixture.alert(Fixture.token()))
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<40 { group.addTask { _ = try await f.send(try Fixture.alert(Fixture.token())) } }
                try await group.waitForAll()
            }
            #expect(f.client.tokenCache(for: "default")?.mintCount == 1)
            #expect(Set(f.simulator.requests.map(\.tokenIssuedAt)).count == 1)
            #expect(f.simulator.requests.allSatisfy { $0.status == 200 })
        }
    }

    @Test("ExpiredProviderToken under concurrency: one re-mint, every request then delivered")
    func expiredProviderToken() async throws {
        // One wall clock for the simulator and the cache, moved forward instead of slept through.
        let offset = Atomic<Int>(0)
        let now: @Sendable () -> Date = { Date().addingTimeInterval(Double(offset.load(ordering: .relaxed))) }
        try await Fixture.run(
            simulator: {
                // Old at 60 s: far from any real time the test takes (a loaded run took 15 s, and a 3 s limit
                // expired the re-minted token too).
                $0.tokenMaxAge = 60
                $0.minimumTokenRefresh = 1
                $0.now = now
            },
            tokenCache: {
                ProviderTokenCache(
                    key: $0,
                    configuration: .init(reuseFor: 3600, minimumRefreshInterval: 1),
                    clock: WallClock(now)
                )
            }
        ) { f in
            #expect(try await f.send(try Fixture.alert(Fixture.token())).status == 200)
            // iat is whole seconds: 65 s on, the first token is certainly older than the simulator's 60 s.
            offset.store(65, ordering: .relaxed)
            let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<20 { group.addTask { try await f.send(try Fixture.alert(Fixture.token())).status } }
                var statuses: [Int] = []
                for try await status in group { statuses.append(status) }
                return statuses
            }
            #expect(statuses == Array(repeating: 200, count: 20))
            #expect(f.client.tokenCache(for: "default")?.mintCount == 2)
            #expect(f.simulator.requests.contains { $0.reason == "ExpiredProviderToken" })
            #expect(!f.simulator.requests.contains { $0.reason == "TooManyProviderTokenUpdates" })
        }
    }

    @Test("a token signed by an unknown key is InvalidProviderToken, credential-fatal")
    func invalidToken() async throws {
        try await Fixture.run(simulator: { $0.keys = [:] }) { f in
            let response = try await f.send(try Fixture.alert(Fixture.token()))
            #expect(response.status == 403 && response.reason == "InvalidProviderToken")
            #expect(response.verdict.responseClass == .credentialFatal)
        }
    }

    @Test("key files: missing, world-readable and non-key files are refused with the path and the fix, no key material")
    func keyFiles() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("keys-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let pem = Self.key.privateKey.pemRepresentation
        let good = directory.appendingPathComponent("AuthKey_KEY1234567.p8").path
        _ = FileManager.default.createFile(
            atPath: good,
            contents: Data(pem.utf8),
            attributes: [.posixPermissions: 0o600]
        )
        let loaded = try SigningKey.load(teamID: "TEAM123456", keyID: "KEY1234567", path: good)
        #expect(loaded.privateKey.publicKey.rawRepresentation == Self.key.privateKey.publicKey.rawRepresentation)
        #expect(!"\(loaded)".contains("PRIVATE"))

        func failure(_ path: String) -> String {
            do {
                _ = try SigningKey.load(teamID: "TEAM123456", keyID: "KEY1234567", path: path)
                return ""
            } catch { return "\(error)" }
        }
        let open = directory.appendingPathComponent("open.p8").path
        _ = FileManager.default.createFile(
            atPath: open,
            contents: Data(pem.utf8),
            attributes: [.posixPermissions: 0o644]
        )
        let notKey = directory.appendingPathComponent("cert.p8").path
        _ = FileManager.default.createFile(
            atPath: notKey,
            contents: Data("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".utf8),
            attributes: [.posixPermissions: 0o600]
        )
        let rsaLike = directory.appendingPathComponent("garbage.p8").path
        _ = FileManager.default.createFile(
            atPath: rsaLike,
            contents: Data("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".utf8),
            attributes: [.posixPermissions: 0o600]
        )

        let missing = failure(directory.appendingPathComponent("nope.p8").path)
        #expect(missing.contains("does not exist") && missing.contains("nope.p8"))
        let worldReadable = failure(open)
        #expect(worldReadable.contains("readable or writable by other users") && worldReadable.contains("chmod 600"))
        #expect(failure(notKey).contains("not a PEM PKCS#8 private key"))
        #expect(failure(rsaLike).contains("not a P-256"))
        for message in [missing, worldReadable, failure(notKey), failure(rsaLike)] {
            #expect(!message.contains(String(pem.split(separator: "\n")[1].prefix(20))))
        }
        #expect(throws: TransportError.self) {
            try SigningKey.load(teamID: "TEAM123456", keyID: "KEY\",\"x\":\"1", path: good)
        }
    }

    @Test("the Kubernetes Secret layout loads: key.p8 -> ..data/key.p8 -> ..2026_11_23/key.p8 (0440, the pod's group)")
    func kubernetesSecretLayout() throws {
        let fm = FileManager.default
        let volume = fm.temporaryDirectory.appendingPathComponent("secret-\(UUID().uuidString)")
        let timestamped = volume.appendingPathComponent("..2026_11_23_08_00_00.123456789")
        try fm.createDirectory(at: timestamped, withIntermediateDirectories: true)
        defer { try? fm.removeItem(at: volume) }
        let pem = Data(Self.key.privateKey.pemRepresentation.utf8)
        let target = timestamped.appendingPathComponent("key.p8").path
        // Kubernetes with fsGroup: mode 0440, group = the pod's fsGroup (here: this process's own group).
        _ = fm.createFile(atPath: target, contents: pem, attributes: [.posixPermissions: 0o440])
        #expect(chown(target, geteuid(), getegid()) == 0)
        try fm.createSymbolicLink(
            atPath: volume.appendingPathComponent("..data").path,
            withDestinationPath: timestamped.lastPathComponent
        )
        let key = volume.appendingPathComponent("key.p8").path
        try fm.createSymbolicLink(atPath: key, withDestinationPath: "..data/key.p8")
        #expect(try fm.attributesOfItem(atPath: key)[.type] as? FileAttributeType == .typeSymbolicLink)
        let loaded = try SigningKey.load(teamID: "TEAM123456", keyID: "KEY1234567", path: key)
        #expect(loaded.keyID == "KEY1234567")

        // The same layout with a 0644 target (a Secret volume without defaultMode) is refused.
        #expect(chmod(target, 0o644) == 0)
        let refused = #expect(throws: TransportError.self) {
            try SigningKey.load(teamID: "TEAM123456", keyID: "KEY1234567", path: key)
        }
        #expect("\(refused.map { "\($0)" } ?? "")".contains("chmod 600"))
        // Group-writable, or readable by a group this process is not in: refused too.
        #expect(chmod(target, 0o460) == 0)
        #expect(throws: TransportError.self) {
            try SigningKey.load(teamID: "TEAM123456", keyID: "KEY1234567", path: key)
        }
        #expect(chmod(target, 0o440) == 0)
        #expect(chown(target, geteuid(), 4242) == 0)
        #expect(throws: TransportError.self) {
            try SigningKey.load(teamID: "TEAM123456", keyID: "KEY1234567", path: key)
        }
    }
}

@Suite("Broadcast channels")
struct ChannelTests {
    @Test("create, list, broadcast to, and delete a channel")
    func lifecycle() async throws {
        try await Fixture.run { f in
            let id = try await f.client.createChannel(
                bundleID: "com.example.app",
                environment: .development,
                credential: "default",
                storage: .noStorage
            )
            #expect(Data(base64Encoded: id) != nil)
            #expect(
                try await f.client.listChannels(
                    bundleID: "com.example.app",
                    environment: .development,
                    credential: "default"
                ) == [id]
            )

            let job = PushJob(
                id: 9,
                apnsID: UUID(),
                topic: "com.example.app",
                channelID: id,
                payload: #"{"aps":{"timestamp":1800000000,"event":"update","content-state":{"score":"2-1"}}}"#,
                pushType: "liveactivity",
                environment: "development",
                runAt: Date(),
                createdAt: Date()
            )
            let sent = try await f.send(try RequestBuilder.describe(job, now: Date()))
            #expect(sent.status == 200)
            let recorded = try #require(f.simulator.requests.last)
            #expect(recorded.path == "/4/broadcasts/apps/com.example.app")
            #expect(recorded.headers["apns-topic"] == nil)
            #expect(recorded.headers["apns-channel-id"] == id)

            try await f.client.deleteChannel(
                id,
                bundleID: "com.example.app",
                environment: .development,
                credential: "default"
            )
            #expect(
                try await f.client.listChannels(
                    bundleID: "com.example.app",
                    environment: .development,
                    credential: "default"
                ).isEmpty
            )
            let afterDelete = try await f.send(try RequestBuilder.describe(job, now: Date()))
            #expect(afterDelete.reason == "ChannelNotRegistered")
            #expect(afterDelete.verdict.trapID == .channel)
            await #expect(throws: ChannelManagementError.self) {
                try await f.client.deleteChannel(
                    id,
                    bundleID: "com.example.app",
                    environment: .development,
                    credential: "default"
                )
            }
        }
    }
}

/// An in-memory ``ProviderTokenStore`` (the daemon uses Postgres).
final class MemoryTokenStore: ProviderTokenStore {
    private let token = Mutex<ProviderToken?>(nil)
    func load(teamID: String, keyID: String) async throws -> ProviderToken? { self.token.withLock { $0 } }
    func save(
        _ token: ProviderToken,
        teamID: String,
        keyID: String,
        minimumRefreshInterval: TimeInterval
    ) async throws -> ProviderToken {
        self.token.withLock { stored in
            if let current = stored, current.issuedAt > token.issuedAt.addingTimeInterval(-minimumRefreshInterval) {
                return current
            }
            stored = token
            return token
        }
    }
    func replace(
        _ stale: ProviderToken,
        with token: ProviderToken,
        teamID: String,
        keyID: String
    ) async throws -> ProviderToken? {
        self.token.withLock { stored in
            if stored == stale { stored = token }
            return stored
        }
    }
    /// Stores `token` as if another process had (tests).
    func seed(_ token: ProviderToken) { self.token.withLock { $0 = token } }
}

/// Two processes racing: both load before either saves, and the save of the token minted at `firstToSave`
/// lands first.
final class RacingTokenStore: ProviderTokenStore {
    private let inner = MemoryTokenStore()
    private let firstToSave: Date
    private let loads = Gate(arrivals: 2)
    private let firstSaved = Gate(arrivals: 1)

    init(firstToSave: Date) { self.firstToSave = firstToSave }

    func load(teamID: String, keyID: String) async throws -> ProviderToken? {
        let found = try await self.inner.load(teamID: teamID, keyID: keyID)
        await self.loads.arrive()
        return found
    }

    func save(
        _ token: ProviderToken,
        teamID: String,
        keyID: String,
        minimumRefreshInterval: TimeInterval
    ) async throws -> ProviderToken {
        let isFirst = token.issuedAt == self.firstToSave
        if !isFirst { await self.firstSaved.wait() }
        let stored = try await self.inner.save(
            token,
            teamID: teamID,
            keyID: keyID,
            minimumRefreshInterval: minimumRefreshInterval
        )
        if isFirst { await self.firstSaved.arrive() }
        return stored
    }

    func replace(
        _ stale: ProviderToken,
        with token: ProviderToken,
        teamID: String,
        keyID: String
    ) async throws -> ProviderToken? {
        try await self.inner.replace(stale, with: token, teamID: teamID, keyID: keyID)
    }
}

/// Opens once `arrivals` callers have arrived; `arrive` and `wait` return once it is open.
final class Gate: Sendable {
    private struct State {
        var remaining: Int
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state: Mutex<State>

    init(arrivals: Int) { self.state = Mutex(State(remaining: arrivals)) }

    func arrive() async {
        let opened = self.state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.remaining -= 1
            guard state.remaining == 0 else { return [] }
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in opened { waiter.resume() }
        await self.wait()
    }

    func wait() async {
        await withCheckedContinuation { continuation in
            let open = self.state.withLock { state -> Bool in
                if state.remaining <= 0 { return true }
                state.waiters.append(continuation)
                return false
            }
            if open { continuation.resume() }
        }
    }
}

/// A store in front of `inner` whose loads, or whose writes (save and replace), fail: Postgres unreachable
/// at that moment.
final class FailingTokenStore: ProviderTokenStore {
    struct Refused: Error {}
    let inner: MemoryTokenStore
    let loadsFail: Bool
    let writesFail: Bool
    init(inner: MemoryTokenStore, loadsFail: Bool = false, writesFail: Bool = false) {
        self.inner = inner
        self.loadsFail = loadsFail
        self.writesFail = writesFail
    }
    func load(teamID: String, keyID: String) async throws -> ProviderToken? {
        if self.loadsFail { throw Refused() }
        return try await self.inner.load(teamID: teamID, keyID: keyID)
    }
    func save(
        _ token: ProviderToken,
        teamID: String,
        keyID: String,
        minimumRefreshInterval: TimeInterval
    ) async throws -> ProviderToken {
        if self.writesFail { throw Refused() }
        return try await self.inner.save(
            token,
            teamID: teamID,
            keyID: keyID,
            minimumRefreshInterval: minimumRefreshInterval
        )
    }
    func replace(
        _ stale: ProviderToken,
        with token: ProviderToken,
        teamID: String,
        keyID: String
    ) async throws -> ProviderToken? {
        if self.writesFail { throw Refused() }
        return try await self.inner.replace(stale, with: token, teamID: teamID, keyID: keyID)
    }
}

@Suite("Waiters that give up")
struct WaiterCancellationTests {
    @Test(
        "a caller cancelled while it waits for the token lock leaves at once with CancellationError; the lock still serves the next"
    )
    func asyncLock() async throws {
        let lock = AsyncLock()
        let (entered, enter) = AsyncStream<Void>.makeStream()
        let (released, release) = AsyncStream<Void>.makeStream()
        let holder = Task {
            try await lock.withLock {
                enter.yield()
                for await _ in released { break }
                return 1
            }
        }
        var iterator = entered.makeAsyncIterator()
        _ = await iterator.next()
        let waiter = Task { try await lock.withLock { 2 } }
        while lock.waiting == 0 { try await Task.sleep(for: .milliseconds(1)) }
        waiter.cancel()
        await #expect(throws: CancellationError.self) { try await waiter.value }
        #expect(lock.waiting == 0, "the cancelled caller left the queue")
        release.yield()
        #expect(try await holder.value == 1)
        #expect(try await lock.withLock { 3 } == 3, "the lock was handed back, not lost")
        let early = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await lock.withLock { 4 }
        }
        #expect(try await early.value == 4, "a free lock is taken even by a cancelled caller: it never waits")
    }

    @Test("a caller cancelled while it waits for another's connect leaves at once, unsent; the connect goes on")
    func poolWaiter() async throws {
        // A peer that completes TCP (the kernel's backlog) and never answers TLS: the connect hangs.
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(ChannelOptions.autoRead, value: false)
            .bind(host: "127.0.0.1", port: 0).get()
        defer { server.close(promise: nil) }
        let pool = ConnectionPool(
            endpoint: APNsEndpoint(host: "127.0.0.1", port: server.localAddress!.port!),
            context: .init(
                configuration: PoolConfiguration(
                    connectionsPerPool: 1,
                    requestTimeout: .seconds(10),
                    connectTimeout: .seconds(30),
                    idlePingAfter: .seconds(60),
                    initialReconnectBackoff: .seconds(1),
                    maximumReconnectBackoff: .seconds(1)
                ),
                peer: "APNs",
                changesEveryRequest: { _ in false },
                tlsContext: try NIOSSLContext(configuration: .makeClientConfiguration()),
                group: MultiThreadedEventLoopGroup.singleton,
                logger: Logger(label: "test")
            )
        )
        let connecting = Task { try await pool.connection() }
        // The second caller finds the one slot connecting and waits for it.
        let waiting = Task { try await pool.connection() }
        while pool.waitingForConnect == 0 { try await Task.sleep(for: .milliseconds(1)) }
        let started = ContinuousClock.now
        waiting.cancel()
        do {
            _ = try await waiting.value
            Issue.record("a cancelled waiter got a connection")
        } catch let error as TransportError {
            #expect(error.fault == .cancelled, "withdrawn, unsent: \(error)")
        }
        #expect(ContinuousClock.now - started < .seconds(10), "it left at its cancellation, not after the 30 s connect")
        connecting.cancel()
        await pool.closeAll()
    }
}
