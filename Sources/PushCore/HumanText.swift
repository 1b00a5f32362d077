import Foundation

/// Durations and untrusted text as operators type and read them: one rule for the CLI and the console.
public enum HumanText {
    /// The units a typed duration may end with, in seconds.
    static let units: [Character: Double] = ["s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800]

    /// `90s`, `15m`, `1.5h`, `30d`, `2w` (a number, then one unit) as seconds, from 0 up to `maximum`; `nil`
    /// for anything else (no unit, a negative or non-finite number, too long).
    public static func seconds(from text: String, maximum: Double = 100 * 365 * 86_400) -> Double? {
        let trimmed = text.trimmingCharacters(in: .whitespaces).lowercased()
        guard let unit = trimmed.last, let scale = Self.units[unit], let number = Double(trimmed.dropLast()),
            number.isFinite, number >= 0
        else { return nil }
        let seconds = number * scale
        return seconds <= maximum ? seconds : nil
    }

    /// A duration for people, its precision shrinking as it grows: `850 ms`, `4.2 s`, `3 min`, `5.0 h`,
    /// `2.0 d`.
    public static func duration(_ seconds: Double) -> String {
        switch seconds {
        case ..<1: return "\(Int(seconds * 1000)) ms"
        case ..<60: return Self.oneDecimal(seconds) + " s"
        case ..<3600: return "\(Int((seconds / 60).rounded())) min"
        case ..<172_800: return Self.oneDecimal(seconds / 3600) + " h"
        default: return Self.oneDecimal(seconds / 86_400) + " d"
        }
    }

    /// Where escaped text goes.
    public enum Target: Sendable {
        /// A terminal: C0 and C1 controls (but newline and tab), DEL, and the bidirectional embeddings,
        /// overrides and isolates (a line that displays in another order than it reads). Other format
        /// characters stay, so emoji sequences joined by U+200D still show.
        case terminal
        /// One log line: every control and format character (Unicode Cc and Cf, Foundation's
        /// `controlCharacters`), newline and tab included: zero-width spaces, joiners, soft hyphens, tag
        /// characters and byte-order marks cannot hide in a log.
        case logLine
    }

    /// `text` with every character `target` would act on, or hide, written as `\u{1B}` (`\n` and `\t` in a
    /// log line).
    public static func escaped(_ text: String, for target: Target = .terminal) -> String {
        guard text.unicodeScalars.contains(where: { Self.isUnsafe($0, for: target) }) else { return text }
        var result = ""
        result.reserveCapacity(text.utf8.count + 16)
        for scalar in text.unicodeScalars {
            if !Self.isUnsafe(scalar, for: target) {
                result.unicodeScalars.append(scalar)
            } else if scalar == "\n" {
                result += "\\n"
            } else if scalar == "\t" {
                result += "\\t"
            } else {
                result += "\\u{" + String(scalar.value, radix: 16, uppercase: true) + "}"
            }
        }
        return result
    }

    static func isUnsafe(_ scalar: Unicode.Scalar, for target: Target) -> Bool {
        switch target {
        case .logLine:
            let category = scalar.properties.generalCategory
            return category == .control || category == .format
        case .terminal:
            switch scalar.value {
            case 0x0A, 0x09: return false
            case 0x00...0x1F, 0x7F...0x9F: return true
            case 0x202A...0x202E, 0x2066...0x2069, 0x200E, 0x200F, 0x061C: return true
            default: return false
            }
        }
    }

    /// One decimal, without Foundation's `String(format:)`.
    static func oneDecimal(_ value: Double) -> String {
        let tenths = Int((value * 10).rounded())
        return "\(tenths / 10).\(tenths % 10)"
    }
}
