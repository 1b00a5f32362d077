import Foundation
import Testing

@testable import PushCore

/// The byte scanner's fast path must agree with the full `JSONSerialization` check on every payload: the
/// same rejection, or the same warnings. Random JSON (valid, then mutated into every kind of broken), with
/// its seed printed; `PUSH_PAYLOAD_SEED=N` replays one.
struct PayloadShapeTests {
    struct SplitMix: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            self.state &+= 0x9E37_79B9_7F4A_7C15
            var z = self.state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    static let keys = [
        "aps", "alert", "title", "body", "badge", "sound", "mutable-content", "interruption-level",
        "relevance-score", "content-available", "x", "a\\u0070s", "ap\\\"s", "", "é", "thread-id",
        // The full parse drops a leading byte-order mark from a key: to it these are aps and mutable-content.
        "\u{FEFF}aps", "\u{FEFF}mutable-content", "\u{FEFF}relevance-score", "apś",
    ]

    static func string(_ g: inout SplitMix) -> String {
        let pieces = ["hi", "Order shipped", "\\n", "\\\"", "\\u00e9", "\\ud83d\\ude00", "é", "😀", " ", "\\/", "a\\tb"]
        return "\"" + (0..<Int.random(in: 0...3, using: &g)).map { _ in pieces.randomElement(using: &g)! }.joined()
            + "\""
    }

    static func number(_ g: inout SplitMix) -> String {
        [
            "0", "1", "-1", "10", "0.5", "1.25", "1e3", "2E-2", "12345678901234567", "-0", "3.0", "1000000",
            "123456789012345", "1234567890123456", "0.00000000000001", "01", "1.", "-", "1.5e",
        ].randomElement(
            using: &g
        )!
    }

    static func value(_ g: inout SplitMix, depth: Int) -> String {
        switch Int.random(in: 0..<(depth > 3 ? 5 : 8), using: &g) {
        case 0: return string(&g)
        case 1: return number(&g)
        case 2: return ["true", "false", "null"].randomElement(using: &g)!
        case 3, 4: return string(&g)
        case 5, 6: return object(&g, depth: depth + 1)
        default:
            return "["
                + (0..<Int.random(in: 0...3, using: &g)).map { _ in value(&g, depth: depth + 1) }
                .joined(separator: Bool.random(using: &g) ? "," : ", ") + "]"
        }
    }

    static func object(_ g: inout SplitMix, depth: Int) -> String {
        "{"
            + (0..<Int.random(in: 0...4, using: &g)).map { _ in
                "\"\(keys.randomElement(using: &g)!)\":" + (Bool.random(using: &g) ? " " : "")
                    + value(&g, depth: depth + 1)
            }.joined(separator: ",") + "}"
    }

    /// A payload: usually an object with an `aps` object, sometimes not; sometimes broken afterwards.
    static func payload(_ g: inout SplitMix) -> String {
        var text: String
        switch Int.random(in: 0..<10, using: &g) {
        case 0: text = value(&g, depth: 0)
        case 1: text = object(&g, depth: 0)
        default:
            text =
                "{\"aps\":" + object(&g, depth: 1)
                + (Bool.random(using: &g) ? "" : ",\"custom\":" + value(&g, depth: 1))
                + "}"
        }
        if Int.random(in: 0..<4, using: &g) == 0, !text.isEmpty {
            var bytes = Array(text.utf8)
            let at = Int.random(in: 0..<bytes.count, using: &g)
            switch Int.random(in: 0..<4, using: &g) {
            case 0: bytes.remove(at: at)
            case 1: bytes.insert(Array("{}[]\":,\\ x0".utf8).randomElement(using: &g)!, at: at)
            case 2: bytes = Array(bytes[..<at])
            default: bytes.insert(0x01, at: at)
            }
            text = String(decoding: bytes, as: UTF8.self)
        }
        return text
    }

    static func outcome(_ body: [UInt8], _ pushType: PushType, fast: Bool) -> String {
        do {
            let warnings =
                fast
                ? try PayloadRules.check(body, pushType: pushType)
                : try PayloadRules.checkByParsing(body, pushType: pushType)
            return "ok " + warnings.map(\.trapID.rawValue).joined(separator: ",")
        } catch {
            return "rejected " + error.reason
        }
    }

