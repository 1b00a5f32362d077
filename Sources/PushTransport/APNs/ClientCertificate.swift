public import Foundation
import NIOSSL
import SwiftASN1
import X509

/// An APNs provider certificate (certificate-based trust): TLS client auth instead of a provider token,
/// no `authorization` header, and the topic named in the certificate. Loaded from a `.p12` or from a PEM
/// certificate and key. Its description shows the subject and expiry only, never key material.
public struct ClientCertificate: Sendable, CustomStringConvertible {
    let chain: [NIOSSLCertificate]
    let key: NIOSSLPrivateKey
    /// The subject's common name, e.g. `Apple Push Services: com.example.app`.
    public let commonName: String
    /// The app the certificate pushes for: the subject's UID, else the common name after `: `.
    public let topic: String?
    /// When it stops working.
    public let notValidAfter: Date
    /// The environments it is for, from its common name: a development (sandbox) certificate, a production
    /// one, or Apple's universal "Apple Push Services" certificate for both.
    public let environments: Set<String>

    public var description: String {
        "certificate '\(self.commonName)', expires \(ISO8601DateFormatter().string(from: self.notValidAfter))"
    }

    /// Loads a PKCS#12 bundle (`.p12`, as Keychain Access exports it), with its password from a file.
    ///
    /// - Parameter now: wall time, against the certificate's dates.
    /// - Throws: ``TransportError`` (`invalidKey`) with a sentence that names the file and the fix.
    public static func loadPKCS12(
        path: String,
        passwordFile: String?,
        now: Date
    ) throws(TransportError) -> ClientCertificate {
        let bytes = try Self.read(path, what: "certificate bundle (.p12)", policy: .privateKey)
        let password = try passwordFile.map { file throws(TransportError) in try Self.password(file) }
        let bundle: NIOSSLPKCS12Bundle
        do {
            bundle = try NIOSSLPKCS12Bundle(buffer: bytes, passphrase: password.map { Array($0.utf8) })
        } catch {
            throw Self.fail(
                path,
                passwordFile == nil
                    ? "could not be opened without a password: set password_file to a file holding the export password"
                    : "could not be decrypted: the password in \(passwordFile!) is wrong, or the bundle uses an algorithm this TLS library lacks (RC2, from older Keychain exports): convert it with `openssl pkcs12 -in \(path) -nodes -out apns.pem` and use cert_path and key_path"
            )
        }
        guard !bundle.certificateChain.isEmpty else {
            throw Self.fail(path, "holds no certificate: export the certificate together with its private key")
        }
        return try Self.make(chain: bundle.certificateChain, key: bundle.privateKey, path: path, now: now)
    }

    /// Loads a PEM certificate (with any intermediates after it) and its PEM private key.
    ///
    /// - Parameter now: wall time, against the certificate's dates.
    /// - Throws: ``TransportError`` (`invalidKey`) with a sentence that names the file and the fix.
    public static func loadPEM(
        certificatePath: String,
        keyPath: String,
        passwordFile: String? = nil,
        now: Date
    ) throws(TransportError) -> ClientCertificate {
        let certificateBytes = try Self.read(certificatePath, what: "certificate (PEM)", policy: .configuration)
        let chain: [NIOSSLCertificate]
        do {
            chain = try NIOSSLCertificate.fromPEMBytes(certificateBytes)
        } catch {
            throw Self.fail(certificatePath, "is not a PEM certificate (no BEGIN CERTIFICATE block)")
        }
        guard !chain.isEmpty else {
            throw Self.fail(certificatePath, "is not a PEM certificate (no BEGIN CERTIFICATE block)")
        }
        let keyBytes = try Self.read(keyPath, what: "private key (PEM)", policy: .privateKey)
        let password = try passwordFile.map { file throws(TransportError) in try Self.password(file) }
        let key: NIOSSLPrivateKey
        do {
            if let password {
                key = try NIOSSLPrivateKey(bytes: keyBytes, format: .pem) { use in use(Array(password.utf8)) }
            } else {
                key = try NIOSSLPrivateKey(bytes: keyBytes, format: .pem)
            }
        } catch {
            let text = String(decoding: keyBytes, as: UTF8.self)
            throw Self.fail(
                keyPath,
                text.contains("ENCRYPTED") && password == nil
                    ? "is an encrypted private key: set password_file, or decrypt it with `openssl pkey -in \(keyPath) -out key.pem`"
                    : "is not a PEM private key that matches a push certificate (wrong password, or not a key)"
            )
        }
        return try Self.make(chain: chain, key: key, path: keyPath, certificatePath: certificatePath, now: now)
    }

