import APNsSimulator
import Foundation
import PushCore
import Testing

@testable import PushTransport

@Suite("APNs transport against the simulator over real TLS and HTTP/2")
struct TransportTests {
    @Test("a delivered alert: the wire request and the parsed answer")
    func delivered() async throws {
        try await Fixture.run { f in
            let token = Fixture.token()
            let apnsID = UUID()
            let response = try await f.send(try Fixture.alert(token, apnsID: apnsID))
            #expect(response.status == 200)
            #expect(response.apnsID == apnsID)
            #expect(response.apnsUniqueID != nil)
            #expect(response.verdict.responseClass == .delivered)
            let recorded = try #require(f.simulator.requests.last)
            #expect(recorded.method == "POST")
            #expect(recorded.path == "/3/device/\(token)")
            #expect(recorded.headers["apns-topic"] == "com.example.app")
            #expect(recorded.headers["apns-push-type"] == "alert")
            #expect(recorded.headers["apns-priority"] == "10")
            #expect(recorded.headers["apns-id"] == apnsID.uuidString.lowercased())
            #expect(recorded.headers["apns-expiration"] != nil)
            #expect(recorded.hadAuthorization)
            #expect(String(decoding: recorded.body, as: UTF8.self) == #"{"aps":{"alert":"hello"}}"#)
        }
    }

