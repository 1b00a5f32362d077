public import Foundation

/// Builds the request for a job after the pre-send checks, or says why the job must never be sent.
public enum RequestBuilder {
    /// How long a job with no `expires_at` stays sendable after its first attempt.
    public static let defaultExpiry: TimeInterval = 3600

    /// Whether `token` has the shape of an FCM registration token (`<instance id>:<base64url>`, well over 100
    /// characters) rather than an APNs device token (hex).
    public static func looksLikeFCMToken(_ token: String) -> Bool {
        guard token.count >= 100, let colon = token.firstIndex(of: ":"), colon != token.startIndex else {
            return false
        }
        return token.utf8.allSatisfy { $0.isBase64URLOrColon }
    }

    /// When `job` stops being sendable (`expires_at`, else 1 hour after its first request), or the rejection
    /// of a job past it: the same rule for every provider.
    public static func expiry(of job: PushJob, now: Date) throws(PreSendRejection) -> Date {
        let expiry = job.expiresAt ?? (job.firstAttemptAt ?? now).addingTimeInterval(Self.defaultExpiry)
        if now > expiry {
            let whose =
                job.expiresAt == nil ? "the default expiry (1 hour after the first request was sent)" : "expires_at"
            throw PreSendRejection(
                reason: "Expired",
                trapID: nil,
                message:
                    "the job passed \(whose) before it could be sent: set a later expires_at if it is still worth sending."
            )
        }
        return expiry
    }

