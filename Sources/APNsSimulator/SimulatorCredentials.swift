public import Crypto
import Foundation
import _CryptoExtras

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

/// A throwaway FCM service account for the simulator, written as a Google-style JSON key file (mode 600)
/// whose `token_uri` is the simulator's token endpoint, so the worker (or any client) can send Android jobs
/// to it. Made before the simulator starts (it must trust the key), written once its port is known.
public struct SimulatorFCMAccount: Sendable {
    /// The account's project (the send URL's `<project_id>`).
    public var projectID: String
    /// The account (`iss`).
    public var clientEmail: String
    let privateKey: _RSA.Signing.PrivateKey

    /// A fresh 2048-bit RSA key for the account.
    public static func make(
        projectID: String = "push-simulator",
        clientEmail: String = "push-worker@push-simulator.iam.gserviceaccount.com"
    ) throws -> SimulatorFCMAccount {
        SimulatorFCMAccount(
            projectID: projectID,
            clientEmail: clientEmail,
            privateKey: try _RSA.Signing.PrivateKey(keySize: .bits2048)
        )
    }

    /// The account as the simulator trusts it, by client email (``APNsSimulator/Configuration/fcmAccounts``).
    public var trusted: [String: APNsSimulator.FCMAccount] {
        [self.clientEmail: APNsSimulator.FCMAccount(projectID: self.projectID, publicKey: self.privateKey.publicKey)]
    }

    /// Writes the key file into `directory` (created if needed) for a simulator whose token endpoint is
    /// `https://<host>:<port>/token`; returns its path.
    @discardableResult
    public func write(in directory: String, host: String, port: Int) throws -> String {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let object: [String: String] = [
            "type": "service_account", "project_id": self.projectID, "private_key_id": "simulator",
            "private_key": self.privateKey.pkcs8PEMRepresentation, "client_email": self.clientEmail,
            "token_uri": "https://\(host):\(port)\(APNsSimulator.fcmTokenPath)",
        ]
        let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])
        let path = (directory as NSString).appendingPathComponent("fcm-service-account.json")
        try? FileManager.default.removeItem(atPath: path)
        guard FileManager.default.createFile(atPath: path, contents: data, attributes: [.posixPermissions: 0o600])
        else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: path])
        }
        return path
    }
}
