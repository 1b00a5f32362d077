import Crypto
import Foundation
import NIOSSL
import SwiftASN1
import X509

/// A throwaway certificate authority and a server certificate it signed for `localhost`, 127.0.0.1 and
/// any extra host names, made fresh for each simulator, so clients verify TLS normally with the CA as an extra trust root.
struct SimulatorCertificates {
    let caPEM: String
    let caCertificate: NIOSSLCertificate
    let serverCertificate: NIOSSLCertificate
    let serverKey: NIOSSLPrivateKey
    let caKey: P256.Signing.PrivateKey
    let caName: DistinguishedName

    /// A client certificate shaped like Apple's provider certificates: common name
    /// `<kind>: <bundle id>`, the bundle id again as the subject's UID, signed by this CA.
    func issueClient(
        commonName: String,
        userID: String?,
        validFor: TimeInterval
    ) throws -> (
        certificatePEM: String, keyPEM: String
    ) {
        let now = Date()
        let key = P256.Signing.PrivateKey()
        var attributes: [RelativeDistinguishedName] = []
        if let userID {
            attributes.append(
                RelativeDistinguishedName(
                    RelativeDistinguishedName.Attribute(type: [0, 9, 2342, 19_200_300, 100, 1, 1], utf8String: userID)
                )
            )
        }
        attributes.append(
            RelativeDistinguishedName(
                RelativeDistinguishedName.Attribute(type: .RDNAttributeType.commonName, utf8String: commonName)
            )
        )
        let certificate = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: .init(key.publicKey),
            notValidBefore: now.addingTimeInterval(-3600),
            notValidAfter: now.addingTimeInterval(validFor),
            issuer: self.caName,
            subject: DistinguishedName(attributes),
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.clientAuth])
            },
            issuerPrivateKey: .init(self.caKey)
        )
        return (try certificate.serializeAsPEM().pemString, key.pemRepresentation)
    }

    static func make(extraNames: [String] = []) throws -> SimulatorCertificates {
        let now = Date()
        let caKey = P256.Signing.PrivateKey()
        let caName = try DistinguishedName {
            OrganizationName("PushWorker")
            CommonName("PushWorker APNs simulator CA")
        }
        let ca = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: .init(caKey.publicKey),
            notValidBefore: now.addingTimeInterval(-3600),
            notValidAfter: now.addingTimeInterval(365 * 86_400),
            issuer: caName,
            subject: caName,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
            },
            issuerPrivateKey: .init(caKey)
        )
        let serverKey = P256.Signing.PrivateKey()
        let serverName = try DistinguishedName {
            OrganizationName("PushWorker")
            CommonName("localhost")
        }
        let server = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: .init(serverKey.publicKey),
            notValidBefore: now.addingTimeInterval(-3600),
            notValidAfter: now.addingTimeInterval(365 * 86_400),
            issuer: caName,
            subject: serverName,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.serverAuth])
                SubjectAlternativeNames(
                    [.dnsName("localhost"), .ipAddress(ASN1OctetString(contentBytes: [127, 0, 0, 1]))]
                        + extraNames.map { .dnsName($0) }
                )
            },
            issuerPrivateKey: .init(caKey)
        )
        var serializer = DER.Serializer()
        try serializer.serialize(server)
        let serverDER = serializer.serializedBytes
        let caPEM = try ca.serializeAsPEM().pemString
        return SimulatorCertificates(
            caPEM: caPEM,
            caCertificate: try NIOSSLCertificate(bytes: Array(caPEM.utf8), format: .pem),
            serverCertificate: try NIOSSLCertificate(bytes: serverDER, format: .der),
            serverKey: try NIOSSLPrivateKey(bytes: Array(serverKey.derRepresentation), format: .der),
            caKey: caKey,
            caName: caName
        )
    }
}
