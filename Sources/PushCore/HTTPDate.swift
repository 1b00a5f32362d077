public import Foundation

/// HTTP dates (`Wed, 25 Nov 2026 18:35:27 GMT`, RFC 9110's IMF-fixdate): APNs' `Date` response header is
/// the server's clock, and the worker compares it with its own (a host clock more than 5 minutes off makes
/// every provider token suspect).
public enum HTTPDate {
    static let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    /// The IMF-fixdate of `date` (whole seconds, UTC).
    public static func format(_ date: Date) -> String {
        var time = time_t(date.timeIntervalSince1970.rounded(.down))
        var parts = tm()
        gmtime_r(&time, &parts)
        func two(_ n: Int32) -> String { n < 10 ? "0\(n)" : "\(n)" }
        return
            "\(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) \(parts.tm_year + 1900) "
            + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
    }

    /// The time an IMF-fixdate names, or `nil` for anything else.
    public static func parse(_ text: String) -> Date? {
        // "Wed, 25 Nov 2026 18:35:27 GMT"
        let fields = text.split(separator: " ")
        guard fields.count == 6, fields[5] == "GMT", let day = Int(fields[1]),
            let month = months.firstIndex(of: String(fields[2])), let year = Int(fields[3])
        else { return nil }
        let clock = fields[4].split(separator: ":").compactMap { Int($0) }
        guard clock.count == 3, (1...31).contains(day), (0...23).contains(clock[0]), (0...59).contains(clock[1]),
            (0...60).contains(clock[2])
        else { return nil }
        var parts = tm()
        parts.tm_year = Int32(year - 1900)
        parts.tm_mon = Int32(month)
        parts.tm_mday = Int32(day)
        parts.tm_hour = Int32(clock[0])
        parts.tm_min = Int32(clock[1])
        parts.tm_sec = Int32(clock[2])
        return Date(timeIntervalSince1970: TimeInterval(timegm(&parts)))
    }
}

/// How far the host clock is from a server's, from one response: the server's `Date` (whole seconds, taken
/// somewhere during the exchange) against the midpoint of the exchange here.
public enum ClockSkew {
    /// Beyond this, provider tokens start failing (`InvalidProviderToken`, `BadDate`): warn first.
    public static let limit: TimeInterval = 300

    /// Seconds the server's clock is ahead of ours (negative: behind), or `nil` without a usable `Date`.
    /// Whole-second dates make anything under about a second noise.
    public static func measure(serverDate: String?, receivedAt: Date, latency: Duration) -> TimeInterval? {
        guard let serverDate, let server = HTTPDate.parse(serverDate) else { return nil }
        let latencySeconds = Double(latency.components.seconds) + Double(latency.components.attoseconds) * 1e-18
        let midpoint = receivedAt.addingTimeInterval(-latencySeconds / 2)
        // The header truncates to the second: compare with the middle of that second.
        return server.timeIntervalSince(midpoint) + 0.5
    }
}
