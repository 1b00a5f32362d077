import Crypto
public import Foundation
public import PushCore

/// Minting ES256 provider tokens: header `{"alg":"ES256","kid":…}`, claims `{"iss":…,"iat":…}`, raw
/// 64-byte r‖s signature, base64url without padding.
extension ProviderToken {
    /// Mints a token for `key` at `issuedAt` (whole seconds).
    public static func mint(for key: SigningKey, at issuedAt: Date) throws -> ProviderToken {
        let iat = Int64(issuedAt.timeIntervalSince1970.rounded(.down))
        let header = #"{"alg":"ES256","kid":"\#(key.keyID)"}"#
        let claims = #"{"iss":"\#(key.teamID)","iat":\#(iat)}"#
        let signingInput = base64URL(Data(header.utf8)) + "." + base64URL(Data(claims.utf8))
        let signature = try key.privateKey.signature(for: Data(signingInput.utf8))
        return ProviderToken(
            jwt: signingInput + "." + base64URL(signature.rawRepresentation),
            issuedAt: Date(timeIntervalSince1970: TimeInterval(iat))
        )
    }

    /// Whether this token's ES256 signature verifies with `key`'s public key. A token shared through the
    /// store was signed by whichever worker minted it: after an operator replaces a wrong `.p8` but keeps its
    /// key id, the stored token is still the old key's, and APNs refuses it (InvalidProviderToken).
    public func isSigned(by key: SigningKey) -> Bool {
        let parts = self.jwt.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let raw = Self.base64URLDecoded(parts[2]),
            let signature = try? P256.Signing.ECDSASignature(rawRepresentation: raw)
        else { return false }
        let signingInput = Data(self.jwt.utf8.prefix(parts[0].utf8.count + 1 + parts[1].utf8.count))
        return key.privateKey.publicKey.isValidSignature(signature, for: signingInput)
    }

    /// Decodes base64url without padding; `nil` if it is not.
    static func base64URLDecoded(_ text: Substring) -> Data? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        return Data(base64Encoded: base64)
    }

    /// base64url without padding.
    public static func base64URL(_ data: Data) -> String {
        data.base64EncodedString()
            .replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
}
