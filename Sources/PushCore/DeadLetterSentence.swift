/// The sentence a dead letter carries: what APNs (or the worker) said and what to fix. Never names the
/// token or the payload.
public enum DeadLetterSentence {
    /// The sentence for an APNs answer or transport failure that ended the job.
    public static func sentence(status: Int?, reason: String?, attempts: Int, exhausted: Bool) -> String {
        let reason = reason ?? "no reason"
        if exhausted {
            let what = status.map { "\($0) \(reason)" } ?? reason
            return "gave up after \(attempts) attempt\(attempts == 1 ? "" : "s"); the last ended in \(what). Check APNs status and the worker's connectivity, then replay if it is still worth sending."
        }
        switch reason {
        case "Unregistered", "ExpiredToken":
            return "APNs says the device token is no longer valid for this topic (\(reason)): stop sending to it; a token the app registers again later is valid."
        case "BadDeviceToken":
            return "APNs rejected the device token (BadDeviceToken): usually a sandbox token sent to production or the reverse; check the job's environment matches the app build (MS014)."
        case "DeviceTokenNotForTopic":
            return "the device token belongs to another app (DeviceTokenNotForTopic): check the job's topic is the bundle id the token was registered for."
        case "PayloadTooLarge":
            return "APNs refused the payload as too large (MS011): shorten it to the push type's limit."
        case "BadExpirationDate":
            return "APNs refused apns-expiration (MS032): expires_at must be a time in the future, in whole seconds."
        case "MissingTopic":
            return "APNs needs apns-topic (MS035): set the job's topic to the app's bundle id."
        case "TopicDisallowed":
            return "the signing key may not send to this topic (TopicDisallowed): check the bundle id and that the key belongs to the app's team."
        case "BadChannelId", "MissingChannelId", "ChannelNotRegistered":
            return "APNs refused the broadcast channel (\(reason), MS031): create the channel first (push-worker channels create) and use its id as sent back."
        case "FeatureNotEnabled":
            return "broadcast is not enabled for this app (FeatureNotEnabled, MS034): enable the Broadcast capability for the key and app."
        case "InvalidProviderToken", "MissingProviderToken", "Forbidden", "BadEnvironmentKeyIdInToken":
            return "APNs rejected the provider token (\(reason), MS030): check APNS_KEY_ID, APNS_TEAM_ID and the .p8 belong together and to this app's team."
        case "TooManyProviderTokenUpdates":
            return "APNs saw provider tokens refreshed too often (TooManyProviderTokenUpdates, MS030): make sure every worker shares one token per key."
        default:
            return "APNs answered \(status.map(String.init) ?? "-") \(reason): this job cannot succeed as it is; fix the job's columns and replay it."
        }
    }
}
