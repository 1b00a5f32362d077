import Foundation

/// The payload checks APNs would otherwise answer with an error, or a device would silently ignore:
/// a JSON object with an `aps` dictionary, and for Live Activities the required fields and unix-second
/// timestamps (trap MS032), and no `start` event on a broadcast channel. Fields APNs accepts but a device would
/// not honour as written come back as warnings (PW101–PW107): the job is still sent.
enum PayloadRules {
    /// The `aps` keys whose presence needs the full parse (they may warn).
    static let keysWorthAParse: [[UInt8]] = ["mutable-content", "interruption-level", "relevance-score"].map {
        Array($0.utf8)
    }

    /// The `aps` keys a background push must not carry (PW104).
    static let userFacingKeys: [[UInt8]] = ["alert", "sound", "badge"].map { Array($0.utf8) }

    /// How far ahead a Live Activity's `timestamp` may be before iOS drops the update.
    static let liveActivityHorizon: TimeInterval = 8 * 3600

    /// - Parameters:
    ///   - isBroadcast: the job goes to a broadcast channel (`start` is refused there).
    ///   - now: the time a Live Activity `timestamp` is judged against (`nil`: not judged).
    @discardableResult
    static func check(
        _ body: [UInt8],
        pushType: PushType,
        isBroadcast: Bool = false,
        now: Date? = nil
    ) throws(PreSendRejection) -> [PayloadWarning] {
        // The common payload: a plain object with an `aps` object and none of the fields that warn. The byte
        // scanner proves that without building Foundation objects; anything else takes the full parse below.
        if pushType != .liveactivity, pushType != .mdm, let shape = PayloadShape.scan(body), shape.apsIsObject,
            !shape.soundIsObject,
            !shape.apsKeys.contains(where: { key in Self.keysWorthAParse.contains { key.elementsEqual($0) } }),
            pushType != .background
                || !shape.apsKeys.contains(where: { key in Self.userFacingKeys.contains { key.elementsEqual($0) } })
        {
            return []
        }
        return try self.checkByParsing(body, pushType: pushType, isBroadcast: isBroadcast, now: now)
    }

    /// The full check: `JSONSerialization`, then the rules on the parsed `aps`.
    @discardableResult
    static func checkByParsing(
        _ body: [UInt8],
        pushType: PushType,
        isBroadcast: Bool = false,
        now: Date? = nil
    ) throws(PreSendRejection) -> [PayloadWarning] {
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
        var warnings: [PayloadWarning] = []
        if pushType == .liveactivity {
            try checkLiveActivity(aps, isBroadcast: isBroadcast)
            warnings += liveActivityWarnings(aps, now: now)
        }
        return warnings + self.warnings(aps, pushType: pushType)
    }

    /// What iOS does not show or drops in a Live Activity push that APNs accepts (PW105, PW106).
    static func liveActivityWarnings(_ aps: [String: Any], now: Date?) -> [PayloadWarning] {
        var warnings: [PayloadWarning] = []
        if aps["event"] as? String == "start", !hasVisibleAlert(aps["alert"]) {
            warnings.append(
                PayloadWarning(
                    trapID: .liveActivityStartWithoutAlert,
                    message:
                        "a Live Activity start without aps.alert starts the activity but does not show it on the lock screen: add an alert with a title and body."
                )
            )
        }
        if let now, let timestamp = (aps["timestamp"] as? NSNumber)?.doubleValue,
            timestamp - now.timeIntervalSince1970 > Self.liveActivityHorizon
        {
            let hours = (timestamp - now.timeIntervalSince1970) / 3600
            warnings.append(
                PayloadWarning(
                    trapID: .liveActivityTimestampAhead,
                    message:
                        "aps.timestamp is \(String(format: "%.1f", hours)) hours ahead: iOS drops a Live Activity update timestamped more than 8 hours in the future; send the time the content was produced."
                )
            )
        }
        return warnings
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
        if pushType == .background {
            let carried = ["alert", "sound", "badge"].filter { aps[$0] != nil }
            if !carried.isEmpty {
                warnings.append(
                    PayloadWarning(
                        trapID: .backgroundWithAlert,
                        message:
                            "a background push carries aps.\(carried.joined(separator: ", aps.")): iOS drops or throttles background pushes that do; send content-available alone, and what the user should see as an alert push."
                    )
                )
            }
        }
        if let sound = aps["sound"] as? [String: Any], let problem = Self.criticalSoundProblem(sound) {
            warnings.append(PayloadWarning(trapID: .criticalSound, message: problem))
        }
        return warnings
    }

    /// What is wrong with a `sound` dictionary (a critical alert's), or `nil`: `critical` 0 or 1, `volume` a
    /// number from 0 to 1, `name` a string.
    static func criticalSoundProblem(_ sound: [String: Any]) -> String? {
        if let critical = sound["critical"] {
            // Not `is Bool`: Foundation on Linux bridges any NSNumber to Bool.
            let value = critical is String ? nil : (critical as? NSNumber)?.doubleValue
            if value == nil || ![0, 1].contains(value!) {
                return "aps.sound.critical must be 0 or 1: the device plays a normal sound instead."
            }
        }
        if let volume = sound["volume"] {
            let value = volume is String ? nil : (volume as? NSNumber)?.doubleValue
            if value == nil || !(0...1).contains(value!) {
                return "aps.sound.volume must be a number from 0 to 1: the device uses its own volume instead."
            }
        }
        if sound["name"] != nil, !(sound["name"] is String) {
            return "aps.sound.name must be the sound file's name as a string (or \"default\")."
        }
        if sound["name"] == nil {
            return "aps.sound has no name: set name to the sound file's name, or \"default\"."
        }
        return nil
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

    static func checkLiveActivity(_ aps: [String: Any], isBroadcast: Bool = false) throws(PreSendRejection) {
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
        if isBroadcast && event == "start" {
            throw PreSendRejection(
                reason: "BroadcastStart",
                trapID: .channel,
                message:
                    "a broadcast channel carries Live Activity update and end events only: start the activity with a push-to-start sent to a device's push-to-start token, then broadcast its updates."
            )
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