    /// Checks what TLS will need (the key matches the certificate; not expired) and reads the subject.
    static func make(
        chain: [NIOSSLCertificate],
        key: NIOSSLPrivateKey,
        path: String,
        certificatePath: String? = nil,
        now: Date
    ) throws(TransportError) -> ClientCertificate {
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.certificateChain = chain.map { .certificate($0) }
        configuration.privateKey = .privateKey(key)
        do {
            _ = try NIOSSLContext(configuration: configuration)
        } catch {
            throw Self.fail(path, "holds a private key that does not belong to the certificate: export them together")
        }
        let leaf = chain[0]
        let expiry = Date(timeIntervalSince1970: TimeInterval(leaf.notValidAfter))
        let start = Date(timeIntervalSince1970: TimeInterval(leaf.notValidBefore))
        guard start <= now else {
            throw Self.fail(
                certificatePath ?? path,
                "holds a certificate valid only from \(ISO8601DateFormatter().string(from: start)): check this machine's clock, or wait"
            )
        }
        guard expiry > now else {
            throw Self.fail(
                certificatePath ?? path,
                "holds a certificate that expired on \(ISO8601DateFormatter().string(from: expiry)): make a new one in Certificates, Identifiers & Profiles"
            )
        }
        var commonName = ""
        var userID: String?
        if let der = try? leaf.toDERBytes(), let parsed = try? Certificate(derEncoded: der) {
            for attribute in parsed.subject.flatMap({ $0 }) {
                if attribute.type == .RDNAttributeType.commonName { commonName = String(attribute.value) ?? "" }
                if attribute.type == Self.userIDOID { userID = String(attribute.value) }
            }
        }
        let fromName = commonName.range(of: ": ").map { String(commonName[$0.upperBound...]) }
        let environments: Set<String> =
            commonName.contains("Development") || commonName.contains("Sandbox")
            ? ["development"]
            : commonName.contains("Production") ? ["production"] : ["development", "production"]
        return ClientCertificate(
            chain: chain,
            key: key,
            commonName: commonName,
            topic: userID ?? fromName,
            notValidAfter: expiry,
            environments: environments
        )
    }

    /// The subject attribute Apple puts the bundle id in (UID, 0.9.2342.19200300.100.1.1).
    static let userIDOID: ASN1ObjectIdentifier = [0, 9, 2342, 19_200_300, 100, 1, 1]

    /// The TLS settings a connection with this certificate uses.
    func apply(to configuration: inout TLSConfiguration) {
        configuration.certificateChain = self.chain.map { .certificate($0) }
        configuration.privateKey = .privateKey(self.key)
    }

    static func read(_ path: String, what: String, policy: SecretFile.Policy) throws(TransportError) -> [UInt8] {
        switch SecretFile.read(path, policy: policy, maxBytes: 256 * 1024) {
        case .success(let bytes): return bytes
        case .failure(.missing):
            throw Self.fail(
                path,
                what == "password file"
                    ? "does not exist: write the .p12's export password into it (one line, mode 600), or drop password_file if the bundle has none"
                    : "does not exist: export the APNs \(what) from Keychain Access (or the Apple Developer site) and point the credential at it"
            )
        case .failure(let failure): throw Self.fail(path, failure.sentence)
        }
    }

    static func password(_ file: String) throws(TransportError) -> String {
        let bytes = try Self.read(file, what: "password file", policy: .privateKey)
        var text = String(decoding: bytes, as: UTF8.self)
        while text.hasSuffix("\n") || text.hasSuffix("\r") { text.removeLast() }
        return text
    }

    static func fail(_ path: String, _ what: String) -> TransportError {
        TransportError(code: .invalidKey, mayHaveBeenProcessed: false, message: "APNs certificate file \(path) \(what)")
    }
}
