import Foundation
import PushCore
import Testing

/// Every Live Activity rule, each with the sentence its dead letter gets, and complete payloads accepted.
@Suite("Live Activity payload rules")
struct LiveActivityRuleTests {
    static let now = Date(timeIntervalSince1970: 1_800_000_000)

    static func job(_ aps: String, channel: Bool = false) -> PushJob {
        PushJob(
            id: 1,
            apnsID: UUID(),
            topic: "com.example.app",
            deviceToken: channel ? nil : String(repeating: "ab", count: 32),
            channelID: channel ? "dGVzdA==" : nil,
            payload: #"{"aps":\#(aps)}"#,
            pushType: "liveactivity",
            runAt: Date(),
            createdAt: Date(),
            firstAttemptAt: Self.now
        )
    }

    /// (aps, reason, trap id, words the sentence must contain)
    static let refused: [(String, String, String?, String)] = [
        (#"{"event":"update","content-state":{}}"#, "InvalidLiveActivityPayload", nil, "aps.timestamp"),
        (#"{"timestamp":1700000000,"content-state":{}}"#, "InvalidLiveActivityPayload", nil, "aps.event"),
        (
            #"{"timestamp":1700000000,"event":"pause","content-state":{}}"#, "InvalidLiveActivityPayload", nil,
            "start, update or end"
        ),
        (#"{"timestamp":1700000000,"event":"update"}"#, "InvalidLiveActivityPayload", nil, "aps.content-state"),
        (
            #"{"timestamp":1700000000,"event":"start","content-state":{},"attributes":{}}"#,
            "InvalidLiveActivityPayload", nil, "aps.attributes-type"
        ),
        (
            #"{"timestamp":1700000000,"event":"start","content-state":{},"attributes-type":"Score"}"#,
            "InvalidLiveActivityPayload", nil, "aps.attributes"
        ),
        (#"{"timestamp":1700000000000,"event":"end"}"#, "BadTimestamp", "MS032", "milliseconds"),
        (
            #"{"timestamp":1700000000,"event":"end","dismissal-date":1700000000000}"#, "BadTimestamp", "MS032",
            "dismissal-date"
        ),
        (
            #"{"timestamp":1700000000,"event":"update","content-state":{},"stale-date":1700000000000}"#,
            "BadTimestamp", "MS032", "stale-date"
        ),
        (#"{"timestamp":"1700000000","event":"end"}"#, "BadTimestamp", "MS032", "not a number"),
        (#"{"timestamp":1700000000.5,"event":"end"}"#, "BadTimestamp", "MS032", "whole number"),
    ]

    @Test("each rule refuses with its reason, trap id and a sentence that names the field", arguments: refused)
    func refusedWithSentence(aps: String, reason: String, trap: String?, words: String) {
        do {
            _ = try RequestBuilder.describe(Self.job(aps), now: Self.now)
            Issue.record("accepted: \(aps)")
        } catch {
            #expect(error.reason == reason)
            #expect(error.trapID?.rawValue == trap)
            #expect(error.message.contains(words), "\(error.message)")
        }
    }

    static let accepted: [String] = [
        // A complete push-to-start: alert, attributes-type, attributes, content-state, input-push-token.
        #"{"timestamp":1700000000,"event":"start","content-state":{"score":0},"attributes-type":"ScoreAttributes","attributes":{"team":"A"},"alert":{"title":"Kick-off","body":"The match started"},"input-push-token":1}"#,
        // A push-to-start that subscribes the activity to a broadcast channel.
        #"{"timestamp":1700000000,"event":"start","content-state":{"score":0},"attributes-type":"ScoreAttributes","attributes":{"team":"A"},"alert":{"title":"Kick-off","body":"The match started"},"input-push-channel":"dGVzdA=="}"#,
        #"{"timestamp":1700000000,"event":"update","content-state":{"score":1},"stale-date":1700003600,"relevance-score":0.5}"#,
        #"{"timestamp":1700000000,"event":"end","dismissal-date":1700003600}"#,
    ]

    @Test(
        "complete start, update and end payloads are accepted, at priority 5 with the liveactivity suffix",
        arguments: accepted
    )
    func acceptedPayloads(aps: String) throws {
        let request = try RequestBuilder.describe(Self.job(aps), now: Self.now)
        let headers = Dictionary(request.headers.map { ($0.name, $0.value) }, uniquingKeysWith: { $1 })
        #expect(headers["apns-topic"] == "com.example.app.push-type.liveactivity")
        #expect(headers["apns-priority"] == "5")
    }

    @Test("a broadcast update goes to the channel path with apns-expiration 0 when it has no expires_at")
    func broadcastUpdate() throws {
        let request = try RequestBuilder.describe(
            Self.job(#"{"timestamp":1700000000,"event":"update","content-state":{}}"#, channel: true),
            now: Self.now
        )
        let headers = Dictionary(request.headers.map { ($0.name, $0.value) }, uniquingKeysWith: { $1 })
        #expect(request.path == "/4/broadcasts/apps/com.example.app")
        #expect(headers["apns-channel-id"] == "dGVzdA==" && headers["apns-expiration"] == "0")
        #expect(headers["apns-topic"] == nil)
    }
}