    @Test func theFastPathAgreesWithTheFullParseOnRandomPayloads() {
        let seed =
            ProcessInfo.processInfo.environment["PUSH_PAYLOAD_SEED"].flatMap { UInt64($0) }
            ?? UInt64.random(in: 0...UInt64.max)
        print("payload shape seed \(seed) (PUSH_PAYLOAD_SEED=\(seed) replays it)")
        var g = SplitMix(state: seed)
        var fastAnswers = 0
        for _ in 0..<20_000 {
            let text = Self.payload(&g)
            // Mostly as the worker sends it (compacted), sometimes with its whitespace and nesting as written.
            var body = Bool.random(using: &g) ? CompactJSON.bytes(text) : Array(text.utf8)
            if Int.random(in: 0..<50, using: &g) == 0 {
                let depth = Int.random(in: 60...70, using: &g)
                body = Array(
                    ("{\"aps\":{\"x\":" + String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
                        + "}}").utf8
                )
            }
            let pushType = [PushType.alert, .background, .voip, .liveactivity, .mdm].randomElement(using: &g)!
            let fast = Self.outcome(body, pushType, fast: true)
            let full = Self.outcome(body, pushType, fast: false)
            #expect(fast == full, "seed \(seed), \(pushType): \(text)")
            if fast != full { return }
            if PayloadShape.scan(body) != nil { fastAnswers += 1 }
        }
        // The generator reaches the fast path often, or the comparison proves little.
        #expect(fastAnswers > 5_000, "only \(fastAnswers) payloads took the fast path")
    }

    @Test(arguments: [
        ("{\"aps\":{\"alert\":\"hi\"}}", true),
        ("{\"aps\":{}}", true),
        ("{\"aps\":{\"alert\":{\"title\":\"a\",\"body\":\"b\"},\"badge\":1},\"x\":[1,2,{\"k\":null}]}", true),
        ("{\"aps\":{\"mutable-content\":1}}", false),
        ("{\"aps\":{}, \"aps\":{}}", false),
        ("{\"a\\u0070s\":{}}", false),
        ("{\"aps\":{\"alert\":\"hi\"}", false),
        ("{\"aps\":{\"n\":1e400}}", false),
        ("[\"aps\"]", false),
        ("{\"aps\":{\"s\":\"\\ud800\"}}", false),
        ("{\"aps\":{}} x", false),
        ("{\"aps\":{\"alert\":\"hi\"},\"\u{FEFF}aps\":1}", false),
        ("{\"aps\":{\"\u{FEFF}mutable-content\":1}}", false),
        (" {\"aps\":{ \"alert\" : \"hi\" }}\n", true),
    ])
    func scannerAnswersOnlyWhenSure(_ text: String, _ fast: Bool) {
        let shape = PayloadShape.scan(Array(text.utf8))
        let tookFastPath =
            shape.map { shape in
                shape.apsIsObject
                    && !shape.apsKeys.contains { key in PayloadRules.keysWorthAParse.contains { key.elementsEqual($0) }
                    }
            } ?? false
        #expect(tookFastPath == fast, "\(text)")
    }
}

/// The topic-suffix check's byte search gives Foundation's answer (which matches by canonical equivalence:
/// non-ASCII topics still go through it).
@Test(arguments: [
    "com.example.app", "com.example.app.push-type.liveactivity", "com.example.app.voip",
    "com.example.push-type.\u{301}x",
    "a.push-type.b.push-type.c", ".push-type.", "com.exämple.push-type.x", "push-type", "",
])
func topicSuffixSearchGivesFoundationsAnswer(_ topic: String) {
    #expect(PushType.suffix(in: topic) == foundationsTopicSuffix(topic), "\(topic)")
}

func foundationsTopicSuffix(_ topic: String) -> String? {
    PushType.knownTopicSuffixes.first(where: { topic.hasSuffix($0) })
        ?? topic.range(of: ".push-type.").map { String(topic[$0.lowerBound...]) }
}

/// Random topics built from the pieces that matter (dots, the marker, known suffixes, a combining accent)
/// give Foundation's answer; the seed is printed, `PUSH_PAYLOAD_SEED=N` replays it.
@Test func randomTopicsGiveFoundationsAnswer() {
    let seed =
        ProcessInfo.processInfo.environment["PUSH_PAYLOAD_SEED"].flatMap { UInt64($0) }
        ?? UInt64.random(in: 1...999_999)
    print("topic suffix seed \(seed) (PUSH_PAYLOAD_SEED=\(seed) replays it)")
    var random = PayloadShapeTests.SplitMix(state: seed)
    let pieces = [
        "com", "example", ".", "app", ".push-type.", "push-type", ".voip", "voip", ".complication", "liveactivity",
        ".push-type.liveactivity", "\u{301}", "é", "-", "x", "",
    ]
    for _ in 0..<5_000 {
        let topic = (0..<Int.random(in: 0...6, using: &random)).map { _ in pieces.randomElement(using: &random)! }
            .joined()
        #expect(PushType.suffix(in: topic) == foundationsTopicSuffix(topic), "seed \(seed): \(topic)")
    }
}
