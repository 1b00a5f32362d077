import Foundation
import PushCore
import Testing

@Suite("describe(job): the exact request, and the pre-send checks")
struct RequestBuilderTests {
    static let token = String(repeating: "ab", count: 32)
    static let now = Date(timeIntervalSince1970: 1_800_000_000)

    func job(
        _ pushType: String = "alert",
        topic: String = "com.example.app",
        payload: String = #"{"aps":{"alert":"hi"}}"#,
        priority: Int? = nil,
        collapse: String? = nil,
        channel: String? = nil,
        expiresAt: Date? = nil
    ) -> PushJob {
        PushJob(
            id: 1,
            apnsID: UUID(uuidString: "6F8A2C1E-1111-4B5B-9C2D-0123456789AB")!,
            topic: topic,
            deviceToken: channel == nil ? Self.token : nil,
            channelID: channel,
            payload: payload,
            pushType: pushType,
            priority: priority,
            collapseID: collapse,
            expiresAt: expiresAt,
            runAt: Date(),
            createdAt: Date(),
            firstAttemptAt: Self.now
        )
    }

    static let shapes: [(PushType, String, String)] = [
        (.alert, "com.example.app", "10"), (.background, "com.example.app", "5"),
        (.liveactivity, "com.example.app.push-type.liveactivity", "5"), (.voip, "com.example.app.voip", "10"),
        (.complication, "com.example.app.complication", "10"),
        (.fileprovider, "com.example.app.pushkit.fileprovider", "10"),
        (.mdm, "com.example.app", "10"), (.location, "com.example.app.location-query", "10"),
        (.pushtotalk, "com.example.app.voip-ptt", "10"), (.widgets, "com.example.app.push-type.widgets", "10"),
        (.controls, "com.example.app.push-type.controls", "10"),
    ]

