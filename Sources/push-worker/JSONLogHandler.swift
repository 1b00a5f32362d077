import Foundation
import Logging

/// One JSON object per line on standard error: `ts`, `level`, `label`, `msg`, `source`, and the metadata
/// keys (`push.job_id`, `push.apns_id`, `push.token_fp`, …). Library code logs no tokens, JWTs or keys;
/// this handler adds nothing that could.
struct JSONLogHandler: LogHandler {
    let label: String
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { self.metadata[key] }
        set { self.metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var object: [String: String] = [
            "ts": ISO8601DateFormatter.string(
                from: processClock.wallNow,
                timeZone: .gmt,
                formatOptions: [.withInternetDateTime, .withFractionalSeconds]
            ),
            "level": event.level.rawValue,
            "label": self.label,
            "msg": "\(event.message)",
            "source": event.source,
        ]
        for (key, value) in self.metadata.merging(event.metadata ?? [:], uniquingKeysWith: { $1 }) {
            object[key] = "\(value)"
        }
        guard
            var line = try? JSONSerialization.data(
                withJSONObject: object,
                options: [.sortedKeys, .withoutEscapingSlashes]
            )
        else { return }
        line.append(0x0A)
        FileHandle.standardError.write(line)
    }
}
