/// An APNs error reason (the `reason` of an error body), with its class, trap id and dead-letter
/// sentence in one table row: the one place a reason is interpreted. Unknown reasons keep their text.
public enum APNsReason: Sendable, Hashable, CustomStringConvertible {
    case unregistered, expiredToken, badDeviceToken, deviceTokenNotForTopic
    case tooManyRequests, internalServerError, serviceUnavailable, shutdown, idleTimeout
    case expiredProviderToken, unrelatedKeyIdInToken
    case invalidProviderToken, missingProviderToken, forbidden, badEnvironmentKeyIdInToken, badCertificate
    case badCertificateEnvironment, tooManyProviderTokenUpdates, topicDisallowed
    case badCollapseId, badExpirationDate, badMessageId, badPriority, badTopic, duplicateHeaders, invalidPushType
    case missingDeviceToken, missingTopic, payloadEmpty, badPath, methodNotAllowed, payloadTooLarge
    case missingChannelId, badChannelId, channelNotRegistered, featureNotEnabled
    case missingPushType, badDate, cannotCreateChannelConfig
    /// A reason this build does not know, as APNs sent it.
    case unknown(String)

    /// What a reason means: its class, trap id and, for a final answer, what to fix.
    public struct Row: Sendable {
        /// What it means for the job.
        public var responseClass: APNsResponseClass
        /// The trap id it meets, if any.
        public var trapID: TrapID?
        /// The dead letter's sentence when this reason ends a job; `nil` for the generic one.
        public var sentence: String?
        /// What the transport does about it on the connection, once per request, before the job sees it.
        public var connection: ConnectionEffect = .none
    }

    /// Every known reason with its wire text and row (APNS.md, "Responses: what each means for a job").
    public static let table: [(reason: APNsReason, text: String, row: Row)] = {
        func r(
            _ reason: APNsReason,
            _ text: String,
            _ c: APNsResponseClass,
            _ trap: TrapID? = nil,
            _ sentence: String? = nil,
            connection: ConnectionEffect = .none
        ) -> (APNsReason, String, Row) {
            (reason, text, Row(responseClass: c, trapID: trap, sentence: sentence, connection: connection))
        }
        let credential =
            "APNs rejected the provider token (%@, MS030): check APNS_KEY_ID, APNS_TEAM_ID and the .p8 belong together and to this app's team."
        let channel =
            "APNs refused the broadcast channel (%@, MS031): create the channel first (push-worker channels create) and use its id as sent back."
        let gone =
            "APNs says the device token is no longer valid for this topic (%@): stop sending to it; a token the app registers again later is valid."
        return [
            r(.unregistered, "Unregistered", .tokenInvalid, .tokenUnregistered, gone),
            r(.expiredToken, "ExpiredToken", .tokenInvalid, .tokenUnregistered, gone),
            r(
                .badDeviceToken,
                "BadDeviceToken",
                .tokenInvalid,
                .tokenEnvironment,
                "APNs rejected the device token (BadDeviceToken): usually a sandbox token sent to production or the reverse; check the job's environment matches the app build (MS014)."
            ),
            r(
                .deviceTokenNotForTopic,
                "DeviceTokenNotForTopic",
                .tokenInvalid,
                nil,
                "the device token belongs to another app (DeviceTokenNotForTopic): check the job's topic is the bundle id the token was registered for."
            ),
            r(.tooManyRequests, "TooManyRequests", .retryable, .priorityBudget),
            r(.internalServerError, "InternalServerError", .retryable),
            r(.serviceUnavailable, "ServiceUnavailable", .retryable),
            r(.shutdown, "Shutdown", .retryable),
            r(.idleTimeout, "IdleTimeout", .retryable),
            r(
                .expiredProviderToken,
                "ExpiredProviderToken",
                .credentialRetry,
                .providerToken,
                connection: .reMintToken
            ),
            r(
                .unrelatedKeyIdInToken,
                "UnrelatedKeyIdInToken",
                .credentialRetry,
                .providerToken,
                connection: .reconnect
            ),
            r(.invalidProviderToken, "InvalidProviderToken", .credentialFatal, .providerToken, credential),
            r(.missingProviderToken, "MissingProviderToken", .credentialFatal, .providerToken, credential),
            r(.forbidden, "Forbidden", .credentialFatal, .providerToken, credential),
            r(.badEnvironmentKeyIdInToken, "BadEnvironmentKeyIdInToken", .credentialFatal, nil, credential),
            r(.badCertificate, "BadCertificate", .credentialFatal),
            r(.badCertificateEnvironment, "BadCertificateEnvironment", .credentialFatal),
            r(
                .tooManyProviderTokenUpdates,
                "TooManyProviderTokenUpdates",
                .credentialFatal,
                .providerToken,
                "APNs saw provider tokens refreshed too often (TooManyProviderTokenUpdates, MS030): make sure every worker shares one token per key.",
                connection: .adoptSharedToken
            ),
            r(
                .topicDisallowed,
                "TopicDisallowed",
                .topicFatal,
                .topicSuffix,
                "the credential may not send to this topic (TopicDisallowed): check the bundle id, that the key belongs to the app's team, or that the certificate is the app's."
            ),
            // The token's iat is refused: the host clock is off. Every job of the credential meets it, so it is
            // held like a credential fault (APNS.md), never dead-lettered job by job.
            r(
                .badDate,
                "BadDate",
                .credentialFatal,
                .providerToken,
                "APNs refused the provider token's issue time (BadDate, MS030): the host clock is off; sync it (chrony or systemd-timesyncd) and resume."
            ),
            r(
                .missingPushType,
                "MissingPushType",
                .permanent,
                nil,
                "APNs needs apns-push-type (MissingPushType): set the job's push_type (alert, background, liveactivity, …)."
            ),
            r(
                .cannotCreateChannelConfig,
                "CannotCreateChannelConfig",
                .permanent,
                .channel,
                "APNs would not create the channel (CannotCreateChannelConfig, MS031): an app may have 10,000 channels per environment; delete unused ones (push-worker channels delete)."
            ),
            r(.badCollapseId, "BadCollapseId", .permanent),
            r(
                .badExpirationDate,
                "BadExpirationDate",
                .permanent,
                .timestamps,
                "APNs refused apns-expiration (BadExpirationDate, MS032): expires_at must be a time in the future, in whole seconds."
            ),
            r(.badMessageId, "BadMessageId", .permanent),
            r(.badPriority, "BadPriority", .permanent),
            r(.badTopic, "BadTopic", .permanent),
            r(.duplicateHeaders, "DuplicateHeaders", .permanent),
            r(.invalidPushType, "InvalidPushType", .permanent),
            r(.missingDeviceToken, "MissingDeviceToken", .permanent),
            r(
                .missingTopic,
                "MissingTopic",
                .permanent,
                .topicMissing,
                "APNs needs apns-topic (MissingTopic, MS035): set the job's topic to the app's bundle id."
            ),
            r(.payloadEmpty, "PayloadEmpty", .permanent),
            r(.badPath, "BadPath", .permanent),
            r(.methodNotAllowed, "MethodNotAllowed", .permanent),
            r(
                .payloadTooLarge,
                "PayloadTooLarge",
                .permanent,
                .payloadTooLarge,
                "APNs refused the payload as too large (PayloadTooLarge, MS011): shorten it to the push type's limit."
            ),
            r(.missingChannelId, "MissingChannelId", .permanent, .channel, channel),
            r(.badChannelId, "BadChannelId", .permanent, .channel, channel),
            r(.channelNotRegistered, "ChannelNotRegistered", .permanent, .channel, channel),
            r(
                .featureNotEnabled,
                "FeatureNotEnabled",
                .permanent,
                .broadcastNotEnabled,
                "broadcast is not enabled for this app (FeatureNotEnabled, MS034): enable the Broadcast capability for the key and app."
            ),
        ].map { (reason: $0.0, text: $0.1, row: $0.2) }
    }()

