import Crypto
import Foundation

/// Checks provider tokens the way APNs does: ES256, a known `kid`, the matching team as `iss`, a valid
/// signature, and an `iat` no older than an hour.
struct JWTVerifier: Sendable {
    struct Claims: Sendable, Hashable {
        var keyID: String
        var teamID: String
        var issuedAt: Int64
    }

    enum Failure: Error {
        case invalid
        case expired
    }

    let keys: [String: APNsSimulator.TrustedKey]
    let maximumAge: TimeInterval

    func verify(_ jwt: String, now: Date) throws(Failure) -> Claims {
        let parts = jwt.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3,
            let headerData = Self.base64URLDecode(parts[0]),
            let claimsData = Self.base64URLDecode(parts[1]),
            let signatureData = Self.base64URLDecode(parts[2]),
            let header = try? JSONSerialization.jsonObject(with: headerData) as? [String: Any],
            let claims = try? JSONSerialization.jsonObject(with: claimsData) as? [String: Any],
            header["alg"] as? String == "ES256",
            let keyID = header["kid"] as? String,
            let issuer = claims["iss"] as? String,
            let iat = (claims["iat"] as? NSNumber)?.int64Value,
            let trusted = self.keys[keyID],
            trusted.teamID == issuer,
            let signature = try? P256.Signing.ECDSASignature(rawRepresentation: signatureData),
            trusted.publicKey.isValidSignature(signature, for: Data((parts[0] + "." + parts[1]).utf8))
        else {
            throw .invalid
        }
        if now.timeIntervalSince1970 - Double(iat) > self.maximumAge { throw .expired }
        return Claims(keyID: keyID, teamID: issuer, issuedAt: iat)
    }

    static func base64URLDecode(_ text: Substring) -> Data? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64 += "=" }
        return Data(base64Encoded: base64)
    }
}
