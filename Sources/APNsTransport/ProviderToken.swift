public import Crypto
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

    /// base64url without padding.
    public static func base64URL(_ data: Data) -> String {
        data.base64EncodedString()
            .replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
}
