import Crypto
import Foundation
import Synchronization

/// Who may read and who may change things in the console, and the proof each request carries.
///
/// Without a signed-in session the console shows counts and charts only. A viewer token (`--viewer-token-file`)
/// lets a person read jobs, dead letters and payloads; the operator token (`--token-file`) also lets them
/// replay, purge, pause and resume. A person signs in by typing a token with their name; the console then
/// sets a session cookie (HttpOnly, SameSite=Strict, Secure where the console is reached over https, signed
/// with a key made at start, so a restart signs everyone out) and every change form carries a CSRF token
/// derived from that session. A change needs both: the cookie alone (a forged cross-site form) is refused,
/// and so is a form without it. Failed sign-ins are throttled.
struct ConsoleAuth: Sendable {
    /// What a session may do.
    enum Role: String, Sendable {
        /// Reads jobs, dead letters and payloads.
        case viewer
        /// Reads, and replays, purges, pauses and resumes.
        case `operator`
    }

    /// The token from `--token-file`; `nil`: nothing can be changed from the console.
    let token: String?
    /// The token from `--viewer-token-file`; `nil`: no read-only sign-in.
    let viewerToken: String?
    /// Signs session cookies and derives CSRF tokens; random per process.
    private let key: SymmetricKey
    /// How long a sign-in lasts.
    static let sessionLifetime: TimeInterval = 12 * 3600
    static let cookieName = "pushworker_session"

    /// Sessions signed out before their cookie expired (by nonce); a copied cookie stops working at sign-out.
    private let revoked = Revocations()
    /// Failed sign-ins, to refuse guessing.
    let throttle: SignInThrottle

    init(token: String?, viewerToken: String? = nil, throttle: SignInThrottle = SignInThrottle()) {
        self.token = token
        self.viewerToken = viewerToken
        self.key = SymmetricKey(size: .bits256)
        self.throttle = throttle
    }

    /// Ends `session` for good, whoever still holds its cookie.
    func revoke(_ session: Session, now: Date) {
        self.revoked.add(session.nonce, until: Double(session.issuedAt) + Self.sessionLifetime, now: now)
    }

    /// Whether changes can be made from the console at all (an operator token was given).
    var isWritable: Bool { self.token != nil }
    /// Whether anyone can sign in (a token of either kind was given).
    var canSignIn: Bool { self.token != nil || self.viewerToken != nil }

    /// A signed-in person.
    struct Session: Sendable, Equatable {
        var operatorName: String
        var nonce: String
        var issuedAt: Int
        var role: Role

        var canChange: Bool { self.role == .operator }
    }

    /// The role `candidate` signs in as, or `nil`; in time independent of where it differs from either token.
    func role(forToken candidate: String) -> Role? {
        let operatorMatch = self.token.map { self.equal($0, candidate) } ?? false
        let viewerMatch = self.viewerToken.map { self.equal($0, candidate) } ?? false
        return operatorMatch ? .operator : viewerMatch ? .viewer : nil
    }

    /// Whether `a` equals `b`, comparing MACs of both: equal length whatever the input, and constant-time.
    private func equal(_ a: String, _ b: String) -> Bool {
        HMAC<SHA256>.authenticationCode(for: Data(a.utf8), using: self.key)
            == HMAC<SHA256>.authenticationCode(for: Data(b.utf8), using: self.key)
    }

    /// A new session's cookie value for `operatorName` in `role`.
    func newSession(operatorName: String, role: Role, now: Date) -> (Session, String) {
        let nonce = SymmetricKey(size: .bits128).withUnsafeBytes { Data($0) }.hex
        let session = Session(
            operatorName: operatorName,
            nonce: nonce,
            issuedAt: Int(now.timeIntervalSince1970),
            role: role
        )
        let name = Data(operatorName.utf8).base64URL
        let body = "\(nonce).\(session.issuedAt).\(role.rawValue).\(name)"
        return (session, body + "." + self.mac("session:" + body))
    }

    /// The session a cookie value proves, or `nil` (absent, forged, expired, or no token was given).
    func session(fromCookie value: String?, now: Date) -> Session? {
        guard self.canSignIn, let value else { return nil }
        let parts = value.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 5, let issued = Int(parts[1]), let role = Role(rawValue: parts[2]),
            let nameData = Data(base64URL: parts[3]), let name = String(data: nameData, encoding: .utf8)
        else { return nil }
        let body = parts[0..<4].joined(separator: ".")
        guard constantTimeEqual(self.mac("session:" + body), parts[4]) else { return nil }
        let age = now.timeIntervalSince1970 - Double(issued)
        guard age >= -60, age < Self.sessionLifetime, !self.revoked.contains(parts[0]) else { return nil }
        // A role whose token is no longer configured (impossible within one process, kept for clarity).
        guard role == .viewer ? self.viewerToken != nil : self.token != nil else { return nil }
        return Session(operatorName: name, nonce: parts[0], issuedAt: issued, role: role)
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

    func add(_ nonce: String, until expiry: Double, now date: Date) {
        let now = date.timeIntervalSince1970
        self.nonces.withLock { nonces in
            nonces = nonces.filter { $0.value > now }
            nonces[nonce] = expiry
        }
    }

    func contains(_ nonce: String) -> Bool {
        self.nonces.withLock { $0[nonce] != nil }
    }
}

/// Failed sign-ins per client address: after `limit` failures from one address within `window`, that address's
/// sign-ins are refused until its oldest failure leaves the window. A guesser gets `limit` tries a minute from
/// each address, and cannot lock anyone else out (a global counter let ten requests a minute keep every
/// operator out). Checked after the form is read, so slow senders cannot race past it. At most `clients`
/// addresses are remembered (the quietest go first).
final class SignInThrottle: Sendable {
    let limit: Int
    let window: TimeInterval
    let clients: Int
    private let failures = Mutex<[String: [Date]]>([:])

    init(limit: Int = 10, window: TimeInterval = 60, clients: Int = 10_000) {
        self.limit = limit
        self.window = window
        self.clients = clients
    }

    /// Records an attempt by `client` as a failure (``succeeded(client:)`` takes it back) and returns `nil`,
    /// or, when `client` has failed `limit` times within the window, how long until it may try again.
    func attempt(client: String, now: Date) -> TimeInterval? {
        let wait = self.failures.withLock { failures -> TimeInterval? in
            var times = failures[client, default: []]
            times.removeAll { now.timeIntervalSince($0) >= self.window }
            failures[client] = times.isEmpty ? nil : times
            guard times.count >= self.limit, let oldest = times.first else { return nil }
            return max(1, self.window - now.timeIntervalSince(oldest))
        }
        if wait == nil { self.recordFailure(client: client, now: now) }
        return wait
    }

    /// The attempt succeeded: it is not a failure.
    func succeeded(client: String) {
        self.failures.withLock { failures in
            guard var times = failures[client], !times.isEmpty else { return }
            times.removeLast()
            failures[client] = times.isEmpty ? nil : times
        }
    }

    func recordFailure(client: String, now: Date) {
        self.failures.withLock { failures in
            failures[client, default: []].append(now)
            if failures.count > self.clients {
                // Forget the addresses whose last failure is oldest.
                let quietest = failures.sorted { ($0.value.last ?? now) < ($1.value.last ?? now) }
                    .prefix(failures.count - self.clients)
                for (client, _) in quietest { failures[client] = nil }
            }
        }
    }
}
