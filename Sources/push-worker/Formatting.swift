import ArgumentParser
import Foundation
import PushCore

/// Prints an `Encodable` value as pretty JSON with snake_case keys.
func printJSON(_ value: some Encodable) {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
    encoder.keyEncodingStrategy = .convertToSnakeCase
    encoder.dateEncodingStrategy = .iso8601
    if let data = try? encoder.encode(value) { print(String(decoding: data, as: UTF8.self)) }
}

/// Prints JSON texts (objects from Postgres) as one JSON array.
func printJSONArray(_ objects: [String]) {
    print(objects.isEmpty ? "[]" : "[\n" + objects.joined(separator: ",\n") + "\n]")
}

/// Prints rows as a table with a header, columns padded to their widest cell.
func printTable(_ header: [String], _ rows: [[String]]) {
    let widths = header.indices.map { column in
        ([header[column]] + rows.map { $0[column] }).map(\.count).max() ?? 0
    }
    func line(_ cells: [String]) -> String {
        cells.enumerated().map { index, cell in
            index == cells.count - 1 ? cell : cell.padding(toLength: widths[index], withPad: " ", startingAt: 0)
        }.joined(separator: "  ")
    }
    print(line(header))
    for row in rows { print(line(row)) }
}

/// A short timestamp in UTC, to the second.
func formatDate(_ date: Date?) -> String {
    guard let date else { return "-" }
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [.withFullDate, .withTime, .withColonSeparatorInTime, .withSpaceBetweenDateAndTime]
    formatter.timeZone = TimeZone(identifier: "UTC")
    return formatter.string(from: date) + "Z"
}

/// Cuts a text to `length` characters with an ellipsis.
func truncate(_ text: String, _ length: Int) -> String {
    text.count <= length ? text : String(text.prefix(length - 1)) + "…"
}

/// A duration typed by an operator: `90s`, `15m`, `12h`, `30d`, `2w`.
struct HumanDuration: ExpressibleByArgument, Sendable {
    var seconds: Int

    init?(argument: String) {
        // At most 100 years: a larger number is a typo (it used to overflow and trap).
        // Whole seconds: `1.5h` is 5400 s, but `0.4s` would round to nothing and is refused.
        guard let seconds = HumanText.seconds(from: argument), seconds == seconds.rounded() else { return nil }
        self.seconds = Int(seconds)
    }

    var duration: Duration { .seconds(self.seconds) }

    /// How `--help` shows a default: the largest whole unit (`60s`, `7d`).
    var defaultValueDescription: String {
        for (unit, scale) in [("w", 604_800), ("d", 86_400), ("h", 3600), ("m", 60)]
        where self.seconds >= scale && self.seconds % scale == 0 {
            return "\(self.seconds / scale)\(unit)"
        }
        return "\(self.seconds)s"
    }

    static var defaultCompletionKind: CompletionKind { .default }
}

/// A point in time typed by an operator: an age (`1h`, `7d`: that long ago) or an ISO 8601 timestamp.
struct HumanTime: ExpressibleByArgument, Sendable {
    var date: Date

    init?(argument: String) {
        if let age = HumanDuration(argument: argument) {
            self.date = processClock.wallNow.addingTimeInterval(-Double(age.seconds))
            return
        }
        let formatter = ISO8601DateFormatter()
        for options: ISO8601DateFormatter.Options in [
            [.withInternetDateTime], [.withInternetDateTime, .withFractionalSeconds], [.withFullDate],
        ] {
            formatter.formatOptions = options
            if let date = formatter.date(from: argument) {
                self.date = date
                return
            }
        }
        return nil
    }
}