    private static let byText: [String: (APNsReason, Row)] = Dictionary(
        uniqueKeysWithValues: table.map { ($0.text, ($0.reason, $0.row)) }
    )
    private static let byReason: [APNsReason: (String, Row)] = Dictionary(
        uniqueKeysWithValues: table.map { ($0.reason, ($0.text, $0.row)) }
    )

    /// The reason for APNs' text (`unknown` for text this build does not know).
    public init(_ text: String) {
        self = Self.byText[text]?.0 ?? .unknown(text)
    }

    /// The wire text.
    public var description: String {
        if case .unknown(let text) = self { return text }
        return Self.byReason[self]?.0 ?? ""
    }

    /// The reason's row; `nil` for an unknown reason.
    public var row: Row? { Self.byReason[self]?.1 }

    /// What the transport does on the connection about an answer, from the reason's row (none for a 200 or
    /// a reason this build does not know).
    public static func connectionEffect(status: Int, reason: String?) -> ConnectionEffect {
        guard status != 200, let reason else { return .none }
        return APNsReason(reason).row?.connection ?? .none
    }

    /// The dead letter's sentence for a final answer with this reason, naming what to fix.
    public func sentence(status: Int?) -> String {
        if let template = self.row?.sentence { return template.replacingFirst("%@", with: self.description) }
        return
            "APNs answered \(status.map(String.init) ?? "-") \(self.description): this job cannot succeed as it is; fix the job's columns and replay it."
    }
}

extension String {
    fileprivate func replacingFirst(_ target: String, with replacement: String) -> String {
        guard let range = self.range(of: target) else { return self }
        return self.replacingCharacters(in: range, with: replacement)
    }
}

/// What an answer asks of the connection and credential it came on, before the job sees it. The transport
/// acts on it once per request and resends; if the same answer comes again, the job gets it.
public enum ConnectionEffect: Sendable, Hashable {
    /// Nothing: the answer is the job's.
    case none
    /// Mint a new provider token and resend (`ExpiredProviderToken`).
    case reMintToken
    /// Send with the token another worker minted first for this key (`TooManyProviderTokenUpdates`).
    case adoptSharedToken
    /// Open a new connection and resend (`UnrelatedKeyIdInToken`).
    case reconnect
}
