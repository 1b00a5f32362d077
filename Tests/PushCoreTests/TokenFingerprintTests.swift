import PushCore
import Testing

@Suite("Token fingerprints and the trap catalog")
struct TokenFingerprintTests {
    @Test("a fingerprint is 12 hex digits of SHA-256, stable, and never contains the token")
    func fingerprint() {
        let token = String(repeating: "7f3c", count: 16)
        let fp = tokenFingerprint(token)
        #expect(fp.count == 12)
        #expect(fp.allSatisfy { $0.isHexDigit })
        #expect(fp == tokenFingerprint(token))
        #expect(fp != tokenFingerprint(token + "0"))
        #expect(!token.contains(fp))
        // SHA-256("abc") starts ba7816bf8f01.
        #expect(tokenFingerprint("abc") == "ba7816bf8f01")
    }

    @Test("the trap catalog has the ids APNS.md names, in order, without duplicates")
    func catalog() {
        #expect(
            TrapID.all.map(\.rawValue) == [
                "MS011", "MS014", "MS015", "MS018", "MS020", "MS028", "MS030", "MS031", "MS032", "MS034", "MS035",
            ]
        )
    }
}
