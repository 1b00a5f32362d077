import Foundation
import PushCore
import _CryptoExtras

/// An FCM credential: a Google service account's JSON key file (`project_id`, `client_email`,
/// `private_key`, `token_uri`), read with the same checks as a `.p8`. Its description names the project
/// and the account only, never the key.
public struct ServiceAccount: Sendable, CustomStringConvertible {
    /// The Firebase project messages are sent for (the send URL's `<project_id>`).
    public var projectID: String
    /// The account (`iss` of the JWT).
    public var clientEmail: String
    /// Where the JWT is exchanged for an access token (`aud` of the JWT).
    public var tokenURI: String
    /// The RSA key the JWT is signed with (RS256).
    let privateKey: _RSA.Signing.PrivateKey

    public var description: String { "ServiceAccount(project: \(self.projectID), account: \(self.clientEmail))" }

    /// The OAuth scope sends need.
    public static let scope = "https://www.googleapis.com/auth/firebase.messaging"

    /// Loads Google's JSON key file from `path`, refusing a file other users can read or change.
    ///
    /// - Throws: ``TransportError`` (`invalidKey`) with a sentence naming the file, the field and the fix;
    ///   never key material.
    public static func load(path: String) throws -> ServiceAccount {
        func fail(_ what: String) -> TransportError {
            TransportError(
                code: .invalidKey,
                mayHaveBeenProcessed: false,
                message: "FCM service account file \(path) \(what)"
            )
        }
        let data: [UInt8]
        switch SecretFile.read(path, policy: .privateKey, maxBytes: 64 * 1024) {
        case .success(let bytes): data = bytes
        case .failure(.missing):
            throw fail(
                "does not exist: create a key for the service account (Firebase console > Project settings > Service accounts > Generate new private key) and name its path in service_account_path"
            )
        case .failure(let failure): throw fail(failure.sentence)
        }
        guard let object = try? JSONSerialization.jsonObject(with: Data(data)) as? [String: Any] else {
            throw fail("is not a JSON object: use the key file exactly as Google issued it")
        }
        if let type = object["type"] as? String, type != "service_account" {
            throw fail(
                "is of type \"\(type)\", not a service account key (\"type\": \"service_account\"): generate a key for a service account"
            )
        }
        func field(_ name: String) throws -> String {
            guard let value = object[name] as? String, !value.isEmpty else {
                throw fail("has no \"\(name)\": use the key file exactly as Google issued it")
            }
            return value
        }
        let projectID = try field("project_id")
        guard projectID.utf8.allSatisfy({ $0.isProjectIDCharacter }), projectID.utf8.count <= 64 else {
            throw fail("has a project_id that is not a Google project id (lower-case letters, digits, hyphens)")
        }
        let clientEmail = try field("client_email")
        let tokenURI = try field("token_uri")
        guard let url = URL(string: tokenURI), url.scheme == "https", url.host != nil else {
            throw fail("has a token_uri that is not an https URL (Google's is https://oauth2.googleapis.com/token)")
        }
        let pem = try field("private_key")
        guard pem.contains("-----BEGIN PRIVATE KEY-----") else {
            throw fail("has a private_key that is not a PEM PKCS#8 key (no BEGIN PRIVATE KEY line)")
        }
        let key: _RSA.Signing.PrivateKey
        do {
            key = try _RSA.Signing.PrivateKey(pemRepresentation: pem)
        } catch {
            throw fail(
                "has a private_key that is not an RSA key of 2048 bits or more: generate a new key for the account"
            )
        }
        return ServiceAccount(projectID: projectID, clientEmail: clientEmail, tokenURI: tokenURI, privateKey: key)
    }

    /// The JWT bearer assertion (RFC 7523) exchanged at ``tokenURI``: RS256, `iss` the account, `scope`
    /// FCM's, `aud` the token URI, valid one hour from `issuedAt`.
    func assertion(issuedAt: Date) throws -> String {
        let iat = Int64(issuedAt.timeIntervalSince1970.rounded(.down))
        let header = #"{"alg":"RS256","typ":"JWT"}"#
        let claims = try JSONSerialization.data(
            withJSONObject: [
                "iss": self.clientEmail, "scope": Self.scope, "aud": self.tokenURI, "iat": iat, "exp": iat + 3600,
            ],
            options: [.sortedKeys, .withoutEscapingSlashes]
        )
        let signingInput =
            ProviderToken.base64URL(Data(header.utf8)) + "." + ProviderToken.base64URL(claims)
        let signature = try self.privateKey.signature(for: Data(signingInput.utf8), padding: .insecurePKCS1v1_5)
        return signingInput + "." + ProviderToken.base64URL(signature.rawRepresentation)
    }
}

extension UInt8 {
    fileprivate var isProjectIDCharacter: Bool {
        (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(self) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(self)
            || self == UInt8(ascii: "-")
    }
}
