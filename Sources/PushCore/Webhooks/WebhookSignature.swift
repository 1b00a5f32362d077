import Crypto
public import Foundation

/// The `Push-Signature` header of a webhook delivery (CONTRACT.md 1c): `t=<unix seconds>,v1=<hex>`, where `v1`
/// is HMAC-SHA256 of `<t>.<body>` keyed with the secret file's content, surrounding whitespace removed.
public enum WebhookSignature {
    /// The header's name.
    public static let header = "Push-Signature"

    /// The key a secret file's content gives: its bytes with surrounding ASCII whitespace (space, tab, line
    /// feed, carriage return, vertical tab, form feed) removed, as Python's `bytes.strip()` does. `nil` when
    /// nothing is left: an empty secret signs nothing.
    static func key(fromFileContent content: Data) -> SymmetricKey? {
        let whitespace: Set<UInt8> = [0x20, 0x09, 0x0A, 0x0D, 0x0B, 0x0C]
        guard let first = content.firstIndex(where: { !whitespace.contains($0) }),
            let last = content.lastIndex(where: { !whitespace.contains($0) })
        else { return nil }
        return SymmetricKey(data: content[first...last])
    }

    static func value(body: some DataProtocol, timestamp: Int64, key: SymmetricKey) -> String {
        "t=\(timestamp),v1=\(self.hex(body: body, timestamp: timestamp, key: key))"
    }

    /// The header's value keyed with a secret file's content, or `nil` when the file holds only whitespace.
    public static func value(body: some DataProtocol, timestamp: Int64, secretFileContent: Data) -> String? {
        guard let key = self.key(fromFileContent: secretFileContent) else { return nil }
        return self.value(body: body, timestamp: timestamp, key: key)
    }

    /// The hex HMAC-SHA256 of `<timestamp>.<body>`.
    static func hex(body: some DataProtocol, timestamp: Int64, key: SymmetricKey) -> String {
        var mac = HMAC<SHA256>(key: key)
        mac.update(data: Data("\(timestamp).".utf8))
        mac.update(data: body)
        return mac.finalize().map { String(format: "%02x", $0) }.joined()
    }

    /// Whether `header` signs `body` with the secret at a time within `tolerance` of `now`: what a receiver checks
    /// (and the tests' receiver does). The comparison takes the same time whatever the bytes.
    public static func verify(
        header: String,
        body: some DataProtocol,
        secretFileContent: Data,
        now: Date,
        tolerance: TimeInterval = 300
    ) -> Bool {
        var timestamp: Int64?
        var signatures: [String] = []
        for part in header.split(separator: ",") {
            let pair = part.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
            guard pair.count == 2 else { continue }
            if pair[0] == "t" { timestamp = Int64(pair[1]) }
            if pair[0] == "v1" { signatures.append(pair[1]) }
        }
        guard let key = self.key(fromFileContent: secretFileContent) else { return false }
        guard let timestamp, abs(now.timeIntervalSince1970 - Double(timestamp)) <= tolerance else { return false }
        let expected = Array(self.hex(body: body, timestamp: timestamp, key: key).utf8)
        return signatures.contains { candidate in
            let given = Array(candidate.utf8)
            guard given.count == expected.count else { return false }
            return zip(given, expected).reduce(UInt8(0)) { $0 | ($1.0 ^ $1.1) } == 0
        }
    }
}
