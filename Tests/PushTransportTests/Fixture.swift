import APNsSimulator
import Crypto
import Foundation
import Logging
import PushCore
import PushQueueTesting
import Synchronization

@testable import PushTransport

/// A simulator over real TLS with one trusted key, and a client pointed at it.
struct Fixture: Sendable {
    static let teamID = "TEAM123456"
    static let keyID = "KEY1234567"

    let simulator: APNsSimulator
    let client: APNsClient
    let key: SigningKey

    static var logger: Logger {
        var logger = Logger(label: "push.test.apns")
        logger.logLevel = .error
        return logger
    }

    /// Runs `body` against a fresh simulator and client; the client is shut down afterwards.
    static func run<T: Sendable>(
        simulator configure: @Sendable (inout APNsSimulator.Configuration) -> Void = { _ in },
        client configureClient: @Sendable (inout APNsClient.Configuration) -> Void = { _ in },
        tokenCache: (@Sendable (SigningKey) -> ProviderTokenCache)? = nil,
        _ body: @Sendable (Fixture) async throws -> T
    ) async throws -> T {
        // This suite runs first and uses no database: bound and flush the run from here too.
        TestWatchdog.start()
        let key = SigningKey(teamID: teamID, keyID: keyID, privateKey: P256.Signing.PrivateKey())
        var configuration = APNsSimulator.Configuration(keys: [
            keyID: .init(teamID: teamID, publicKey: key.privateKey.publicKey)
        ])
        configure(&configuration)
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        return try await simulator.run { simulator in
            let caFile = FileManager.default.temporaryDirectory.appendingPathComponent(
                "sim-ca-\(UUID().uuidString).pem"
            ).path
            try simulator.writeCACertificate(to: caFile)
            defer { try? FileManager.default.removeItem(atPath: caFile) }
            var clientConfiguration = APNsClient.Configuration(
                endpointOverride: APNsEndpoint(host: "localhost", port: simulator.port),
                caFile: caFile,
                connectionsPerPool: 1,
                requestTimeout: .seconds(5)
            )
            configureClient(&clientConfiguration)
            let caches = tokenCache.map { ["default": $0(key)] } ?? [:]
            let client = try APNsClient(
                configuration: clientConfiguration,
                credentials: ["default": key],
                tokenCaches: caches,
                logger: logger
            )
            do {
                let result = try await body(Fixture(simulator: simulator, client: client, key: key))
                await client.shutdown()
                return result
            } catch {
                await client.shutdown()
                throw error
            }
        }
    }

    /// A device token unique to one test.
    static func token(_ n: Int = Int.random(in: 0..<Int.max)) -> String {
        let hex = String(n, radix: 16)
        return String(repeating: "0", count: 64 - hex.count) + hex
    }

    /// The request for a plain alert to `token`.
    static func alert(
        _ token: String,
        apnsID: UUID = UUID(),
        pushType: String = "alert",
        priority: Int? = nil,
        payload: String = #"{"aps":{"alert":"hello"}}"#
    ) throws -> APNsRequest {
        try RequestBuilder.describe(
            PushJob(
                id: 1,
                apnsID: apnsID,
                topic: "com.example.app",
                deviceToken: token,
                payload: payload,
                pushType: pushType,
                priority: priority,
                environment: "development",
                runAt: Date(),
                createdAt: Date()
            ),
            now: Date()
        )
    }

    func send(_ request: APNsRequest) async throws -> APNsResponse {
        try await self.client.send(request, credential: "default")
    }
}

/// A wall clock tests move by hand (a provider token's `iat` and age are wall time).
final class ManualWallClock: Sendable {
    private let offset = Mutex<TimeInterval>(0)
    func advance(by seconds: TimeInterval) { self.offset.withLock { $0 += seconds } }
    var now: Date { Date().addingTimeInterval(self.offset.withLock { $0 }) }
}
