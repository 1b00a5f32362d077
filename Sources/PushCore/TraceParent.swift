/// A W3C trace context `traceparent` (https://www.w3.org/TR/trace-context/#traceparent-header), as producers
/// set it on a job: `<version>-<trace id>-<parent id>-<flags>`, lowercase hex.
public struct TraceParent: Sendable, Hashable, CustomStringConvertible {
    /// 32 hex digits, not all zero.
    public var traceID: String
    /// The producer's span: 16 hex digits, not all zero.
    public var parentID: String
    /// 2 hex digits; bit 0 is "sampled".
    public var flags: String

    /// Parses a header value the way the W3C recommendation says a receiver must: version `ff` and all-zero
    /// ids are invalid; version `00` is exactly 55 characters; a later version may carry more fields after a
    /// dash, which are ignored. `nil` when invalid (the job is sent untraced).
    public init?(_ value: String) {
        let text = value.trimmingCharacters(in: [" ", "\t"])
        let bytes = Array(text.utf8)
        guard bytes.count >= 55 else { return nil }
        let version = String(decoding: bytes[0..<2], as: UTF8.self)
        guard Self.isHex(version), version != "ff" else { return nil }
        guard version != "00" || bytes.count == 55 else { return nil }
        guard bytes[2] == UInt8(ascii: "-"), bytes[35] == UInt8(ascii: "-"), bytes[52] == UInt8(ascii: "-") else {
            return nil
        }
        guard bytes.count == 55 || bytes[55] == UInt8(ascii: "-") else { return nil }
        self.traceID = String(decoding: bytes[3..<35], as: UTF8.self)
        self.parentID = String(decoding: bytes[36..<52], as: UTF8.self)
        self.flags = String(decoding: bytes[53..<55], as: UTF8.self)
        guard Self.isHex(self.traceID), Self.isHex(self.parentID), Self.isHex(self.flags),
            self.traceID.contains(where: { $0 != "0" }), self.parentID.contains(where: { $0 != "0" })
        else { return nil }
    }

    public init(traceID: String, parentID: String, flags: String = "01") {
        self.traceID = traceID
        self.parentID = parentID
        self.flags = flags
    }

    /// The version-00 header value.
    public var description: String { "00-\(self.traceID)-\(self.parentID)-\(self.flags)" }

    /// Whether the producer sampled its trace.
    public var sampled: Bool { (UInt8(self.flags, radix: 16) ?? 0) & 1 == 1 }

    public static func isHex(_ text: String) -> Bool {
        !text.isEmpty && text.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }
}

extension String {
    fileprivate func trimmingCharacters(in set: Set<Character>) -> String {
        String(self.drop(while: { set.contains($0) }).reversed().drop(while: { set.contains($0) }).reversed())
    }
}
