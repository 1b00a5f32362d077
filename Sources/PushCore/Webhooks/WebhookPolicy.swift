import Foundation

/// What the worker does with a receiver's answer to a delivery, and when it tries again (CONTRACT.md 1c).
public enum WebhookPolicy {
    /// A hook's URL as the CLI shows it: scheme, host, port and path. A query or fragment (where receivers keep
    /// their tokens) is shown as `?…`, user info as `…@`, and control and format characters (a CR or LF a row
    /// may hold) are escaped: a listing can neither leak a receiver's token nor be rewritten by a row.
    public static func displayURL(_ url: String) -> String {
        var shown = url
        if let scheme = url.range(of: "://") {
            var rest = url[scheme.upperBound...]
            // User info may hold '/', '?' or '#' (the schema only checks the start): any '@' before the query
            // ends it, so a password never shows (a path with an '@' in it is shown from there).
            let beforeQuery = rest[..<(rest.firstIndex { "?#".contains($0) } ?? rest.endIndex)]
            var userInfo = false
            if let at = beforeQuery.lastIndex(of: "@") {
                rest = rest[rest.index(after: at)...]
                userInfo = true
            }
            let authorityEnd = rest.firstIndex { "/?#".contains($0) } ?? rest.endIndex
            let authority = (userInfo ? "…@" : "") + rest[..<authorityEnd]
            let tail = rest[authorityEnd...]
            let pathEnd = tail.firstIndex { "?#".contains($0) } ?? tail.endIndex
            shown =
                String(url[..<scheme.upperBound]) + authority + tail[..<pathEnd] + (pathEnd < tail.endIndex ? "?…" : "")
        }
        return HumanText.escaped(shown, for: .logLine)
    }

    /// Where hooks' secret files must live unless the worker is told otherwise (`--webhook-secrets-dir`).
    public static let defaultSecretsDirectory = "/etc/push-worker/webhooks"

    /// Whether `path` names a file inside `directory`, read as text only: both absolute, no `.` or `..`
    /// component, at least one component below the directory. Any row of `push.webhooks` may name any path,
    /// so the worker opens none outside its secrets directory (no existence, mode or content oracle there);
    /// the file's real location is checked again once it is open (a symlink inside may not lead out).
    public static func secretFileIsInside(_ path: String, directory: String) -> Bool {
        // Bytes, as the kernel reads the path: Swift's characters would merge a combining mark into the "/"
        // before it (hiding a "..") and call canonically equivalent names equal.
        let slash = UInt8(ascii: "/")
        let dot = UInt8(ascii: ".")
        func components(_ text: String) -> [[UInt8]]? {
            guard text.utf8.first == slash else { return nil }
            let parts = text.utf8.split(separator: slash, omittingEmptySubsequences: true).map(Array.init)
            guard !parts.contains(where: { $0 == [dot] || $0 == [dot, dot] }) else { return nil }
            return parts
        }
        // The root itself is no confinement.
        guard let file = components(path), let root = components(directory), !root.isEmpty else { return false }
        return file.count > root.count && file.starts(with: root)
    }

    /// How long a delivery is retried before it is dead.
    public static let retryWindow: Duration = .seconds(24 * 3_600)
    /// The longest wait between two tries.
    public static let longestBackoff: Duration = .seconds(3_600)

    /// What became of one try.
    public enum Verdict: Sendable, Equatable {
        /// A 2xx: delivered.
        case delivered
        /// A 410 Gone: the receiver wants no more; the hook is disabled and this delivery is dead.
        case gone
        /// Anything else (another status, a redirect, no answer, a refused address): try again at `after`,
        /// or dead when that is past the retry window.
        case retry(after: Duration)
    }

    /// The verdict for a try that got `status` (nil: no answer), after `attempt` tries (1 for the first),
    /// with the receiver's `Retry-After` (honoured up to the longest backoff), `jitter` in 0..<1.
    public static func verdict(
        status: Int?,
        attempt: Int,
        age: Duration? = nil,
        retryAfter: Duration?,
        jitter: Double
    ) -> Verdict {
        if let status, (200..<300).contains(status) { return .delivered }
        if status == 410 { return .gone }
        return .retry(after: self.retryWait(attempt: attempt, age: age, retryAfter: retryAfter, jitter: jitter))
    }

    /// The wait before the next try after a failed one: the receiver's `Retry-After` (at least a second, at
    /// most the longest backoff), or the backoff. `age` is the delivery's time since its outcome (or since
    /// `webhooks replay`), when known: see ``backoff(attempt:age:jitter:)``.
    public static func retryWait(attempt: Int, age: Duration? = nil, retryAfter: Duration?, jitter: Double) -> Duration
    {
        guard let retryAfter else { return self.backoff(attempt: attempt, age: age, jitter: jitter) }
        return min(max(retryAfter, .seconds(1)), self.longestBackoff)
    }

