import APNsSimulator
import Foundation
import Logging
import PushClockTesting
import PushCore
import PushQueueTesting
import Synchronization
import Testing

@testable import PushTransport

/// FCM's transport against the simulator over real TLS and HTTP/2: the service account's RS256 JWT
/// exchanged at its token_uri, the access token shared and re-minted once on a 401, FCM's error JSON read
/// into the answer table's codes, a refused key file turned into a credential refusal.
@Suite("FCM transport: access tokens, sends and answers against the simulator")
struct FCMTransportTests {
    struct Setup: Sendable {
        let simulator: APNsSimulator
        let client: FCMClient
        let account: SimulatorFCMAccount
        let directory: String
    }

    static func run<T: Sendable>(
        lifetime: TimeInterval = 3600,
        _ body: @Sendable (Setup) async throws -> T
    ) async throws -> T {
        TestWatchdog.start()
        let account = try SimulatorFCMAccount.make()
        var configuration = APNsSimulator.Configuration()
        configuration.fcmAccounts = account.trusted
        configuration.accessTokenLifetime = lifetime
        let simulator = try APNsSimulator(configuration: configuration, logger: Fixture.logger)
        return try await simulator.run { simulator in
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("fcm-\(UUID().uuidString)")
                .path
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let caFile = try simulator.writeCACertificate(to: directory + "-ca.pem")
            defer { try? FileManager.default.removeItem(atPath: caFile) }
            let path = try account.write(in: directory, host: "localhost", port: simulator.port)
            var clientConfiguration = FCMClient.Configuration(
                endpointOverride: PushEndpoint(host: "localhost", port: simulator.port),
                caFile: caFile
            )
            clientConfiguration.requestTimeout = .seconds(5)
            let client = try FCMClient(
                configuration: clientConfiguration,
                accounts: ["default": try ServiceAccount.load(path: path)],
                logger: Fixture.logger
            )
            do {
                let result = try await body(
                    Setup(simulator: simulator, client: client, account: account, directory: directory)
                )
                await client.shutdown()
                return result
            } catch {
                await client.shutdown()
                throw error
            }
        }
    }

    static func message(_ token: String, id: UUID = UUID()) throws -> FCMMessage {
        try FCMMessageBuilder.describe(
            PushJob(
                id: 1,
                apnsID: id,
                topic: "com.example.app",
                deviceToken: token,
                payload: #"{"notification":{"title":"Shipped"},"data":{"order":"42"}}"#,
                environment: "fcm",
                runAt: Date(),
                createdAt: Date(),
                platform: .fcm
            ),
            now: Date()
        )
    }

