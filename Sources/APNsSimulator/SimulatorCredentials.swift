public import Crypto
import Foundation

/// A throwaway signing key for the simulator, written as an Apple-style `AuthKey_<KEYID>.p8` (mode 600)
/// next to the simulator's CA certificate, so a newcomer can point any client at the simulator.
public struct SimulatorCredentials: Sendable {
    /// The team id tokens must carry.
    public var teamID: String
    /// The key id tokens must carry.
    public var keyID: String
    /// The private key.
    public var privateKey: P256.Signing.PrivateKey
    /// Where the `.p8` was written.
    public var keyPath: String

    /// Makes a fresh key and writes it into `directory` (created if needed).
    public static func generate(
        in directory: String,
        teamID: String = "SIMTEAM001",
        keyID: String = "SIMKEY0001"
    ) throws -> SimulatorCredentials {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let key = P256.Signing.PrivateKey()
        let path = (directory as NSString).appendingPathComponent("AuthKey_\(keyID).p8")
        try? FileManager.default.removeItem(atPath: path)
        guard
            FileManager.default.createFile(
                atPath: path,
                contents: Data(key.pemRepresentation.utf8),
                attributes: [.posixPermissions: 0o600]
            )
        else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: path])
        }
        return SimulatorCredentials(teamID: teamID, keyID: keyID, privateKey: key, keyPath: path)
    }

    /// The key as the simulator trusts it.
    public var trustedKey: APNsSimulator.TrustedKey {
        APNsSimulator.TrustedKey(teamID: self.teamID, publicKey: self.privateKey.publicKey)
    }
}
