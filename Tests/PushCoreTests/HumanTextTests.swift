import PushCore
import Testing

@Suite("Durations and untrusted text for people: one rule for the CLI and the console")
struct HumanTextTests {
    @Test("typed durations: a number and one unit, up to the maximum; anything else refused")
    func typed() {
        #expect(HumanText.seconds(from: "90s") == 90)
        #expect(HumanText.seconds(from: " 15M ") == 900)
        #expect(HumanText.seconds(from: "1.5h") == 5400)
        #expect(HumanText.seconds(from: "2w") == 1_209_600)
        #expect(HumanText.seconds(from: "0s") == 0)
        for bad in ["", "s", "10", "-1h", "1y", "nanh", "infd", "1e400s", "9999999999999d"] {
            #expect(HumanText.seconds(from: bad) == nil, "\(bad)")
        }
        #expect(HumanText.seconds(from: "11d", maximum: 10 * 86_400) == nil)
    }

    @Test("durations shown with less precision as they grow")
    func shown() {
        #expect(HumanText.duration(0.85) == "850 ms")
        #expect(HumanText.duration(4.21) == "4.2 s")
        #expect(HumanText.duration(180) == "3 min")
        #expect(HumanText.duration(5 * 3600) == "5.0 h")
        #expect(HumanText.duration(2 * 86_400) == "2.0 d")
    }

    @Test(
        "control characters and bidirectional overrides escaped; line breaks kept for a terminal, escaped for a log line"
    )
    func escaped() {
        #expect(HumanText.escaped("plain") == "plain")
        #expect(HumanText.escaped("a\u{1B}[2Jb") == "a\\u{1B}[2Jb")
        #expect(HumanText.escaped("x\u{202E}y\u{9B}") == "x\\u{202E}y\\u{9B}")
        #expect(HumanText.escaped("one\ntwo\tthree") == "one\ntwo\tthree")
        #expect(HumanText.escaped("one\ntwo\tthree", for: .logLine) == "one\\ntwo\\tthree")
        // A log line hides nothing: zero-width space, soft hyphen, a tag character, a byte-order mark.
        #expect(
            HumanText.escaped("a\u{200B}b\u{AD}c\u{E0041}d\u{FEFF}", for: .logLine)
                == "a\\u{200B}b\\u{AD}c\\u{E0041}d\\u{FEFF}"
        )
        // A terminal keeps emoji joined by U+200D.
        #expect(HumanText.escaped("👩\u{200D}💻") == "👩\u{200D}💻")
    }
}
