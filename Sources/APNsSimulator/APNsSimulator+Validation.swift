import Foundation
import NIOCore
import NIOHPACK

extension APNsSimulator {
    /// Validates a request in Apple's order and decides the answer (faithful mode).
    func answer(
        headers: HPACKHeaders,
        body: [UInt8],
        connectionID: Int,
        connection: any Channel,
        certificate: ProviderCertificateInfo? = nil
    ) -> SimulatorAnswer {
        let method = headers.first(name: ":method") ?? ""
        let path = headers.first(name: ":path") ?? ""
        if path != Self.fcmTokenPath, let outage = self.state.withLock({ $0.outage }),
            outage.share >= 1 || Double.random(in: 0..<1) < outage.share
        {
            let internalError = outage.status == 500
            return Self.isFCM(path)
                ? Self.fcmError(outage.status, internalError ? "INTERNAL" : "UNAVAILABLE")
                : .error(outage.status, internalError ? "InternalServerError" : "ServiceUnavailable")
        }
        if Self.isFCM(path) {
            let answer = self.fcmAnswer(headers: headers, body: body, path: path)
            // The simulator opens with one stream per connection, as APNs does until a token is accepted; FCM
            // has no such rule: any good answer opens the connection to the announced limit.
            if answer.status == 200 { self.authenticate(connectionID: connectionID, channel: connection) }
            return answer
        }
        let segments = path.split(separator: "/", omittingEmptySubsequences: false).map(String.init)

        // Channel management: /1/apps/<bundle>/channels, /1/apps/<bundle>/all-channels.
        if segments.count == 5, segments[1] == "1", segments[2] == "apps" {
            if let failure = self.authenticateRequest(headers, certificate: certificate) { return failure }
            return self.manageChannels(
                method: method,
                bundle: segments[3],
                resource: segments[4],
                headers: headers,
                body: body
            )
        }
        let isDevice = segments.count == 4 && segments[1] == "3" && segments[2] == "device"
        let isBroadcast =
            segments.count == 5 && segments[1] == "4" && segments[2] == "broadcasts" && segments[3] == "apps"
        guard isDevice || isBroadcast else { return .error(404, "BadPath") }
        guard method == "POST" else { return .error(405, "MethodNotAllowed") }
        if let failure = self.authenticateRequest(headers, certificate: certificate) {
            // APNs drops a connection back to one stream after a rejected token.
            if failure.status == 403 { self.deauthenticate(connectionID: connectionID, channel: connection) }
            return failure
        }

        guard let pushTypeName = headers.first(name: "apns-push-type") else { return .error(400, "MissingPushType") }
        guard let pushType = AppleRules.pushTypes[pushTypeName] else { return .error(400, "InvalidPushType") }
        let bundle: String
        if isDevice {
            guard let topic = headers.first(name: "apns-topic"), !topic.isEmpty else {
                return .error(400, "MissingTopic")
            }
            guard topic.hasSuffix(pushType.topicSuffix) else { return .error(400, "BadTopic") }
            bundle = String(topic.dropLast(pushType.topicSuffix.count))
            guard !AppleRules.carriesSuffix(bundle) else { return .error(400, "BadTopic") }
        } else {
            bundle = segments[4]
            guard pushTypeName == "liveactivity" else { return .error(400, "InvalidPushType") }
        }
        if let allowed = self.configuration.allowedTopics, !allowed.contains(bundle) {
            return .error(400, "TopicDisallowed")
        }
        // Certificate-based trust: the certificate names the one app it may push for.
        if headers.first(name: "authorization") == nil, let certificate, certificate.topic != bundle {
            return .error(400, "TopicDisallowed")
        }
        if let priority = headers.first(name: "apns-priority") {
            guard let value = Int(priority), pushType.priorities.contains(value) else {
                return .error(400, "BadPriority")
            }
        }
        if let id = headers.first(name: "apns-id"), UUID(uuidString: id) == nil { return .error(400, "BadMessageId") }
        if let id = headers.first(name: "apns-request-id"), UUID(uuidString: id) == nil {
            return .error(400, "BadMessageId")
        }
        if let expiration = headers.first(name: "apns-expiration"), Int64(expiration) == nil {
            return .error(400, "BadExpirationDate")
        }
        if let collapse = headers.first(name: "apns-collapse-id"), collapse.utf8.count > 64 {
            return .error(400, "BadCollapseId")
        }

        let target: String
        if isDevice {
            target = segments[3]
            guard !target.isEmpty else { return .error(400, "MissingDeviceToken") }
            guard target.count % 2 == 0, target.count >= 16, target.allSatisfy(\.isHexDigit) else {
                return .error(400, "BadDeviceToken")
            }
            // A token of a build for the other environment: the environment is the host the request names.
            if let built = self.state.withLock({ $0.tokenEnvironments[target] }) {
                let host = String((headers.first(name: ":authority") ?? "").split(separator: ":").first ?? "")
                let environment = self.configuration.sandboxHosts.contains(host) ? "development" : "production"
                if built != environment { return .error(400, "BadDeviceToken") }
            }
        } else {
            guard let channel = headers.first(name: "apns-channel-id"), !channel.isEmpty else {
                return .error(400, "MissingChannelId")
            }
            guard Data(base64Encoded: channel) != nil else { return .error(400, "BadChannelId") }
            guard let storage = self.state.withLock({ $0.channels[bundle]?[channel] }) else {
                return .error(400, "ChannelNotRegistered")
            }
            // Apple: a channel without message storage (policy 0) takes only apns-expiration 0.
            if storage == 0, let expiration = headers.first(name: "apns-expiration"), expiration != "0" {
                return .error(400, "BadExpirationDate")
            }
            target = channel
        }
        guard !body.isEmpty else { return .error(400, "PayloadEmpty") }
        let limit = isBroadcast ? AppleRules.broadcastPayloadLimit : pushType.payloadLimit
        guard body.count <= limit else { return .error(413, "PayloadTooLarge") }

        // iOS's update budget: priority-10 Live Activity pushes to one token, past the budget, are throttled.
        if pushTypeName == "liveactivity", isDevice, headers.first(name: "apns-priority") ?? "10" == "10",
            let budget = self.configuration.liveActivityBudget
        {
            let now = self.configuration.now()
            let over = self.state.withLock { state -> Bool in
                var sends = state.liveActivitySends[target, default: []].filter {
                    now.timeIntervalSince($0) < budget.window
                }
                guard sends.count < budget.count else {
                    state.liveActivitySends[target] = sends
                    return true
                }
                sends.append(now)
                state.liveActivitySends[target] = sends
                return false
            }
            if over { return .error(429, "TooManyRequests") }
        }
        if let behaviour = self.state.withLock({ $0.behaviour(for: target) }) {
            let scripted = self.scripted(behaviour)
            if scripted.status == 200 && scripted.action == .respond {
                return self.success(
                    headers,
                    isDevice: isDevice,
                    connectionID: connectionID,
                    connection: connection,
                    delay: scripted.delay
                )
            }
            return scripted
        }
        return self.success(headers, isDevice: isDevice, connectionID: connectionID, connection: connection)
    }

