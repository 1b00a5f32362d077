import Crypto
import Foundation

/// A short, stable, non-reversible name for a device token or channel id, safe to log.
///
/// The first 12 hex digits of the SHA-256 of the token's text, so the same token always has the same
/// fingerprint across workers and log lines, and the token itself never appears in a log.
public func tokenFingerprint(_ token: String) -> String {
    let digest = SHA256.hash(data: Data(token.utf8))
    return digest.prefix(6).map { byte in
        let hex = String(byte, radix: 16)
        return byte < 16 ? "0" + hex : hex
    }.joined()
}

extension PushJob {
    /// The fingerprint of the job's device token or channel id, for logs (`push.token_fp`).
    public var tokenFingerprint: String {
        PushCore.tokenFingerprint(self.deviceToken ?? self.channelID ?? "")
    }
}
