public import Foundation
import NIOCore
import NIOSSL
import SwiftASN1
import X509

extension APNsSimulator {
    /// The kinds of provider certificate Apple issues, by the common name's prefix.
    public enum ProviderCertificateKind: Sendable {
        /// "Apple Push Services": both environments.
        case universal
        /// "Apple Development IOS Push Services": sandbox only.
        case development
        /// "Apple Production IOS Push Services": production only.
        case production

        var prefix: String {
            switch self {
            case .universal: "Apple Push Services"
            case .development: "Apple Development IOS Push Services"
            case .production: "Apple Production IOS Push Services"
            }
        }
    }

    /// Issues a provider certificate for `bundleID` from the simulator's CA, shaped like Apple's (common name
    /// `<kind>: <bundle id>`, UID = bundle id): PEM certificate and PEM PKCS#8 key, for certificate-based trust.
    public func issueProviderCertificate(
        bundleID: String,
        kind: ProviderCertificateKind = .universal,
        validFor: TimeInterval = 365 * 86_400
    ) throws -> (certificatePEM: String, keyPEM: String) {
        try self.certificates.issueClient(
            commonName: "\(kind.prefix): \(bundleID)",
            userID: bundleID,
            validFor: validFor
        )
    }

    /// Refuses requests on certificates for `topic` with 403 `reason` (BadCertificate: revoked) until called
    /// again with `nil`.
    public func refuseCertificate(topic: String, reason: String?) {
        self.state.withLock { $0.refusedCertificates[topic] = reason }
    }

    /// The provider certificate the connection presented, read once per connection after the handshake.
    /// A connection with one needs no provider token and has no stream-limit-1 phase.
    func providerCertificate(connectionID: Int, connection: any Channel) async -> ProviderCertificateInfo? {
        if let known = self.state.withLock({ $0.clientCertificates[connectionID] }) { return known }
        let peer = try? await connection.nioSSL_peerCertificate().get()
        let info = peer.flatMap(Self.describe)
        self.state.withLock { $0.clientCertificates[connectionID] = .some(info) }
        if info != nil { self.authenticate(connectionID: connectionID, channel: connection) }
        return info
    }

    static func describe(_ certificate: NIOSSLCertificate) -> ProviderCertificateInfo? {
        guard let der = try? certificate.toDERBytes(), let parsed = try? Certificate(derEncoded: der) else {
            return nil
        }
        var commonName = ""
        var userID: String?
        for attribute in parsed.subject.flatMap({ $0 }) {
            if attribute.type == .RDNAttributeType.commonName { commonName = String(attribute.value) ?? "" }
            if attribute.type == [0, 9, 2342, 19_200_300, 100, 1, 1] { userID = String(attribute.value) }
        }
        guard let topic = userID ?? commonName.range(of: ": ").map({ String(commonName[$0.upperBound...]) }) else {
            return nil
        }
        let environments: Set<String> =
            commonName.hasPrefix(ProviderCertificateKind.development.prefix)
            ? ["development"]
            : commonName.hasPrefix(ProviderCertificateKind.production.prefix)
                ? ["production"] : ["development", "production"]
        return ProviderCertificateInfo(commonName: commonName, topic: topic, environments: environments)
    }
}
