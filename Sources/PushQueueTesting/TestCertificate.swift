import Foundation
import PushProcess

/// A self-signed certificate for `localhost` (EC P-256, two days), made by openssl, for a test's TLS peer
/// (a webhook receiver, an FCM stand-in) that the client trusts through a CA file: the certificate itself.
public enum TestCertificate {
    public struct Failed: Error, CustomStringConvertible {
        public var description: String
    }

    /// Writes `cert.pem` and `key.pem` into `directory`; returns their paths.
    @discardableResult
    public static func localhost(in directory: String) throws -> (certificate: String, key: String) {
        let (certificate, key) = (directory + "/cert.pem", directory + "/key.pem")
        let made = try ChildProcess.run(
            "/usr/bin/env",
            [
                "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", key, "-out", certificate, "-days", "2", "-subj", "/CN=localhost", "-addext",
                "subjectAltName=DNS:localhost",
            ]
        )
        guard made.status == 0 else { throw Failed(description: "openssl: \(made.output)") }
        return (certificate, key)
    }
}