    /// The exact request a send of `job` issues at `now`, or the rejection that dead-letters it unsent.
    ///
    /// Checks, in order: push type, environment, target (hex device token or channel id), expiry,
    /// topic suffix (MS018), priority for the push type (MS015), collapse id, payload (a JSON object with
    /// `aps`, within the size limit, MS011), Live Activity fields and timestamps (MS032).
    public static func describe(_ job: PushJob, now: Date) throws(PreSendRejection) -> APNsRequest {
        guard let pushType = PushType(rawValue: job.pushType) else {
            throw PreSendRejection(
                reason: "InvalidPushType",
                trapID: nil,
                message:
                    "push_type '\(job.pushType)' is not an APNs push type: use one of \(PushType.allCases.map(\.rawValue).joined(separator: ", "))."
            )
        }
        guard let environment = APNsEnvironment(rawValue: job.environment) else {
            throw PreSendRejection(
                reason: "BadEnvironment",
                trapID: .tokenEnvironment,
                message: "environment '\(job.environment)' is neither production nor development."
            )
        }
        let isBroadcast = job.channelID != nil
        if let token = job.deviceToken {
            if Self.looksLikeFCMToken(token) {
                throw PreSendRejection(
                    reason: "BadDeviceToken",
                    trapID: .tokenEnvironment,
                    message:
                        "device_token looks like an FCM registration token (Android), not an APNs device token: APNs cannot deliver to it. Android devices are reached through FCM: insert the job with platform = 'fcm' (docs/reference.md, Android)."
                )
            }
            guard !token.isEmpty, token.count % 2 == 0, token.utf8.allSatisfy(\.isHexDigit) else {
                throw PreSendRejection(
                    reason: "BadDeviceToken",
                    trapID: .tokenEnvironment,
                    message:
                        "device_token is not a hex string of whole bytes: store the token as the app received it, hex-encoded, without spaces or brackets."
                )
            }
        } else if job.channelID == nil || job.channelID!.isEmpty {
            throw PreSendRejection(
                reason: "MissingDeviceToken",
                trapID: nil,
                message: "the job has neither device_token nor channel_id: set exactly one."
            )
        }
        if let died = job.tokenInvalidatedAt {
            throw PreSendRejection(
                reason: "TokenInvalidated",
                trapID: .tokenUnregistered,
                message:
                    "APNs reported this device token invalid at \(died.formatted(.iso8601)), after the job was enqueued: it was not sent. Drop the token (push.invalid_tokens lists it); the app registers a new one."
            )
        }
        let expiry = try Self.expiry(of: job, now: now)
        if job.topic.isEmpty {
            throw PreSendRejection(
                reason: "MissingTopic",
                trapID: .topicMissing,
                message: "topic is empty: set it to the app's bundle id."
            )
        }
        if let suffix = PushType.suffix(in: job.topic) {
            throw PreSendRejection(
                reason: "TopicHasPushTypeSuffix",
                trapID: .topicSuffix,
                message:
                    "topic '\(job.topic)' already carries the push-type suffix '\(suffix)': store the bare bundle id; the worker appends the suffix push_type needs."
            )
        }
        let priority = job.sendPriority
        guard pushType.allows(priority: priority) else {
            throw PreSendRejection(
                reason: "BadPriority",
                trapID: .priorityBudget,
                message:
                    "priority \(priority) is not allowed for \(pushType.rawValue) pushes: use \(pushType.allowedPriorities.sorted(by: >).map(String.init).joined(separator: " or "))."
            )
        }
        if let collapse = job.collapseID, collapse.utf8.count > 64 {
            throw PreSendRejection(
                reason: "BadCollapseId",
                trapID: nil,
                message: "collapse_id is \(collapse.utf8.count) bytes: APNs allows at most 64."
            )
        }
        if isBroadcast && pushType != .liveactivity {
            throw PreSendRejection(
                reason: "InvalidPushType",
                trapID: .channel,
                message:
                    "broadcast channels carry Live Activity updates only: set push_type to liveactivity for a channel_id job."
            )
        }
        // jsonb prints a space after every `:` and `,`: send (and judge) the compact bytes.
        let body = CompactJSON.bytes(job.payload)
        let limit = isBroadcast ? PushType.broadcastPayloadLimit : pushType.payloadLimit
        if body.count > limit {
            throw PreSendRejection(
                reason: "PayloadTooLarge",
                trapID: .payloadTooLarge,
                message:
                    "payload is \(body.count) bytes; \(isBroadcast ? "broadcast" : pushType.rawValue) pushes allow \(limit): shorten the text or move data to your server."
            )
        }
        let warnings = try PayloadRules.check(body, pushType: pushType, isBroadcast: isBroadcast, now: now)

        var headers: [(name: String, value: String)] = [("apns-push-type", pushType.rawValue)]
        if !isBroadcast { headers.append(("apns-topic", job.topic + pushType.topicSuffix)) }
        headers.append(("apns-priority", String(priority)))
        // 0: one delivery attempt, nothing stored. Asked for by deliver_once, and always for a broadcast without
        // expires_at (no-storage channels, the default, refuse anything else with BadExpirationDate).
        let nowOrNever = job.deliverOnce || (isBroadcast && job.expiresAt == nil)
        headers.append(
            ("apns-expiration", nowOrNever ? "0" : String(Int64(expiry.timeIntervalSince1970.rounded(.down))))
        )
        if let collapse = job.collapseID { headers.append(("apns-collapse-id", collapse)) }
        // Apple's broadcast requests carry the id as apns-request-id (echoed back); device sends as apns-id.
        headers.append((isBroadcast ? "apns-request-id" : "apns-id", job.apnsID.lowercaseString))
        if let channel = job.channelID { headers.append(("apns-channel-id", channel)) }
        let path = isBroadcast ? "/4/broadcasts/apps/\(job.topic)" : "/3/device/\(job.deviceToken!)"
        return APNsRequest(
            environment: environment,
            path: path,
            headers: headers,
            body: body,
            limit: limit,
            apnsID: job.apnsID,
            warnings: warnings
        )
    }
}

extension UInt8 {
    var isHexDigit: Bool {
        (0x30...0x39).contains(self) || (0x41...0x46).contains(self) || (0x61...0x66).contains(self)
    }
}

extension UUID {
    /// The lowercase 8-4-4-4-12 form, formatted from the bytes (no Foundation string formatting per request).
    var lowercaseString: String {
        let digits: [UInt8] = Array("0123456789abcdef".utf8)
        return withUnsafeBytes(of: self.uuid) { bytes in
            String(unsafeUninitializedCapacity: 36) { out in
                var n = 0
                for (i, byte) in bytes.enumerated() {
                    if i == 4 || i == 6 || i == 8 || i == 10 {
                        out[n] = UInt8(ascii: "-")
                        n += 1
                    }
                    out[n] = digits[Int(byte >> 4)]
                    out[n + 1] = digits[Int(byte & 0x0F)]
                    n += 2
                }
                return n
            }
        }
    }
}

extension UInt8 {
    fileprivate var isBase64URLOrColon: Bool {
        (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(self) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(self)
            || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(self) || self == UInt8(ascii: "-")
            || self == UInt8(ascii: "_") || self == UInt8(ascii: ":")
    }
}
