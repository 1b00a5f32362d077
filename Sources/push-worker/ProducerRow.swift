import Foundation
import PushCore

/// A producer's row as JSON (`describe --row`): the columns a producer sets, with push.jobs' defaults for
/// those left out.
enum ProducerRow {
    static let columns: Set<String> = [
        "topic", "device_token", "channel_id", "payload", "push_type", "priority", "environment", "credential",
        "collapse_id", "expires_at", "run_at", "apns_id", "max_attempts", "deliver_once", "coalesce_key",
        "platform", "traceparent",
    ]

    /// The JSON object in `path` (`-`: standard input).
    static func read(_ path: String) throws -> [String: Any] {
        let data: Data
        if path == "-" {
            data = FileHandle.standardInput.readDataToEndOfFile()
        } else {
            guard let read = FileManager.default.contents(atPath: path) else {
                throw CLIError("--row \(path): no such file (use - to read the row from standard input)")
            }
            data = read
        }
        guard let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw CLIError(
                "--row \(path) is not a JSON object: give the row's columns as {\"topic\": …, \"device_token\": …, \"payload\": {…}}"
            )
        }
        return object
    }

    /// The job the row would be, or an error naming the field and the fix.
    static func job(from row: [String: Any]) throws -> PushJob {
        if let unknown = row.keys.filter({ !Self.columns.contains($0) }).sorted().first {
            throw CLIError(
                "--row: \(unknown) is not a producer column; use \(Self.columns.sorted().joined(separator: ", "))"
            )
        }
        func text(_ name: String) throws -> String? {
            guard let value = row[name], !(value is NSNull) else { return nil }
            guard let text = value as? String else { throw CLIError("--row: \(name) must be a string") }
            return text
        }
        func integer(_ name: String) throws -> Int? {
            guard let value = row[name], !(value is NSNull) else { return nil }
            guard !(value is String), let number = value as? NSNumber,
                number.doubleValue == number.doubleValue.rounded(), abs(number.doubleValue) <= 32_767
            else {
                throw CLIError("--row: \(name) must be a whole number (priority 10, 5 or 1; max_attempts 1 to 32767)")
            }
            return number.intValue
        }
        func time(_ name: String) throws -> Date? {
            guard let value = try text(name) else { return nil }
            let formatter = ISO8601DateFormatter()
            formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
            let plain = ISO8601DateFormatter()
            guard let date = formatter.date(from: value) ?? plain.date(from: value) else {
                throw CLIError("--row: \(name) must be an ISO 8601 time such as 2026-11-25T18:00:00Z")
            }
            return date
        }
        guard let topic = try text("topic") else { throw CLIError("--row: topic is required (the app's bundle id)") }
        if try text("platform") == "fcm" {
            // What the INSERT would refuse for an Android row, said before it.
            for field in ["push_type", "channel_id", "environment"] where row[field] != nil && !(row[field] is NSNull) {
                throw CLIError("--row: \(field) is APNs' only; leave it out of an fcm row")
            }
        }
        let payload: String
        switch row["payload"] {
        case let text as String: payload = text
        case .some(let value) where JSONSerialization.isValidJSONObject(value):
            payload = String(decoding: try JSONSerialization.data(withJSONObject: value), as: UTF8.self)
        default: throw CLIError("--row: payload is required: a JSON object such as {\"aps\": {\"alert\": \"hi\"}}")
        }
        let apnsID: UUID
        if let text = try text("apns_id") {
            guard let parsed = UUID(uuidString: text) else { throw CLIError("--row: apns_id must be a UUID") }
            apnsID = parsed
        } else {
            apnsID = UUID()
        }
        var deliverOnce = false
        if let value = row["deliver_once"], !(value is NSNull) {
            guard let flag = value as? Bool else { throw CLIError("--row: deliver_once must be true or false") }
            deliverOnce = flag
        }
        return PushJob(
            id: 0,
            apnsID: apnsID,
            topic: topic,
            deviceToken: try text("device_token"),
            channelID: try text("channel_id"),
            payload: payload,
            pushType: try text("push_type") ?? "alert",
            priority: try integer("priority"),
            environment: try text("environment") ?? (try text("platform") == "fcm" ? "fcm" : "production"),
            credential: try text("credential") ?? "default",
            collapseID: try text("collapse_id"),
            deliverOnce: deliverOnce,
            expiresAt: try time("expires_at"),
            runAt: try time("run_at") ?? processClock.wallNow,
            maxAttempts: try integer("max_attempts"),
            createdAt: processClock.wallNow,
            coalesceKey: try text("coalesce_key"),
            platform: try text("platform").map { name in
                guard let platform = Platform(rawValue: name) else {
                    throw CLIError("--row: platform must be apns or fcm")
                }
                return platform
            } ?? .apns,
            traceparent: try text("traceparent").map { value in
                guard TraceParent(value) != nil else {
                    throw CLIError(
                        "--row: traceparent \(value) is not a W3C trace context (00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>, lowercase, ids not all zero); the worker would send the job untraced"
                    )
                }
                return value
            }
        )
    }
}
