import Foundation

/// The payload checks APNs would otherwise answer with an error, or a device would silently ignore:
/// a JSON object with an `aps` dictionary, and for Live Activities the required fields and unix-second
/// timestamps (trap MS032). Fields APNs accepts but a device would not honour as written come back as
/// warnings (PW101–PW103): the job is still sent.
enum PayloadRules {
    /// The `aps` keys whose presence needs the full parse (they may warn).
    static let keysWorthAParse: [[UInt8]] = ["mutable-content", "interruption-level", "relevance-score"].map {
        Array($0.utf8)
    }

    @discardableResult
    static func check(_ body: [UInt8], pushType: PushType) throws(PreSendRejection) -> [PayloadWarning] {
        // The common payload: a plain object with an `aps` object and none of the fields that warn. The byte
        // scanner proves that without building Foundation objects; anything else takes the full parse below.
        if pushType != .liveactivity, pushType != .mdm, let shape = PayloadShape.scan(body), shape.apsIsObject,
            !shape.apsKeys.contains(where: { key in Self.keysWorthAParse.contains { key.elementsEqual($0) } })
        {
            return []
        }
        return try self.checkByParsing(body, pushType: pushType)
    }

    /// The full check: `JSONSerialization`, then the rules on the parsed `aps`.
    @discardableResult
    static func checkByParsing(_ body: [UInt8], pushType: PushType) throws(PreSendRejection) -> [PayloadWarning] {
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
        if pushType == .mdm { return [] }
        guard let aps = object["aps"] as? [String: Any] else {
            throw PreSendRejection(
                reason: "InvalidPayload",
                trapID: nil,
                message: "payload has no \"aps\" dictionary: APNs needs one (put custom keys beside it)."
            )
        }
        if pushType == .liveactivity { try checkLiveActivity(aps) }
        return warnings(aps, pushType: pushType)
    }

    /// What a device would ignore or clamp: APNs accepts these, so they warn rather than refuse.
    static func warnings(_ aps: [String: Any], pushType: PushType) -> [PayloadWarning] {
        var warnings: [PayloadWarning] = []
        if let mutable = aps["mutable-content"] as? NSNumber, mutable.intValue == 1, !hasVisibleAlert(aps["alert"]) {
            warnings.append(
                PayloadWarning(
                    trapID: .mutableContentWithoutAlert,
                    message:
                        "aps.mutable-content is 1 but there is no visible alert (title, subtitle or body): the notification service extension only runs for alerts; add an alert or drop mutable-content."
                )
            )
        }
        if let level = aps["interruption-level"] {
            let text = level as? String
            if text == nil || !PayloadWarning.interruptionLevels.contains(text!) {
                warnings.append(
                    PayloadWarning(
                        trapID: .interruptionLevel,
                        message:
                            "aps.interruption-level \(text.map { "'\($0)'" } ?? "is not a string"): use passive, active, time-sensitive or critical (the device falls back to active)."
                    )
                )
            }
        }
        // Live Activities use relevance-score as a relative ordering with any range; alerts take 0 to 1.
        if pushType != .liveactivity, let score = aps["relevance-score"] {
            let value = score is String ? nil : (score as? NSNumber)?.doubleValue
            if value == nil || !(0...1).contains(value!) {
                warnings.append(
                    PayloadWarning(
                        trapID: .relevanceScore,
                        message:
                            "aps.relevance-score is \(value.map { "\($0)" } ?? "not a number"): use a number from 0 to 1 (the device clamps it)."
                    )
                )
            }
        }
        return warnings
    }

    /// An alert the user sees: a non-empty string, or a dictionary with a title, subtitle or body (or their
    /// localized keys).
    static func hasVisibleAlert(_ alert: Any?) -> Bool {
        if let text = alert as? String { return !text.isEmpty }
        guard let dictionary = alert as? [String: Any] else { return false }
        return ["title", "subtitle", "body", "title-loc-key", "subtitle-loc-key", "loc-key"].contains { key in
            if let text = dictionary[key] as? String { return !text.isEmpty }
            return dictionary[key] != nil && !(dictionary[key] is NSNull)
        }
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