    @Test("path, topic suffix and default priority per push type", arguments: shapes)
    func wireShape(pushType: PushType, topic: String, priority: String) throws {
        let payload =
            pushType == .liveactivity
            ? #"{"aps":{"timestamp":1800000000,"event":"update","content-state":{"eta":5}}}"#
            : pushType == .mdm ? #"{"mdm":"token"}"# : #"{"aps":{"content-available":1}}"#
        let request = try RequestBuilder.describe(job(pushType.rawValue, payload: payload), now: Self.now)
        #expect(request.method == "POST")
        #expect(request.path == "/3/device/\(Self.token)")
        #expect(request.header("apns-push-type") == pushType.rawValue)
        #expect(request.header("apns-topic") == topic)
        #expect(request.header("apns-priority") == priority)
        #expect(request.header("apns-id") == "6f8a2c1e-1111-4b5b-9c2d-0123456789ab")
        #expect(
            request.header("apns-expiration") == String(Int(Self.now.timeIntervalSince1970) + 3600),
            "default expiry: 1 hour after the first attempt"
        )
        #expect(request.header("apns-collapse-id") == nil)
        #expect(request.header("authorization") == nil)
        #expect(request.limit == (pushType == .voip ? 5120 : 4096))
        #expect(request.byteCount == payload.utf8.count)
    }

    @Test("apns-id is the job's UUID in lowercase, for 2,000 random UUIDs (formatted from the bytes)")
    func apnsIDFormatting() throws {
        for _ in 0..<2_000 {
            var job = self.job()
            job.apnsID = UUID()
            let request = try RequestBuilder.describe(job, now: Self.now)
            let sent = request.headers.first { $0.name == "apns-id" }?.value
            #expect(sent == job.apnsID.uuidString.lowercased())
        }
    }

    @Test("headers: explicit priority, collapse id, expiration; broadcast has no apns-topic")
    func headers() throws {
        let expires = Self.now.addingTimeInterval(600)
        let request = try RequestBuilder.describe(
            job(priority: 5, collapse: "order-42", expiresAt: expires),
            now: Self.now
        )
        #expect(
            request.headers.map(\.name) == [
                "apns-push-type", "apns-topic", "apns-priority", "apns-expiration", "apns-collapse-id", "apns-id",
            ]
        )
        #expect(request.header("apns-priority") == "5")
        #expect(request.header("apns-collapse-id") == "order-42")
        #expect(request.header("apns-expiration") == String(Int(expires.timeIntervalSince1970)))

        let broadcast = try RequestBuilder.describe(
            job(
                "liveactivity",
                payload: #"{"aps":{"timestamp":1800000000,"event":"end"}}"#,
                channel: "dGVzdGNoYW5uZWw="
            ),
            now: Self.now
        )
        #expect(broadcast.path == "/4/broadcasts/apps/com.example.app")
        #expect(broadcast.header("apns-topic") == nil)
        #expect(broadcast.header("apns-channel-id") == "dGVzdGNoYW5uZWw=")
        #expect(broadcast.limit == 5120)
        // Apple's broadcast page: the id travels as apns-request-id; apns-id is a device-send header.
        #expect(broadcast.header("apns-id") == nil)
        #expect(broadcast.header("apns-request-id") == broadcast.apnsID.uuidString.lowercased())
    }

    static let warningCases: [(String, String, [String])] = [
        // (push type, payload, expected warning codes)
        ("alert", #"{"aps":{"alert":"hi","mutable-content":1}}"#, []),
        ("alert", #"{"aps":{"alert":{"title":"t"},"mutable-content":1}}"#, []),
        ("background", #"{"aps":{"content-available":1,"mutable-content":1}}"#, ["PW101"]),
        ("alert", #"{"aps":{"alert":"","mutable-content":1}}"#, ["PW101"]),
        ("alert", #"{"aps":{"alert":{"sound":"x"},"mutable-content":1}}"#, ["PW101"]),
        ("alert", #"{"aps":{"alert":"hi","interruption-level":"time-sensitive"}}"#, []),
        ("alert", #"{"aps":{"alert":"hi","interruption-level":"urgent"}}"#, ["PW102"]),
        ("alert", #"{"aps":{"alert":"hi","interruption-level":2}}"#, ["PW102"]),
        ("alert", #"{"aps":{"alert":"hi","relevance-score":0.5}}"#, []),
        ("alert", #"{"aps":{"alert":"hi","relevance-score":75}}"#, ["PW103"]),
        ("alert", #"{"aps":{"alert":"hi","relevance-score":"high"}}"#, ["PW103"]),
        ("liveactivity", #"{"aps":{"timestamp":1800000000,"event":"end","relevance-score":75}}"#, []),
        (
            "alert", #"{"aps":{"alert":"","mutable-content":1,"interruption-level":"loud","relevance-score":-1}}"#,
            ["PW101", "PW102", "PW103"]
        ),
        // A background push is content-available only.
        ("background", #"{"aps":{"content-available":1}}"#, []),
        ("background", #"{"aps":{"content-available":1,"alert":"hi"}}"#, ["PW104"]),
        ("background", #"{"aps":{"content-available":1,"badge":3,"sound":"default"}}"#, ["PW104"]),
        // A push-to-start without an alert is not shown; a timestamp over 8 hours ahead is dropped.
        (
            "liveactivity",
            #"{"aps":{"timestamp":1800000000,"event":"start","content-state":{},"attributes-type":"A","attributes":{},"alert":{"title":"t","body":"b"}}}"#,
            []
        ),
        (
            "liveactivity",
            #"{"aps":{"timestamp":1800000000,"event":"start","content-state":{},"attributes-type":"A","attributes":{}}}"#,
            ["PW105"]
        ),
        ("liveactivity", #"{"aps":{"timestamp":1800028000,"event":"update","content-state":{}}}"#, []),
        ("liveactivity", #"{"aps":{"timestamp":1800030000,"event":"update","content-state":{}}}"#, ["PW106"]),
        // A critical alert's sound dictionary.
        ("alert", #"{"aps":{"alert":"hi","sound":{"critical":1,"name":"default","volume":0.8}}}"#, []),
        ("alert", #"{"aps":{"alert":"hi","sound":{"critical":1,"name":"default","volume":2}}}"#, ["PW107"]),
        ("alert", #"{"aps":{"alert":"hi","sound":{"critical":"yes","name":"default"}}}"#, ["PW107"]),
        ("alert", #"{"aps":{"alert":"hi","sound":{"critical":1,"volume":0.5}}}"#, ["PW107"]),
    ]

    @Test("payload warnings: sent anyway, each with its PW code and a sentence", arguments: Self.warningCases)
    func warnings(_ testCase: (String, String, [String])) throws {
        let (pushType, payload, expected) = testCase
        let request = try RequestBuilder.describe(
            job(pushType, payload: payload, priority: pushType == "background" ? 5 : nil),
            now: Self.now
        )
        #expect(request.warnings.map(\.trapID.rawValue) == expected, "\(payload)")
        for warning in request.warnings { #expect(warning.message.contains("aps.")) }
    }

    static let rejections: [(String, String, String, String?, Int?)] = [
        // (push type, topic, payload, expected trap, priority)
        ("alert", "com.example.app.voip", #"{"aps":{}}"#, "MS018", nil),
        (
            "liveactivity", "com.example.app.push-type.liveactivity", #"{"aps":{"timestamp":1,"event":"end"}}"#,
            "MS018", nil
        ),
        (
            "alert", "com.example.app", "{\"aps\":{\"alert\":\"" + String(repeating: "x", count: 4100) + "\"}}",
            "MS011", nil
        ),
        (
            "liveactivity", "com.example.app",
            #"{"aps":{"timestamp":1800000000000,"event":"update","content-state":{}}}"#, "MS032", nil
        ),
        (
            "liveactivity", "com.example.app",
            #"{"aps":{"timestamp":1800000000,"event":"update","content-state":{},"stale-date":1.5}}"#, "MS032", nil
        ),
        (
            "liveactivity", "com.example.app",
            #"{"aps":{"timestamp":1800000000,"event":"update","content-state":{},"dismissal-date":-3}}"#, "MS032", nil
        ),
        ("background", "com.example.app", #"{"aps":{"content-available":1}}"#, "MS015", 10),
    ]

    @Test("a broadcast carries update and end only: a start on a channel is refused before sending")
    func broadcastStart() throws {
        let start =
            #"{"aps":{"timestamp":1800000000,"event":"start","content-state":{},"attributes-type":"A","attributes":{},"alert":"hi"}}"#
        do {
            _ = try RequestBuilder.describe(job("liveactivity", payload: start, channel: "dGVzdA=="), now: Self.now)
            Issue.record("a broadcast start was not refused")
        } catch {
            #expect(error.reason == "BroadcastStart" && error.trapID == .channel)
            #expect(error.message.contains("update and end"))
        }
        // The same start to a device token is a push-to-start: sent.
        #expect(throws: Never.self) {
            try RequestBuilder.describe(self.job("liveactivity", payload: start), now: Self.now)
        }
    }

    @Test("an FCM registration token in device_token is named as one, with the fix")
    func fcmTokenInDeviceToken() {
        let fcm = "dQw4w9WgXcQ:APA91bHun4MxP5egoKMwt2KZFBaFUH-1RYqx" + String(repeating: "AbC_d-9", count: 20)
        #expect(RequestBuilder.looksLikeFCMToken(fcm))
        #expect(!RequestBuilder.looksLikeFCMToken(String(repeating: "ab", count: 32)))
        var fcmJob = self.job()
        fcmJob.deviceToken = fcm
        do {
            _ = try RequestBuilder.describe(fcmJob, now: Self.now)
            Issue.record("an FCM token was not refused")
        } catch {
            #expect(error.message.contains("looks like an FCM registration token"))
            #expect(error.message.contains("platform = 'fcm'"))
        }
    }

    @Test("pre-send rejections carry their trap id and a sentence that names the fix", arguments: rejections)
    func rejected(pushType: String, topic: String, payload: String, trap: String?, priority: Int?) {
        #expect(throws: PreSendRejection.self) {
            try RequestBuilder.describe(
                job(pushType, topic: topic, payload: payload, priority: priority),
                now: Self.now
            )
        }
        do {
            _ = try RequestBuilder.describe(
                job(pushType, topic: topic, payload: payload, priority: priority),
                now: Self.now
            )
        } catch {
            #expect(error.trapID?.rawValue == trap)
            #expect(error.message.count > 20)
            #expect(!error.message.contains(Self.token))
        }
    }

    @Test("other pre-send rejections: expired, non-hex token, Live Activity fields, empty payload")
    func otherRejections() {
        func reason(_ job: PushJob) -> String? {
            do {
                _ = try RequestBuilder.describe(job, now: Self.now)
                return nil
            } catch { return error.reason }
        }
        #expect(reason(job(expiresAt: Self.now.addingTimeInterval(-1))) == "Expired")
        var badToken = job()
        badToken.deviceToken = "not-hex!"
        #expect(reason(badToken) == "BadDeviceToken")
        #expect(
            reason(
                job("liveactivity", payload: #"{"aps":{"timestamp":1800000000,"event":"start","content-state":{}}}"#)
            ) == "InvalidLiveActivityPayload"
        )
        #expect(reason(job("liveactivity", payload: #"{"aps":{"event":"update"}}"#)) == "InvalidLiveActivityPayload")
        #expect(reason(job(payload: "")) == "PayloadEmpty")
        #expect(reason(job(payload: #"{"alert":"no aps"}"#)) == "InvalidPayload")
        #expect(reason(job(collapse: String(repeating: "é", count: 33))) == "BadCollapseId")
        #expect(reason(job("alert", channel: "Y2g=")) == "InvalidPushType")
        // The exact limits: 4096 bytes pass, 4097 do not.
        let fill = 4096 - #"{"aps":{"alert":""}}"#.utf8.count
        #expect(reason(job(payload: "{\"aps\":{\"alert\":\"" + String(repeating: "x", count: fill) + "\"}}")) == nil)
        #expect(
            reason(job(payload: "{\"aps\":{\"alert\":\"" + String(repeating: "x", count: fill + 1) + "\"}}"))
                == "PayloadTooLarge"
        )
    }

    @Test("jsonb's rendering (a space after every : and ,) is sent compact, and the limit judges the compact bytes")
    func compactPayload() throws {
        // About 3,800 compact bytes; Postgres prints this payload back with spaces and it used to die MS011.
        let items = (0..<300).map { "\"k\($0)\": \($0)" }.joined(separator: ", ")
        let rendered =
            #"{"aps": {"alert": {"body": "a: b, \"c\": d"}}, "#
            + "\"data\": {\(items)}, \"pad\": \"\(String(repeating: "x", count: 500))\"}"
        let compact = rendered.utf8.count - CompactJSON.bytes(rendered).count
        #expect(compact > 500, "the rendering carries hundreds of wasted bytes")
        let request = try RequestBuilder.describe(job(payload: rendered), now: Self.now)
        #expect(request.body == CompactJSON.bytes(rendered) && request.body.count <= 4096)
        #expect(rendered.utf8.count > 4096)
        let sent = try JSONSerialization.jsonObject(with: Data(request.body)) as? NSDictionary
        let original = try JSONSerialization.jsonObject(with: Data(rendered.utf8)) as? NSDictionary
        #expect(sent == original, "the same JSON, strings untouched")
        #expect(String(decoding: request.body, as: UTF8.self).contains(#""a: b, \"c\": d""#))
    }
}