    @Test("each push type reaches APNs with its topic suffix and default priority")
    func wireShapePerPushType() async throws {
        try await Fixture.run { f in
            for (pushType, suffix, priority) in [
                ("background", "", "5"), ("voip", ".voip", "10"), ("complication", ".complication", "10"),
                ("location", ".location-query", "10"), ("pushtotalk", ".voip-ptt", "10"),
                ("widgets", ".push-type.widgets", "10"), ("fileprovider", ".pushkit.fileprovider", "10"),
            ] {
                let response = try await f.send(
                    try Fixture.alert(Fixture.token(), pushType: pushType, payload: #"{"aps":{"content-available":1}}"#)
                )
                #expect(response.status == 200, "\(pushType): \(response.reason ?? "")")
                let recorded = try #require(f.simulator.requests.last)
                #expect(recorded.headers["apns-topic"] == "com.example.app" + suffix)
                #expect(recorded.headers["apns-priority"] == priority)
            }
        }
    }

    @Test(
        "scripted answers come back classified; 410 carries its exact millisecond timestamp; unknown reasons stay raw"
    )
    func classifiedAnswers() async throws {
        try await Fixture.run { f in
            let cases: [(SimulatorBehaviour, Int, String?, APNsResponseClass, String?)] = [
                (.unregistered(timestampMs: 1_700_000_000_123), 410, "Unregistered", .tokenInvalid, "MS020"),
                (.respond(status: 400, reason: "BadDeviceToken"), 400, "BadDeviceToken", .tokenInvalid, "MS014"),
                (.respond(status: 503, reason: "ServiceUnavailable"), 503, "ServiceUnavailable", .retryable, nil),
                (.respond(status: 403, reason: "Forbidden"), 403, "Forbidden", .credentialFatal, "MS030"),
                (.respond(status: 400, reason: "FeatureNotEnabled"), 400, "FeatureNotEnabled", .permanent, "MS034"),
                (.respond(status: 400, reason: "BrandNewReason"), 400, "BrandNewReason", .unknown, nil),
                (.retryAfter(seconds: 7, times: 1), 429, "TooManyRequests", .retryable, "MS015"),
            ]
            for (behaviour, status, reason, responseClass, trap) in cases {
                let token = Fixture.token()
                f.simulator.script(token, behaviour)
                let response = try await f.send(try Fixture.alert(token))
                #expect(response.status == status)
                #expect(response.reason == reason)
                #expect(response.verdict.responseClass == responseClass)
                #expect(response.verdict.trapID?.rawValue == trap)
                if status == 410 { #expect(response.timestampMs == 1_700_000_000_123) }
                if status == 429 { #expect(RetryAfter.parse(response.retryAfter, now: Date()) == .seconds(7)) }
            }
        }
    }

    @Test("the simulator validates like APNs: bad topic suffix, bad priority, oversize payload, bad token")
    func simulatorValidation() async throws {
        try await Fixture.run { f in
            var request = try Fixture.alert(Fixture.token())
            request.headers = request.headers.map { $0.name == "apns-topic" ? ($0.name, "com.example.app.voip") : $0 }
            #expect(try await f.send(request).reason == "BadTopic")
            request = try Fixture.alert(
                Fixture.token(),
                pushType: "background",
                payload: #"{"aps":{"content-available":1}}"#
            )
            request.headers = request.headers.map { $0.name == "apns-priority" ? ($0.name, "10") : $0 }
            #expect(try await f.send(request).reason == "BadPriority")
            request = try Fixture.alert(Fixture.token())
            request.body = Array(("{\"aps\":{\"alert\":\"" + String(repeating: "x", count: 5000) + "\"}}").utf8)
            let large = try await f.send(request)
            #expect(large.status == 413 && large.verdict.trapID == .payloadTooLarge)
            request = try Fixture.alert(Fixture.token())
            request.path = "/3/device/xyz"
            #expect(try await f.send(request).reason == "BadDeviceToken")
        }
    }

    @Test("the same apns-id goes out on every retry of a job")
    func sameAPNsIDOnRetries() async throws {
        try await Fixture.run { f in
            let token = Fixture.token()
            f.simulator.script(token, .failThenSucceed(times: 2, status: 503, reason: "ServiceUnavailable"))
            let request = try Fixture.alert(token)
            var statuses: [Int] = []
            for _ in 0..<3 { statuses.append(try await f.send(request).status) }
            #expect(statuses == [503, 503, 200])
            let ids = f.simulator.requests.filter { $0.deviceToken == token }.map { $0.headers["apns-id"] }
            #expect(ids.count == 3 && Set(ids).count == 1 && ids[0] == request.apnsID.uuidString.lowercased())
        }
    }

    @Test("a hung stream hits its deadline and the connection stays usable")
    func deadline() async throws {
        try await Fixture.run(client: { $0.requestTimeout = .milliseconds(1_500) }) { f in
            let hung = Fixture.token()
            f.simulator.script(hung, .hang)
            // The connection opens first, outside the 1.5 s deadline (a TLS handshake and a mint on a loaded
            // machine running other tests can take longer than that).
            await f.client.warmUp(credentials: ["default"], timeout: .seconds(30))
            #expect(f.client.openConnections == 1)
            let clock = ContinuousClock()
            let start = clock.now
            await #expect(throws: TransportError.self) { _ = try await f.send(try Fixture.alert(hung)) }
            do { _ = try await f.send(try Fixture.alert(hung)) } catch let error as TransportError {
                #expect(error.code == .timeout)
                #expect(error.mayHaveBeenProcessed)
                #expect(APNsVerdict.classify(status: nil, reason: error.reason).responseClass == .retryable)
            }
            // Each of the two ends at its deadline (1.5 s), after its last look (0.3 s) and, on a machine loaded
            // enough for the stall detector to report a pause, a stall's grace (2 s): under 12 s, not hung.
            #expect(clock.now - start < .seconds(12))
            #expect(try await f.send(try Fixture.alert(Fixture.token())).status == 200)
            #expect(f.simulator.connectionsAccepted == 1)
        }
    }

    @Test("no key configured for a credential: MS028 credentials missing, nothing sent")
    func credentialsMissing() async throws {
        try await Fixture.run { f in
            do {
                _ = try await f.client.send(try Fixture.alert(Fixture.token()), credential: "other-team")
                Issue.record("expected credentialsMissing")
            } catch let error as TransportError {
                #expect(error.code == .credentialsMissing)
                #expect(!error.mayHaveBeenProcessed)
                #expect(error.message.contains("other-team"))
            }
            #expect(f.simulator.requests.isEmpty)
        }
    }
}
