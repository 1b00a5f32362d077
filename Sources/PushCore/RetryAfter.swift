public import Foundation

/// Parses a `Retry-After` header: delay-seconds or an HTTP date, rounded up to whole seconds.
public enum RetryAfter {
    /// The wait the header asks for, or `nil` when it is missing or unreadable. A date in the past is 0.
    public static func parse(_ value: String?, now: Date) -> Duration? {
        guard let value = value?.trimmingCharacters(in: .whitespaces), !value.isEmpty else { return nil }
        if let seconds = Double(value), seconds >= 0, seconds.isFinite {
            // Range-checked: a peer's number must never trap (one day is far beyond any real answer).
            return .seconds(Int64(min(seconds, 86_400).rounded(.up)))
        }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        for format in ["EEE, dd MMM yyyy HH:mm:ss zzz", "EEEE, dd-MMM-yy HH:mm:ss zzz", "EEE MMM d HH:mm:ss yyyy"] {
            formatter.dateFormat = format
            if let date = formatter.date(from: value) {
                return .seconds(Int64(min(max(date.timeIntervalSince(now), 0), 86_400).rounded(.up)))
            }
        }
        return nil
    }
}
