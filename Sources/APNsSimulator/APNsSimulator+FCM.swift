import Foundation
import NIOCore
import NIOHPACK
public import _CryptoExtras

/// FCM's side of the simulator (`push-worker simulator --fcm`): a token endpoint that verifies a service
/// account's RS256 JWT and grants short-lived access tokens, and the HTTP v1 send endpoint, which checks the
/// message's shape and answers with FCM's error JSON. The fault plan and scripts (by registration token)
/// apply as they do to APNs requests. Written from Google's documentation, not from PushCore.
extension APNsSimulator {
    /// A service account the token endpoint trusts: its project and its public key.
    public struct FCMAccount: Sendable {
        public var projectID: String
        public var publicKey: _RSA.Signing.PublicKey

        public init(projectID: String, publicKey: _RSA.Signing.PublicKey) {
            self.projectID = projectID
            self.publicKey = publicKey
        }
    }

    /// The token endpoint's path (a key file's `token_uri` is `https://<host>:<port>/token`).
    public static let fcmTokenPath = "/token"

    /// Whether `path` is one of FCM's.
    static func isFCM(_ path: String) -> Bool {
        path == Self.fcmTokenPath || (path.hasPrefix("/v1/projects/") && path.hasSuffix("/messages:send"))
    }

    /// FCM's error body as Google documents it (firebase.google.com/docs/cloud-messaging/error-codes and the
    /// ErrorCode reference): `{"error": {"code", "message", "status", "details": [FcmError, …]}}`. An invalid
    /// registration token is `INVALID_ARGUMENT` with Google's sentence and only the FcmError detail; any other
    /// `INVALID_ARGUMENT` names its field in a `google.rpc.BadRequest` and has no FcmError; `QUOTA_EXCEEDED`
    /// carries a `google.rpc.QuotaFailure` (a device over its rate); `RESOURCE_EXHAUSTED` is Google Cloud's
    /// own per-project quota (`ErrorInfo`, no FcmError).
    static func fcmError(
        _ status: Int,
        _ code: String,
        message: String? = nil,
        invalidToken: Bool = false
    )
        -> SimulatorAnswer
    {
        let statusWord: String =
            switch status {
            case 400: "INVALID_ARGUMENT"
            case 401: "UNAUTHENTICATED"
            case 403: "PERMISSION_DENIED"
            case 404: "NOT_FOUND"
            case 429: "RESOURCE_EXHAUSTED"
            case 503: "UNAVAILABLE"
            default: "INTERNAL"
            }
        var details: [[String: Any]] = [
            ["@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": code]
        ]
        var text = message ?? "Simulated \(code)"
        switch code {
        case "INVALID_ARGUMENT" where invalidToken:
            text = "The registration token is not a valid FCM registration token"
        case "INVALID_ARGUMENT":
            // Google's example 1: the field named (quoted in the message, else the message itself).
            text = message ?? "Invalid value at 'message.data[0].value' (TYPE_STRING), 12"
            let quoted = text.split(separator: "'", omittingEmptySubsequences: false)
            let field = quoted.count >= 3 ? String(quoted[1]) : "message"
            details = [
                [
                    "@type": "type.googleapis.com/google.rpc.BadRequest",
                    "fieldViolations": [["field": field, "description": text]],
                ]
            ]
        case "QUOTA_EXCEEDED":
            details.append([
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [["subject": "device", "description": "Device message rate exceeded."]],
            ])
        case "RESOURCE_EXHAUSTED":
            text =
                "Quota exceeded for quota metric 'Send requests' and limit 'Send requests per minute' of service 'fcm.googleapis.com' for consumer 'project_number:1'."
            details = [
                [
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED",
                    "domain": "googleapis.com",
                ]
            ]
        default: break
        }
        let object: [String: Any] = [
            "error": ["code": status, "message": text, "status": statusWord, "details": details]
        ]
        let body = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])).map(Array.init) ?? []
        return SimulatorAnswer(
            status: status,
            reason: code,
            headers: [("content-type", "application/json")],
            body: body
        )
    }

    /// The FCM error code for a fault plan's or a script's APNs-style status.
    static func fcmCode(for status: Int) -> String {
        switch status {
        case 400: "INVALID_ARGUMENT"
        case 401: "UNAUTHENTICATED"
        case 403: "SENDER_ID_MISMATCH"
        case 404, 410: "UNREGISTERED"
        case 429: "QUOTA_EXCEEDED"
        case 503: "UNAVAILABLE"
        default: "INTERNAL"
        }
    }

    /// The push id (`data.push_id`) of an FCM send: its notification id, as `apns-id` is for APNs.
    static func fcmPushID(_ body: [UInt8]) -> String? {
        guard let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any],
            let message = object["message"] as? [String: Any], let data = message["data"] as? [String: Any]
        else { return nil }
        return (data["push_id"] as? String)?.lowercased()
    }

    /// The registration token of an FCM send.
    static func fcmToken(_ body: [UInt8]) -> String? {
        guard let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any],
            let message = object["message"] as? [String: Any]
        else { return nil }
        return message["token"] as? String
    }

    /// Answers an FCM request (token exchange or send).
    func fcmAnswer(headers: HPACKHeaders, body: [UInt8], path: String) -> SimulatorAnswer {
        guard headers.first(name: ":method") == "POST" else { return Self.fcmError(404, "NOT_FOUND") }
        if path == Self.fcmTokenPath { return self.grantAccessToken(body) }
        return self.fcmSend(headers: headers, body: body, path: path)
    }

    /// OAuth 2.0 JWT bearer grant: the assertion must be an RS256 JWT of a trusted account, for FCM's
    /// scope, addressed to this endpoint, issued now and valid at most an hour.
    func grantAccessToken(_ body: [UInt8]) -> SimulatorAnswer {
        func refuse(_ status: Int, _ error: String, _ description: String) -> SimulatorAnswer {
            let object = ["error": error, "error_description": description]
            let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
            return SimulatorAnswer(
                status: status,
                reason: error,
                headers: [("content-type", "application/json")],
                body: Array(data)
            )
        }
        var form: [String: String] = [:]
        for pair in String(decoding: body, as: UTF8.self).split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map(String.init)
            guard parts.count == 2 else { continue }
            form[parts[0]] = parts[1].removingPercentEncoding ?? parts[1]
        }
        guard form["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer" else {
            return refuse(400, "unsupported_grant_type", "grant_type must be the JWT bearer grant")
        }
        guard let assertion = form["assertion"] else { return refuse(400, "invalid_request", "no assertion") }
        let parts = assertion.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let headerData = JWTVerifier.base64URLDecode(parts[0]),
            let header = try? JSONSerialization.jsonObject(with: headerData) as? [String: Any],
            header["alg"] as? String == "RS256",
            let claimsData = JWTVerifier.base64URLDecode(parts[1]),
            let claims = try? JSONSerialization.jsonObject(with: claimsData) as? [String: Any],
            let signature = JWTVerifier.base64URLDecode(parts[2])
        else { return refuse(400, "invalid_grant", "Invalid JWT") }
        guard let issuer = claims["iss"] as? String, let account = self.configuration.fcmAccounts[issuer] else {
            return refuse(400, "invalid_grant", "Invalid issuer")
        }
        let signingInput = Data(assertion.utf8.prefix(parts[0].utf8.count + 1 + parts[1].utf8.count))
        guard
            account.publicKey.isValidSignature(
                _RSA.Signing.RSASignature(rawRepresentation: signature),
                for: signingInput,
                padding: .insecurePKCS1v1_5
            )
        else { return refuse(400, "invalid_grant", "Invalid JWT Signature.") }
        guard let scope = claims["scope"] as? String,
            scope.split(separator: " ").contains("https://www.googleapis.com/auth/firebase.messaging")
        else { return refuse(400, "invalid_scope", "the firebase.messaging scope is required") }
        guard let audience = claims["aud"] as? String, audience.hasSuffix(":\(self.port)\(Self.fcmTokenPath)") else {
            return refuse(400, "invalid_grant", "Invalid JWT: the audience is not this token endpoint")
        }
        let now = self.configuration.now().timeIntervalSince1970
        guard let iat = (claims["iat"] as? NSNumber)?.doubleValue, let exp = (claims["exp"] as? NSNumber)?.doubleValue,
            abs(iat - now) < 300, exp > now, exp - iat <= 3600
        else {
            return refuse(
                400,
                "invalid_grant",
                "Invalid JWT: Token must be a short-lived token and in a reasonable timeframe"
            )
        }
        if self.state.withLock({ $0.refusedAccounts.contains(issuer) }) {
            return refuse(400, "invalid_grant", "Invalid grant: account not found")
        }
        let token = "ya29.sim-" + UUID().uuidString.lowercased()
        let lifetime = self.configuration.accessTokenLifetime
        self.state.withLock { state in
            state.accessTokens[token] = (issuer, account.projectID, now + lifetime)
            state.faults.accessTokenGrants += 1
        }
        let object: [String: Any] = ["access_token": token, "expires_in": Int(lifetime), "token_type": "Bearer"]
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
        return SimulatorAnswer(
            status: 200,
            reason: nil,
            headers: [("content-type", "application/json")],
            body: Array(data)
        )
    }

    /// A send: a valid access token for the path's project, then the message's shape, then the script.
    func fcmSend(headers: HPACKHeaders, body: [UInt8], path: String) -> SimulatorAnswer {
        let project = String(path.dropFirst("/v1/projects/".count).dropLast("/messages:send".count))
        guard let authorization = headers.first(name: "authorization"), authorization.hasPrefix("Bearer ") else {
            return Self.fcmError(
                401,
                "UNAUTHENTICATED",
                message: "Request is missing required authentication credential."
            )
        }
        let now = self.configuration.now().timeIntervalSince1970
        guard let grant = self.state.withLock({ $0.accessTokens[String(authorization.dropFirst("Bearer ".count))] }),
            grant.expires > now
        else {
            return Self.fcmError(401, "UNAUTHENTICATED", message: "Request had invalid authentication credentials.")
        }
        self.state.withLock { state in
            if state.usedAccessTokens.insert(String(authorization.dropFirst("Bearer ".count))).inserted {
                state.faults.accessTokensUsed += 1
            }
        }
        guard grant.project == project else {
            return Self.fcmError(403, "PERMISSION_DENIED", message: "Permission denied for project \(project)")
        }
        guard headers.first(name: "content-type")?.hasPrefix("application/json") == true,
            let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any],
            let message = object["message"] as? [String: Any]
        else { return Self.fcmError(400, "INVALID_ARGUMENT", message: "Invalid JSON payload received.") }
        let allowed: Set<String> = [
            "token", "notification", "data", "android", "fcm_options", "webpush", "apns", "name",
        ]
        if let unknown = message.keys.first(where: { !allowed.contains($0) }) {
            return Self.fcmError(
                400,
                "INVALID_ARGUMENT",
                message: "Invalid JSON payload received. Unknown name \"\(unknown)\""
            )
        }
        guard let token = message["token"] as? String, !token.isEmpty else {
            return Self.fcmError(400, "INVALID_ARGUMENT", message: "Recipient of the message is not set.")
        }
        if let data = message["data"] {
            guard let data = data as? [String: Any], data.values.allSatisfy({ $0 is String }) else {
                return Self.fcmError(
                    400,
                    "INVALID_ARGUMENT",
                    message: "Invalid value at 'message.data': values must be strings"
                )
            }
        }
        if let android = message["android"] as? [String: Any] {
            if let priority = android["priority"] as? String, priority != "HIGH" && priority != "NORMAL" {
                return Self.fcmError(400, "INVALID_ARGUMENT", message: "Invalid value at 'message.android.priority'")
            }
            if let ttl = android["ttl"] as? String, !(ttl.hasSuffix("s") && Double(ttl.dropLast()) != nil) {
                return Self.fcmError(400, "INVALID_ARGUMENT", message: "Invalid value at 'message.android.ttl'")
            }
        }
        if token.utf8.count > 4096 || token.contains(" ") {
            return Self.fcmError(
                400,
                "INVALID_ARGUMENT",
                message: "The registration token is not a valid FCM registration token",
                invalidToken: true
            )
        }
        if let behaviour = self.state.withLock({ $0.behaviour(for: token) }) {
            var scripted = self.scripted(behaviour)
            if scripted.action == .respond && scripted.status != 200 {
                let code =
                    scripted.reason.flatMap { Self.fcmCodes.contains($0) ? $0 : nil }
                    ?? Self.fcmCode(for: scripted.status)
                // FCM answers a dead token 404, whatever status the script was written with (410 for APNs).
                var answer = Self.fcmError(
                    code == "UNREGISTERED" ? 404 : scripted.status,
                    code,
                    invalidToken: code == "INVALID_ARGUMENT" && scripted.reason == "INVALID_ARGUMENT"
                )
                answer.headers += scripted.headers.filter { $0.0 == "retry-after" }
                answer.delay = scripted.delay
                return answer
            }
            if scripted.action != .respond { return scripted }
            scripted = self.fcmSuccess(project: project, delay: scripted.delay)
            return scripted
        }
        return self.fcmSuccess(project: project)
    }

    /// FCM's error codes a script may name as its reason.
    static let fcmCodes: Set<String> = [
        "UNSPECIFIED_ERROR", "INVALID_ARGUMENT", "UNREGISTERED", "SENDER_ID_MISMATCH", "QUOTA_EXCEEDED",
        "UNAVAILABLE", "INTERNAL", "THIRD_PARTY_AUTH_ERROR", "RESOURCE_EXHAUSTED",
    ]

    func fcmSuccess(project: String, delay: Duration = .zero) -> SimulatorAnswer {
        let number = self.state.withLock { state -> Int in
            state.fcmMessages += 1
            return state.fcmMessages
        }
        let object = ["name": "projects/\(project)/messages/0:\(1_700_000_000_000 + number)%sim"]
        let data =
            (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes]))
            ?? Data()
        var answer = SimulatorAnswer(
            status: 200,
            reason: nil,
            headers: [("content-type", "application/json")],
            body: Array(data)
        )
        answer.delay = delay
        return answer
    }

    /// The token endpoint refuses `clientEmail`'s assertions from now on (`false`: accepts them again): a
    /// key deleted in Google Cloud.
    public func refuseAccount(_ clientEmail: String, _ refused: Bool = true) {
        self.state.withLock { state in
            if refused {
                state.refusedAccounts.insert(clientEmail)
            } else {
                state.refusedAccounts.remove(clientEmail)
            }
        }
    }

    /// Expires every access token granted so far (FCM then answers 401 until a new one is obtained).
    public func expireAccessTokens() {
        self.state.withLock { state in
            for key in state.accessTokens.keys { state.accessTokens[key]?.expires = 0 }
        }
    }
}
