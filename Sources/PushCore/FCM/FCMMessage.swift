public import Foundation

/// The body of one FCM HTTP v1 send (`POST /v1/projects/<project_id>/messages:send`) for a job, minus the
/// URL's project (the credential's) and the access token: what `push-worker describe` prints and what the
/// transport writes.
public struct FCMMessage: Sendable, Hashable {
    /// `{"message": {…}}`, byte for byte.
    public var body: [UInt8]
    /// `HIGH` or `NORMAL` (`android.priority`).
    public var androidPriority: String
    /// `android.ttl` as sent (`"3600s"`; `"0s"` for deliver_once).
    public var ttl: String
    /// The job's `apns_id`, sent as `data.push_id` for the app to drop a second delivery.
    public var pushID: UUID

    /// The request path for a project.
    public static func path(project: String) -> String { "/v1/projects/\(project)/messages:send" }
}

/// Builds a job's FCM message after the pre-send checks (CONTRACT.md 1b), or says why it must never be sent.
public enum FCMMessageBuilder {
    /// FCM's ceiling on a message's payload (notification and data), in bytes.
    public static let payloadLimit = 4096
    /// FCM's longest `android.ttl`: 28 days, in seconds.
    public static let maximumTTL: Int64 = 2_419_200

    /// The fields a payload may carry: the message without its target.
    public static let payloadFields: Set<String> = ["notification", "data", "android", "fcm_options"]

    /// The message a send of `job` issues at `now`, or the rejection that dead-letters it unsent.
    ///
    /// Checks, in order: target (a registration token), token death, expiry, priority, the payload (an
    /// object of FCM's message fields without its target, `data` values strings, none of the fields the
    /// worker sets, within 4,096 bytes).
    public static func describe(_ job: PushJob, now: Date) throws(PreSendRejection) -> FCMMessage {
        guard let token = job.deviceToken, !token.isEmpty else {
            throw PreSendRejection(
                reason: "MissingDeviceToken",
                trapID: .fcmPayload,
                message: "an FCM job needs device_token, the registration token the app received: set it."
            )
        }
        if let died = job.tokenInvalidatedAt {
            throw PreSendRejection(
                reason: "TokenInvalidated",
                trapID: .fcmTokenUnregistered,
                message:
                    "FCM reported this registration token invalid at \(died.formatted(.iso8601)), after the job was enqueued: it was not sent. Drop the token (push.invalid_tokens lists it); the app gets a new one from FirebaseMessaging."
            )
        }
        let expiry = try RequestBuilder.expiry(of: job, now: now)
        let priority = job.priority ?? 10
        guard priority == 10 || priority == 5 else {
            throw PreSendRejection(
                reason: "BadPriority",
                trapID: .fcmPayload,
                message: "priority \(priority) is not an FCM priority: use 10 (HIGH) or 5 (NORMAL)."
            )
        }
        let androidPriority = priority == 10 ? "HIGH" : "NORMAL"
        // FCM takes a ttl of at most 28 days; a later expires_at is held to it.
        let seconds =
            job.deliverOnce ? 0 : min(Self.maximumTTL, max(0, Int64(expiry.timeIntervalSince(now).rounded(.down))))
        let ttl = "\(seconds)s"
        let pushID = job.apnsID.uuidString.lowercased()
        let compact = CompactJSON.bytes(job.payload)
        if compact.count <= Self.payloadLimit,
            let body = Self.splicedBody(
                compact: compact,
                token: token,
                androidPriority: androidPriority,
                ttl: ttl,
                collapseKey: job.collapseID,
                pushID: pushID
            )
        {
            return FCMMessage(body: body, androidPriority: androidPriority, ttl: ttl, pushID: job.apnsID)
        }
        guard let object = try? JSONSerialization.jsonObject(with: Data(job.payload.utf8)) as? [String: Any] else {
            throw Self.refused(
                "payload is not a JSON object: write an FCM message's fields (notification, data, android, fcm_options)."
            )
        }
        if object["aps"] != nil {
            throw Self.refused(
                "payload carries \"aps\", an APNs payload: an FCM job's payload is an FCM message's fields (notification, data, android, fcm_options), or set platform to apns."
            )
        }
        for target in ["token", "topic", "condition"] where object[target] != nil {
            throw Self.refused(
                "payload sets \"\(target)\": the worker addresses the message to the job's device_token; remove it."
            )
        }
        if let unknown = object.keys.filter({ !Self.payloadFields.contains($0) }).sorted().first {
            throw Self.refused(
                "payload has \"\(unknown)\", which is not an FCM message field this worker sends: use notification, data, android or fcm_options."
            )
        }
        var android: [String: Any] = [:]
        if let given = object["android"] {
            guard let dictionary = given as? [String: Any] else {
                throw Self.refused("payload's \"android\" is not an object: write FCM's AndroidConfig fields.")
            }
            android = dictionary
        }
        if android["data"] != nil {
            throw Self.refused(
                "payload sets android.data, which replaces the message's data on Android and so drops data.push_id (the app's guard against a second delivery): put the values in data instead."
            )
        }
        for field in ["priority", "ttl", "collapse_key"] where android[field] != nil {
            let column = ["priority": "priority", "ttl": "expires_at or deliver_once", "collapse_key": "collapse_id"][
                field
            ]!
            throw Self.refused(
                "payload sets android.\(field), which the worker sets from the job's \(column) column: remove it and set the column."
            )
        }
        var data: [String: Any] = [:]
        if let given = object["data"] {
            guard let dictionary = given as? [String: Any] else {
                throw Self.refused("payload's \"data\" is not an object of string values.")
            }
            data = dictionary
        }
        if let key = data.keys.sorted().first(where: { !(data[$0] is String) }) {
            throw PreSendRejection(
                reason: "InvalidPayload",
                trapID: .fcmDataStrings,
                message:
                    "payload's data.\(key) is not a string: FCM takes data values as strings only; encode numbers and objects as text (JSON in a string)."
            )
        }
        if data["push_id"] != nil {
            throw Self.refused(
                "payload sets data.push_id, which the worker sets to the job's apns_id for the app to drop a second delivery: remove it."
            )
        }
        let size = compact.count
        if size > Self.payloadLimit {
            throw PreSendRejection(
                reason: "PayloadTooLarge",
                trapID: .fcmPayloadTooLarge,
                message:
                    "payload is \(size) bytes; FCM allows \(Self.payloadLimit): shorten the text or move data to your server."
            )
        }
        android["priority"] = androidPriority
        android["ttl"] = ttl
        if let collapse = job.collapseID { android["collapse_key"] = collapse }
        // The system tray shows a notification message without the app's code, so data.push_id cannot drop a
        // second delivery: the push id as its tag makes a resend replace the shown one, never double it.
        if object["notification"] != nil || android["notification"] != nil {
            var notification = android["notification"] as? [String: Any] ?? [:]
            if notification["tag"] == nil {
                notification["tag"] = pushID
                android["notification"] = notification
            }
        }
        data["push_id"] = pushID
        var message = object
        message["token"] = token
        message["android"] = android
        message["data"] = data
        let body: Data
        do {
            body = try JSONSerialization.data(
                withJSONObject: ["message": message],
                options: [.sortedKeys, .withoutEscapingSlashes]
            )
        } catch {
            throw Self.refused("payload could not be written back as JSON: \(error)")
        }
        return FCMMessage(body: Array(body), androidPriority: androidPriority, ttl: ttl, pushID: job.apnsID)
    }

    private static func refused(_ message: String) -> PreSendRejection {
        PreSendRejection(reason: "InvalidPayload", trapID: .fcmPayload, message: message)
    }
}