    func success(
        _ headers: HPACKHeaders,
        isDevice: Bool,
        connectionID: Int,
        connection: any Channel,
        delay: Duration = .zero
    ) -> SimulatorAnswer {
        self.authenticate(connectionID: connectionID, channel: connection)
        var answer = SimulatorAnswer(status: 200, reason: nil)
        if isDevice {
            answer.headers.append(("apns-id", headers.first(name: "apns-id") ?? UUID().uuidString.lowercased()))
        } else {
            // Broadcasts: the id travels as apns-request-id, echoed (or minted when the request had none).
            answer.headers.append(
                ("apns-request-id", headers.first(name: "apns-request-id") ?? UUID().uuidString.lowercased())
            )
        }
        if isDevice && self.configuration.uniqueIDs {
            answer.headers.append(("apns-unique-id", UUID().uuidString.lowercased()))
        }
        answer.delay = delay
        return answer
    }

    func scripted(_ behaviour: SimulatorBehaviour) -> SimulatorAnswer {
        switch behaviour {
        case .respond(let status, let reason):
            if status == 200 { return SimulatorAnswer(status: 200, reason: nil) }
            return reason.map { .error(status, $0) } ?? SimulatorAnswer(status: status, reason: nil)
        case .failThenSucceed(_, let status, let reason):
            return .error(status, reason)
        case .retryAfter(let seconds, _):
            var answer = SimulatorAnswer.error(429, "TooManyRequests")
            answer.headers.append(("retry-after", String(seconds)))
            return answer
        case .unregistered(let timestamp):
            return .error(410, "Unregistered", extra: ["timestamp": timestamp])
        case .latency(let duration):
            var answer = SimulatorAnswer(status: 200, reason: nil)
            answer.delay = duration
            return answer
        case .hang:
            return SimulatorAnswer(status: 0, reason: nil, action: .hang)
        case .resetStream:
            return SimulatorAnswer(status: 0, reason: nil, action: .reset)
        case .goAway:
            return SimulatorAnswer(status: 0, reason: nil, action: .goAway)
        case .dropConnection:
            return SimulatorAnswer(status: 0, reason: nil, action: .drop)
        case .times(_, let behaviour):
            return self.scripted(behaviour)
        }
    }

