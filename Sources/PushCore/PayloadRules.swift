import Foundation

/// The payload checks APNs would otherwise answer with an error, or a device would silently ignore:
/// a JSON object with an `aps` dictionary, and for Live Activities the required fields and unix-second
/// timestamps (trap MS032).
enum PayloadRules {
    static func check(_ body: [UInt8], pushType: PushType) throws(PreSendRejection) {
        guard !body.isEmpty else {
            throw PreSendRejection(
                reason: "PayloadEmpty",
                trapID: nil,
                message: "payload is empty: send at least {\"aps\":{}}."
            )
        }
        guard let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else {
            throw PreSendRejection(reason: "InvalidPayload", trapID: nil, message: "payload is not a JSON object.")
        }
        if pushType == .mdm { return }
        guard let aps = object["aps"] as? [String: Any] else {
            throw PreSendRejection(
                reason: "InvalidPayload",
                trapID: nil,
                message: "payload has no \"aps\" dictionary: APNs needs one (put custom keys beside it)."
            )
        }
        if pushType == .liveactivity { try checkLiveActivity(aps) }
    }

    static func checkLiveActivity(_ aps: [String: Any]) throws(PreSendRejection) {
        func missing(_ field: String, _ why: String) -> PreSendRejection {
            PreSendRejection(
                reason: "InvalidLiveActivityPayload",
                trapID: nil,
                message: "Live Activity payload lacks aps.\(field): \(why)"
            )
        }
        guard aps["timestamp"] != nil else {
            throw missing("timestamp", "set it to the unix time in seconds of the content.")
        }
        guard let event = aps["event"] as? String, ["start", "update", "end"].contains(event) else {
            throw missing("event", "set it to start, update or end.")
        }
        for field in ["timestamp", "stale-date", "dismissal-date"] {
            guard let value = aps[field] else { continue }
            try checkSeconds(value, field: field)
        }
        if event != "end" && aps["content-state"] == nil {
            throw missing("content-state", "start and update events carry the new content state.")
        }
        if event == "start" {
            if aps["attributes-type"] == nil {
                throw missing("attributes-type", "a push-to-start names the ActivityAttributes type.")
            }
            if aps["attributes"] == nil {
                throw missing("attributes", "a push-to-start carries the static attributes.")
            }
        }
    }

    /// A positive integer of seconds, below 1e11 (a larger value is milliseconds by mistake).
    static func checkSeconds(_ value: Any, field: String) throws(PreSendRejection) {
        guard !(value is String), let number = value as? NSNumber else {
            throw PreSendRejection(
                reason: "BadTimestamp",
                trapID: .timestamps,
                message: "aps.\(field) is not a number: use unix time in whole seconds."
            )
        }
        let double = number.doubleValue
        guard double > 0, double == double.rounded() else {
            throw PreSendRejection(
                reason: "BadTimestamp",
                trapID: .timestamps,
                message: "aps.\(field) is \(number): use a positive whole number of unix seconds."
            )
        }
        guard double < 1e11 else {
            throw PreSendRejection(
                reason: "BadTimestamp",
                trapID: .timestamps,
                message: "aps.\(field) is \(number), which is milliseconds: divide by 1000 to send unix seconds."
            )
        }
    }
}
