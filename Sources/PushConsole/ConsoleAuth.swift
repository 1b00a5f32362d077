import Crypto
import Foundation
import Synchronization

/// Who may change things in the console, and the proof each change form carries.
///
/// Read-only unless the console was given a token. With one, an operator signs in by typing it with a name;
/// the console then sets a session cookie (HttpOnly, SameSite=Strict, signed with a key made at start, so a
/// restart signs everyone out) and every change form carries a CSRF token derived from that session. A
/// change needs both: the cookie alone (a forged cross-site form) is refused, and so is a form without it.
struct ConsoleAuth: Sendable {
    /// The token from `--token-file`; `nil`: read-only.
    let token: String?
    /// Signs session cookies and derives CSRF tokens; random per process.
    private let key: SymmetricKey
    /// How long a sign-in lasts.
    static let sessionLifetime: TimeInterval = 12 * 3600
    static let cookieName = "pushworker_session"

    /// Sessions signed out before their cookie expired (by nonce); a copied cookie stops working at sign-out.
    private let revoked = Revocations()

    init(token: String?) {
        self.token = token
        self.key = SymmetricKey(size: .bits256)
    }

    /// Ends `session` for good, whoever still holds its cookie.
    func revoke(_ session: Session) {
        self.revoked.add(session.nonce, until: Double(session.issuedAt) + Self.sessionLifetime)
    }

    var isWritable: Bool { self.token != nil }

    /// A signed-in operator.
    struct Session: Sendable, Equatable {
        var operatorName: String
        var nonce: String
        var issuedAt: Int
    }

    /// Whether `candidate` is the token, in time independent of where they differ.
    func tokenMatches(_ candidate: String) -> Bool {
        guard let token else { return false }
        // Compare MACs of both: equal length whatever the input, and constant-time.
        let a = HMAC<SHA256>.authenticationCode(for: Data(token.utf8), using: self.key)
        let b = HMAC<SHA256>.authenticationCode(for: Data(candidate.utf8), using: self.key)
        return a == b
    }

    /// A new session's cookie value for `operatorName`.
    func newSession(operatorName: String, now: Date = Date()) -> (Session, String) {
        let nonce = SymmetricKey(size: .bits128).withUnsafeBytes { Data($0) }.hex
        let session = Session(operatorName: operatorName, nonce: nonce, issuedAt: Int(now.timeIntervalSince1970))
        let name = Data(operatorName.utf8).base64URL
        let body = "\(nonce).\(session.issuedAt).\(name)"
        return (session, body + "." + self.mac("session:" + body))
    }

    /// The session a cookie value proves, or `nil` (absent, forged, expired, or the console is read-only).
    func session(fromCookie value: String?, now: Date = Date()) -> Session? {
        guard self.isWritable, let value else { return nil }
        let parts = value.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 4, let issued = Int(parts[1]),
            let nameData = Data(base64URL: parts[2]), let name = String(data: nameData, encoding: .utf8)
        else { return nil }
        let body = "\(parts[0]).\(parts[1]).\(parts[2])"
        guard constantTimeEqual(self.mac("session:" + body), parts[3]) else { return nil }
        let age = now.timeIntervalSince1970 - Double(issued)
        guard age >= -60, age < Self.sessionLifetime, !self.revoked.contains(parts[0]) else { return nil }
        return Session(operatorName: name, nonce: parts[0], issuedAt: issued)
    }

    /// The CSRF token every change form of `session` carries.
    func csrfToken(for session: Session) -> String {
        self.mac("csrf:" + session.nonce)
    }

    func csrfMatches(_ candidate: String?, session: Session) -> Bool {
        guard let candidate else { return false }
        return constantTimeEqual(self.csrfToken(for: session), candidate)
    }

    private func mac(_ text: String) -> String {
        Data(HMAC<SHA256>.authenticationCode(for: Data(text.utf8), using: self.key)).hex
    }

    /// Names shown in logs and pauses: letters, digits and `._@-` and spaces, 1 to 40 of them.
    static func isValidOperatorName(_ name: String) -> Bool {
        (1...40).contains(name.count)
            && name.unicodeScalars.allSatisfy {
                CharacterSet.alphanumerics.contains($0) && $0.isASCII || " ._@-".unicodeScalars.contains($0)
            }
    }
}

private func constantTimeEqual(_ a: String, _ b: String) -> Bool {
    let x = Array(a.utf8)
    let y = Array(b.utf8)
    guard x.count == y.count else { return false }
    var difference: UInt8 = 0
    for i in x.indices { difference |= x[i] ^ y[i] }
    return difference == 0
}

extension Data {
    var hex: String { self.map { String(format: "%02x", $0) }.joined() }

    var base64URL: String {
        self.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    init?(base64URL text: String) {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64 += "=" }
        self.init(base64Encoded: base64)
    }
}

/// Nonces of signed-out sessions, each kept until its cookie would have expired anyway.
final class Revocations: Sendable {
    private let nonces = Mutex<[String: Double]>([:])

    func add(_ nonce: String, until expiry: Double) {
        let now = Date().timeIntervalSince1970
        self.nonces.withLock { nonces in
            nonces = nonces.filter { $0.value > now }
            nonces[nonce] = expiry
        }
    }

    func contains(_ nonce: String) -> Bool {
        self.nonces.withLock { $0[nonce] != nil }
    }
}