    /// Checks the `authorization` header: present, a valid ES256 token of a known key, not older than an
    /// hour, and not a refresh sooner than the minimum interval after the key's previous token.
    func authenticateRequest(_ headers: HPACKHeaders, certificate: ProviderCertificateInfo? = nil) -> SimulatorAnswer? {
        guard let authorization = headers.first(name: "authorization"), authorization.hasPrefix("bearer ") else {
            // No provider token: certificate-based trust, if the connection presented a provider certificate.
            guard let certificate else { return .error(403, "MissingProviderToken") }
            if let refused = self.state.withLock({ $0.refusedCertificates[certificate.topic] }) {
                return .error(403, refused)
            }
            if let environment = self.configuration.environment, !certificate.environments.contains(environment) {
                return .error(403, "BadCertificateEnvironment")
            }
            return nil
        }
        let jwt = String(authorization.dropFirst("bearer ".count))
        let now = self.configuration.now()
        if let cached = self.state.withLock({ $0.verifiedTokens[jwt] }) {
            if let refused = self.state.withLock({ $0.refusedKeys[cached.keyID] }) { return .error(403, refused) }
            if now.timeIntervalSince1970 - Double(cached.issuedAt) > self.configuration.tokenMaxAge {
                return .error(403, "ExpiredProviderToken")
            }
            return nil
        }
        let claims: JWTVerifier.Claims
        do {
            claims = try self.verifier.verify(jwt, now: now)
        } catch .expired {
            return .error(403, "ExpiredProviderToken")
        } catch {
            return .error(403, "InvalidProviderToken")
        }
        return self.state.withLock { state -> SimulatorAnswer? in
            if let refused = state.refusedKeys[claims.keyID] { return .error(403, refused) }
            if let previous = state.latestTokenIssuedAt[claims.keyID], claims.issuedAt != previous {
                if claims.issuedAt < previous { return .error(403, "ExpiredProviderToken") }
                if Double(claims.issuedAt - previous) < self.configuration.minimumTokenRefresh {
                    return .error(429, "TooManyProviderTokenUpdates")
                }
            }
            state.latestTokenIssuedAt[claims.keyID] = claims.issuedAt
            state.verifiedTokens[jwt] = claims
            return nil
        }
    }
}
