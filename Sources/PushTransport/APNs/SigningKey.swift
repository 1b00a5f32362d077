public import Crypto
import Foundation

/// An APNs token-auth signing key: the team, the key id and the P-256 private key from Apple's `.p8`.
/// Its description shows the team and key id only.
public struct SigningKey: Sendable, CustomStringConvertible {
    /// The Apple Developer team id (`iss`).
    public var teamID: String
    /// The key id (`kid`).
    public var keyID: String
    /// The private key.
    public var privateKey: P256.Signing.PrivateKey

    /// Wraps a key already in memory.
    public init(teamID: String, keyID: String, privateKey: P256.Signing.PrivateKey) {
        self.teamID = teamID
        self.keyID = keyID
        self.privateKey = privateKey
    }

    public var description: String { "SigningKey(team: \(self.teamID), key: \(self.keyID))" }

    /// Loads Apple's PKCS#8 `.p8` from `path`, refusing a file other users can read.
    ///
    /// - Throws: ``TransportError`` (`invalidKey`) with a sentence naming the file and the fix; never key material.
    public static func load(teamID: String, keyID: String, path: String) throws -> SigningKey {
        func fail(_ what: String) -> TransportError {
            TransportError(code: .invalidKey, mayHaveBeenProcessed: false, message: "APNs key file \(path) \(what)")
        }
        guard !teamID.isEmpty else {
            throw fail("has no team id configured: set APNS_TEAM_ID (10 characters, from the Apple Developer account)")
        }
        guard !keyID.isEmpty else {
            throw fail("has no key id configured: set APNS_KEY_ID (the 10 characters in AuthKey_<KEYID>.p8)")
        }
        for (name, value) in [("APNS_TEAM_ID", teamID), ("APNS_KEY_ID", keyID)]
        where value.count > 32 || !value.utf8.allSatisfy({ $0.isASCIILetterOrDigit }) {
            throw fail(
                "has a \(name == "APNS_TEAM_ID" ? "team" : "key") id that is not Apple's form: set \(name) to the 10 letters and digits Apple shows"
            )
        }
        let data: [UInt8]
        switch SecretFile.read(path, policy: .privateKey, maxBytes: 64 * 1024) {
        case .success(let bytes): data = bytes
        case .failure(.missing):
            throw fail(
                "does not exist: download the .p8 from Certificates, Identifiers & Profiles > Keys, and set APNS_KEY_PATH to it"
            )
        case .failure(let failure): throw fail(failure.sentence)
        }
        let text = String(decoding: data, as: UTF8.self)
        guard text.contains("-----BEGIN PRIVATE KEY-----") else {
            throw fail(
                "is not a PEM PKCS#8 private key (no BEGIN PRIVATE KEY line): use the AuthKey_<KEYID>.p8 file exactly as Apple issued it"
            )
        }
        do {
            let key = try P256.Signing.PrivateKey(pemRepresentation: text)
            return SigningKey(teamID: teamID, keyID: keyID, privateKey: key)
        } catch {
            throw fail(
                "is not a P-256 (ES256) private key: APNs token auth needs the .p8 of an APNs key, not a certificate or another key type"
            )
        }
    }
}

extension UInt8 {
    fileprivate var isASCIILetterOrDigit: Bool {
        (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(self) || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(self)
            || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(self)
    }
}