    /// 5 s after the first failed try, doubling to an hour, each with up to a fifth added at random (so a
    /// receiver back from an outage is not met by every delivery at once).
    ///
    /// The doubling counts the tries made, but never more than an undisturbed schedule makes in `age` (its
    /// n-th try falls 5 × (2ⁿ⁻¹ − 1) s after the outcome, later with jitter). The two agree for a delivery
    /// left alone; a replayed one keeps its try count (it fences stale holders) but its age starts again, so
    /// its first failure after the replay waits 5 s, not an hour.
    public static func backoff(attempt: Int, age: Duration? = nil, jitter: Double) -> Duration {
        var step = max(attempt - 1, 0)
        if let age {
            step = min(step, Int(log2(max(age.seconds, 0) / 5 + 1)))
        }
        let exponent = min(step, 20)
        let base = min(5.0 * pow(2.0, Double(exponent)), 3_600.0)
        let seconds = min(base * (1 + 0.2 * min(max(jitter, 0), 1)), 3_600.0)
        return .milliseconds(Int64(seconds * 1_000))
    }
}

/// Whether an address a hook's host resolves to may be reached: loopback, private, link-local, shared
/// (carrier-grade NAT), unspecified, multicast and reserved ranges are refused unless the worker runs with
/// `--webhooks-allow-private`, so a row cannot make the worker call into its own network.
public enum WebhookAddress {
    /// The range an address falls in, when it is not a public one.
    public static func privateRange(ofIPv4 bytes: [UInt8]) -> String? {
        guard bytes.count == 4 else { return "malformed" }
        let (a, b) = (bytes[0], bytes[1])
        switch a {
        case 0: return "unspecified (0.0.0.0/8)"
        case 10: return "private (10.0.0.0/8)"
        case 127: return "loopback (127.0.0.0/8)"
        case 100 where (64...127).contains(b): return "shared (100.64.0.0/10)"
        case 169 where b == 254: return "link-local (169.254.0.0/16)"
        case 172 where (16...31).contains(b): return "private (172.16.0.0/12)"
        case 192 where b == 168: return "private (192.168.0.0/16)"
        case 192 where b == 0 && bytes[2] == 0: return "reserved (192.0.0.0/24)"
        case 192 where b == 0 && bytes[2] == 2: return "documentation (192.0.2.0/24)"
        case 198 where b == 51 && bytes[2] == 100: return "documentation (198.51.100.0/24)"
        case 203 where b == 0 && bytes[2] == 113: return "documentation (203.0.113.0/24)"
        case 198 where b == 18 || b == 19: return "benchmarking (198.18.0.0/15)"
        case 224...255: return "multicast or reserved (224.0.0.0/3)"
        default: return nil
        }
    }

    /// The same for an IPv6 address's 16 bytes; an IPv4-mapped or -compatible address is judged as IPv4.
    public static func privateRange(ofIPv6 bytes: [UInt8]) -> String? {
        guard bytes.count == 16 else { return "malformed" }
        if bytes[0..<15].allSatisfy({ $0 == 0 }) {
            return bytes[15] == 1 ? "loopback (::1)" : "unspecified (::)"
        }
        if bytes[0..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xFF && bytes[11] == 0xFF {
            return self.privateRange(ofIPv4: Array(bytes[12..<16]))
        }
        if bytes[0..<12].allSatisfy({ $0 == 0 }) { return self.privateRange(ofIPv4: Array(bytes[12..<16])) }
        if bytes[0] & 0xFE == 0xFC { return "unique local (fc00::/7)" }
        if bytes[0] == 0xFE && bytes[1] & 0xC0 == 0x80 { return "link-local (fe80::/10)" }
        if bytes[0] == 0xFE && bytes[1] & 0xC0 == 0xC0 { return "site-local (fec0::/10)" }
        // 6to4 (2002::/16) carries an IPv4 address in its next four bytes: judge that.
        if bytes[0] == 0x20 && bytes[1] == 0x02 { return self.privateRange(ofIPv4: Array(bytes[2..<6])) }
        // Local-use NAT64 (64:ff9b:1::/48) reaches whatever IPv4 network its operator maps: refused.
        if bytes[0] == 0x00 && bytes[1] == 0x64 && bytes[2] == 0xFF && bytes[3] == 0x9B && bytes[4] == 0x00
            && bytes[5] == 0x01
        {
            return "local-use NAT64 (64:ff9b:1::/48)"
        }
        if bytes[0] == 0xFF { return "multicast (ff00::/8)" }
        // NAT64 (64:ff9b::/96) carries an IPv4 address: judge that.
        if bytes[0] == 0x00 && bytes[1] == 0x64 && bytes[2] == 0xFF && bytes[3] == 0x9B
            && bytes[4..<12].allSatisfy({ $0 == 0 })
        {
            return self.privateRange(ofIPv4: Array(bytes[12..<16]))
        }
        return nil
    }
}
