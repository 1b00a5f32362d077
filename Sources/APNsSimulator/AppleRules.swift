/// What APNs accepts, written for the simulator from Apple's "Sending notification requests to APNs"
/// header table on its own, not from PushCore: a mistake in the worker's rules must not pass both the
/// worker and its test double.
enum AppleRules {
    /// One `apns-push-type` as Apple documents it.
    struct PushTypeRule {
        /// What `apns-topic` must end with (empty: the bare bundle id).
        var topicSuffix: String
        /// The `apns-priority` values accepted.
        var priorities: Set<Int>
        /// The largest body in bytes.
        var payloadLimit: Int
    }

    /// Apple's push types: topic suffix, priorities, payload ceiling.
    static let pushTypes: [String: PushTypeRule] = [
        "alert": PushTypeRule(topicSuffix: "", priorities: [10, 5, 1], payloadLimit: 4_096),
        "background": PushTypeRule(topicSuffix: "", priorities: [5, 1], payloadLimit: 4_096),
        "mdm": PushTypeRule(topicSuffix: "", priorities: [10, 5, 1], payloadLimit: 4_096),
        "liveactivity": PushTypeRule(
            topicSuffix: ".push-type.liveactivity",
            priorities: [10, 5, 1],
            payloadLimit: 4_096
        ),
        "voip": PushTypeRule(topicSuffix: ".voip", priorities: [10, 5, 1], payloadLimit: 5_120),
        "complication": PushTypeRule(topicSuffix: ".complication", priorities: [10, 5, 1], payloadLimit: 4_096),
        "fileprovider": PushTypeRule(
            topicSuffix: ".pushkit.fileprovider",
            priorities: [10, 5, 1],
            payloadLimit: 4_096
        ),
        "location": PushTypeRule(topicSuffix: ".location-query", priorities: [10, 5, 1], payloadLimit: 4_096),
        "pushtotalk": PushTypeRule(topicSuffix: ".voip-ptt", priorities: [10, 5, 1], payloadLimit: 4_096),
        "widgets": PushTypeRule(topicSuffix: ".push-type.widgets", priorities: [10, 5, 1], payloadLimit: 4_096),
        "controls": PushTypeRule(topicSuffix: ".push-type.controls", priorities: [10, 5, 1], payloadLimit: 4_096),
    ]

    /// The largest broadcast body in bytes.
    static let broadcastPayloadLimit = 5_120

    /// Whether a bundle id (the topic less its push type's suffix) still ends in a push-type suffix.
    static func carriesSuffix(_ bundle: String) -> Bool {
        pushTypes.values.contains { !$0.topicSuffix.isEmpty && bundle.hasSuffix($0.topicSuffix) }
            || bundle.contains(".push-type.")
    }
}
