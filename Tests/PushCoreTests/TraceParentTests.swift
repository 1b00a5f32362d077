import Testing

@testable import PushCore

@Suite("traceparent: read as the W3C recommendation says")
struct TraceParentTests {
    @Test("valid headers parse; malformed, all-zero and version ff ones do not")
    func parse() throws {
        let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        let parsed = try #require(TraceParent(header))
        #expect(parsed.traceID == "4bf92f3577b34da6a3ce929d0e0e4736" && parsed.parentID == "00f067aa0ba902b7")
        #expect(parsed.sampled && parsed.description == header)
        #expect(TraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")?.sampled == false)
        // A later version may add fields; they are ignored.
        #expect(TraceParent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra") != nil)
        for bad in [
            "", "garbage", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            #expect(TraceParent(bad) == nil, "\(bad)")
        }
    }
}