    @Test("a send exchanges the RS256 JWT once for an access token, and every send after reuses it")
    func tokenExchangeAndSends() async throws {
        try await Self.run { setup in
            for n in 0..<5 {
                let id = UUID()
                let response = try await setup.client.send(try Self.message("tok:\(n)", id: id), credential: "default")
                #expect(response.status == 200)
                #expect(response.messageName?.hasPrefix("projects/push-simulator/messages/") == true)
                let request = try #require(setup.simulator.requests.last)
                #expect(request.path == "/v1/projects/push-simulator/messages:send")
                #expect(request.deviceToken == "tok:\(n)")
                #expect(request.notificationID == id.uuidString.lowercased())
            }
            #expect(setup.client.exchangeCount == 1)
            #expect(setup.simulator.faultCounters.accessTokenGrants == 1)
            // The token request carried the JWT bearer grant; the access token is never recorded.
            let exchange = try #require(setup.simulator.requests.first { $0.path == "/token" })
            #expect(
                String(decoding: exchange.body, as: UTF8.self).hasPrefix(
                    "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion="
                )
            )
        }
    }

    @Test(
        "the worker's sender is the engine: a batch holding an APNs request is sent not at all, an unknown credential names what to set, and the token endpoint's connection is counted and closed with the rest"
    )
    func senderSeam() async throws {
        try await Self.run { setup in
            let sender = setup.client.sender
            #expect(sender.platform == .fcm)
            #expect(sender.credentialNames == ["default"])
            let apns = try Fixture.alert(Fixture.token())
            let results = Mutex([Int: Result<ProviderAnswer, any Error>]())
            await sender.sendBatch(
                [.fcm(try Self.message("tok:mixed")), .apns(apns)],
                credential: "default",
                mayWrite: { true },
                withdraws: nil
            ) { index, result in results.withLock { $0[index] = result } }
            for index in 0..<2 {
                guard case .failure(let error as TransportError) = results.withLock({ $0[index] }) else {
                    Issue.record(
                        "request \(index) of the mixed batch: \(String(describing: results.withLock { $0[index] }))"
                    )
                    continue
                }
                #expect(error.code == .credentialsMissing && !error.mayHaveBeenProcessed)
                #expect(error.message.contains("a batch for the FCM sender held an APNs request"), "\(error.message)")
            }
            #expect(setup.simulator.requests.isEmpty, "nothing of the mixed batch was sent, not even a token exchange")
            results.withLock { $0 = [:] }
            await sender.sendBatch(
                [.fcm(try Self.message("tok:nobody"))],
                credential: "nobody",
                mayWrite: { true },
                withdraws: nil
            ) { index, result in results.withLock { $0[index] = result } }
            guard case .failure(let missing as TransportError) = results.withLock({ $0[0] }) else {
                Issue.record("an unknown credential was not refused")
                return
            }
            #expect(missing.code == .credentialsMissing)
            #expect(missing.message.contains("service_account_path"), "\(missing.message)")
            // A send opens the token endpoint's connection and the send endpoint's (one stand-in: two pools).
            await sender.sendBatch(
                [.fcm(try Self.message("tok:ok"))],
                credential: "default",
                mayWrite: { true },
                withdraws: nil
            ) { index, result in results.withLock { $0[index] = result } }
            #expect(sender.openConnections == 2)
            #expect(setup.client.openConnections == 2)
            await setup.client.shutdown()
            #expect(sender.openConnections == 0)
        }
    }

    @Test(
        "an access token FCM refuses (401) is replaced once and the send goes through; the same answer twice is the job's"
    )
    func reMintOn401() async throws {
        try await Self.run { setup in
            _ = try await setup.client.send(try Self.message("tok:a"), credential: "default")
            setup.simulator.expireAccessTokens()
            let response = try await setup.client.send(try Self.message("tok:b"), credential: "default")
            #expect(response.status == 200)
            #expect(setup.client.exchangeCount == 2)
        }
    }

    /// FCM's answer as read from `body` with `status`.
    static func parsed(_ status: Int, _ body: String) -> FCMResponse {
        FCMResponse(HTTP2Answer(status: status, headers: [:], body: Array(body.utf8), latency: .zero))
    }

    @Test(
        "Google's documented error bodies, verbatim: the invalid-token sentence with only FcmError names the token; a field violation elsewhere does not; a QuotaFailure naming the project is the project's quota"
    )
    func documentedShapes() {
        // firebase.google.com/docs/cloud-messaging/error-codes, example 2: an invalid registration token.
        let invalid = Self.parsed(
            400,
            #"{"error":{"code":400,"message":"The registration token is not a valid FCM registration token","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"INVALID_ARGUMENT"}]}}"#
        )
        #expect(invalid.code == "INVALID_ARGUMENT" && invalid.namesToken)
        #expect(invalid.verdict.responseClass == .tokenInvalid && invalid.verdict.trapID == .fcmTokenUnregistered)
        // Example 1: an invalid value, the field named in a BadRequest, no FcmError: the payload's fault.
        let value = Self.parsed(
            400,
            #"{"error":{"code":400,"message":"Invalid value at 'message.data[0].value' (TYPE_STRING), 12","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"field":"message.data[0].value","description":"Invalid value at 'message.data[0].value' (TYPE_STRING), 12"}]}]}}"#
        )
        #expect(value.code == "INVALID_ARGUMENT" && !value.namesToken)
        #expect(value.verdict.responseClass == .permanent && value.verdict.trapID == .fcmInvalidArgument)
        // The sentence beside a violation of another field: not the token's fault.
        let both = Self.parsed(
            400,
            #"{"error":{"code":400,"message":"The registration token is not a valid FCM registration token","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"field":"message.android.ttl","description":"bad"}]}]}}"#
        )
        #expect(!both.namesToken)
        // QUOTA_EXCEEDED with a QuotaFailure (subject and description): a device's, or the project's.
        let device = Self.parsed(
            429,
            #"{"error":{"code":429,"message":"Quota exceeded.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"QUOTA_EXCEEDED"},{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"subject":"device","description":"Device message rate exceeded."}]}]}}"#
        )
        #expect(device.code == "QUOTA_EXCEEDED" && !device.projectQuota)
        let project = Self.parsed(
            429,
            #"{"error":{"code":429,"message":"Quota exceeded.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"QUOTA_EXCEEDED"},{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"subject":"project:my-project","description":"Message rate exceeded for the project."}]}]}}"#
        )
        #expect(project.code == "QUOTA_EXCEEDED" && project.projectQuota)
        // Google Cloud's own per-project quota (firebase-admin-go#719): no FcmError, RESOURCE_EXHAUSTED.
        let cloud = Self.parsed(
            429,
            #"{"error":{"code":429,"message":"Quota exceeded for quota metric 'Send requests' and limit 'Send requests per minute' of service 'fcm.googleapis.com' for consumer 'project_number:1'.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"RATE_LIMIT_EXCEEDED","domain":"googleapis.com"}]}}"#
        )
        #expect(cloud.code == "RESOURCE_EXHAUSTED")
        #expect(FCMReason.row(status: 429, code: cloud.code, namesToken: false)?.waitsCredential == true)
    }

    @Test(
        "FCM's error JSON is read into its code: UNREGISTERED, INVALID_ARGUMENT naming the token, a device's QUOTA_EXCEEDED with Retry-After"
    )
    func errorCodes() async throws {
        try await Self.run { setup in
            setup.simulator.script("tok:gone", .respond(status: 404, reason: "UNREGISTERED"))
            setup.simulator.script("tok:bad", .respond(status: 400, reason: "INVALID_ARGUMENT"))
            setup.simulator.script("tok:quota", .retryAfter(seconds: 17, times: 1))
            setup.simulator.script("tok:mismatch", .respond(status: 403, reason: "SENDER_ID_MISMATCH"))
            let gone = try await setup.client.send(try Self.message("tok:gone"), credential: "default")
            #expect(gone.status == 404 && gone.code == "UNREGISTERED")
            #expect(gone.verdict.responseClass == .tokenInvalid)
            let bad = try await setup.client.send(try Self.message("tok:bad"), credential: "default")
            #expect(bad.code == "INVALID_ARGUMENT" && bad.namesToken)
            #expect(bad.verdict.responseClass == .tokenInvalid)
            let quota = try await setup.client.send(try Self.message("tok:quota"), credential: "default")
            #expect(quota.status == 429 && quota.code == "QUOTA_EXCEEDED" && quota.retryAfter == "17")
            let decided = Decision.decide(
                quota.sendOutcome(at: Date()),
                attempt: 1,
                transportRetries: 0,
                policy: RetryPolicy(.init(), priority: 10, environment: [:]),
                transportBudget: 10
            )
            // A device over its rate: that job alone waits Retry-After, the credential goes on.
            #expect(!quota.projectQuota)
            #expect(decided.decision == .retry(after: .seconds(17)) && !decided.pausesCredential)
            let mismatch = try await setup.client.send(try Self.message("tok:mismatch"), credential: "default")
            #expect(mismatch.code == "SENDER_ID_MISMATCH" && mismatch.verdict.responseClass == .permanent)
        }
    }

    @Test(
        "an access token is replaced before it expires (5 minutes before, or half a short lifetime), and once for every caller holding a refused one"
    )
    func refreshBeforeExpiry() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("fcm-cache-\(UUID().uuidString)")
            .path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let account = try ServiceAccount.load(
            path: try SimulatorFCMAccount.make().write(in: directory, host: "localhost", port: 1)
        )
        let now = Mutex(Date(timeIntervalSince1970: 1_800_000_000))
        let exchanges = Mutex(0)
        let cache = AccessTokenCache(account: account, clock: WallClock({ now.withLock { $0 } })) { _, assertion in
            #expect(assertion.split(separator: ".").count == 3, "an RS256 JWT")
            let n = exchanges.withLock {
                $0 += 1
                return $0
            }
            return .init(token: "token-\(n)", grantedAt: now.withLock { $0 }, lifetime: 3600)
        }
        #expect(try await cache.token().token == "token-1")
        now.withLock { $0 += 3600 - 301 }
        #expect(try await cache.token().token == "token-1", "fresh until 5 minutes before it expires")
        now.withLock { $0 += 2 }
        #expect(try await cache.token().token == "token-2", "replaced before it expires")
        // A 401 for token-2: one replacement, and a caller still holding token-2 gets the same one.
        #expect(try await cache.replaceToken("token-2").token == "token-3")
        #expect(try await cache.replaceToken("token-2").token == "token-3")
        #expect(exchanges.withLock { $0 } == 3)
        // A short-lived token is fresh for half its life.
        let short = AccessTokenCache(account: account, clock: WallClock({ now.withLock { $0 } })) { _, _ in
            .init(token: "short", grantedAt: now.withLock { $0 }, lifetime: 100)
        }
        _ = try await short.token()
        #expect(short.exchangeCount == 1)
        now.withLock { $0 += 49 }
        _ = try await short.token()
        #expect(short.exchangeCount == 1)
        now.withLock { $0 += 2 }
        _ = try await short.token()
        #expect(short.exchangeCount == 2)
    }

    @Test("a key the token endpoint refuses is a credential refusal, never a send: nothing reaches the send endpoint")
    func refusedAccount() async throws {
        try await Self.run { setup in
            setup.simulator.refuseAccount(setup.account.clientEmail)
            do {
                _ = try await setup.client.send(try Self.message("tok:x"), credential: "default")
                Issue.record("sent with a refused account")
            } catch let error as TransportError {
                #expect(error.code == .credentialRefused)
                #expect(error.fault == .credentialRefused)
                #expect(!error.mayHaveBeenProcessed)
                #expect(!error.message.contains("eyJ"), "no JWT in the error: \(error.message)")
            }
            #expect(!setup.simulator.requests.contains { $0.path.hasSuffix("/messages:send") })
        }
    }

    @Test("the token endpoint refuses a JWT signed by another key than the account's: no access token is granted")
    func simulatorChecks() async throws {
        try await Self.run { setup in
            // Another account's key under the trusted account's name: the token endpoint refuses it.
            let impostor = try SimulatorFCMAccount.make(clientEmail: setup.account.clientEmail)
            let path = try impostor.write(
                in: setup.directory + "-impostor",
                host: "localhost",
                port: setup.simulator.port
            )
            defer { try? FileManager.default.removeItem(atPath: setup.directory + "-impostor") }
            var configuration = FCMClient.Configuration(
                endpointOverride: PushEndpoint(host: "localhost", port: setup.simulator.port),
                caFile: setup.directory + "-ca.pem"
            )
            configuration.requestTimeout = .seconds(5)
            let client = try FCMClient(
                configuration: configuration,
                accounts: ["default": try ServiceAccount.load(path: path)],
                logger: Fixture.logger
            )
            defer { Task { await client.shutdown() } }
            await #expect(throws: TransportError.self) {
                _ = try await client.send(try Self.message("tok:y"), credential: "default")
            }
            #expect(setup.simulator.faultCounters.accessTokenGrants == 0)
        }
    }

    @Test("a key file others can read, or one that is not a service account, is refused naming the file and the fix")
    func keyFileChecks() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("fcm-key-\(UUID().uuidString)")
            .path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = try SimulatorFCMAccount.make().write(in: directory, host: "localhost", port: 1)
        chmod(path, 0o644)
        #expect {
            try ServiceAccount.load(path: path)
        } throws: { error in
            "\(error)".contains(path) && "\(error)".contains("chmod 600")
        }
        chmod(path, 0o600)
        #expect(try ServiceAccount.load(path: path).projectID == "push-simulator")
        try #"{"type": "authorized_user", "client_id": "x"}"#.write(toFile: path, atomically: false, encoding: .utf8)
        #expect {
            try ServiceAccount.load(path: path)
        } throws: { error in
            "\(error)".contains("authorized_user") && "\(error)".contains("service account")
        }
        #expect {
            try ServiceAccount.load(path: directory + "/missing.json")
        } throws: { error in
            "\(error)".contains("Generate new private key")
        }
    }
}
