public import Foundation
public import PushCore

/// FCM's answer to one send: a 200's message `name`, or an error's code, whether it names the token, and
/// FCM's own message (kept for the dead letter's history; it never carries the token).
public struct FCMResponse: Sendable, Hashable {
    /// The HTTP status.
    public var status: Int
    /// FcmError's `errorCode` (`UNREGISTERED`, `QUOTA_EXCEEDED`, …), else the error's `status`.
    public var code: String?
    /// Whether an error names the registration token: a `BadRequest` field violation on `message.token`, or
    /// Google's documented sentence "The registration token is not a valid FCM registration token" with no
    /// other field named.
    public var namesToken: Bool
    /// Whether a `QUOTA_EXCEEDED` names the project's quota (a `google.rpc.QuotaFailure` violation whose
    /// subject or description is the project) rather than its target's (a device, a topic).
    public var projectQuota: Bool
    /// FCM's `error.message`.
    public var message: String?
    /// A 200's message `name` (`projects/<project>/messages/<id>`): the job's `provider_message_id`.
    public var messageName: String?
    /// The `Retry-After` header as sent.
    public var retryAfter: String?
    /// How long the request took, from write to the end of the response.
    public var latency: Duration
    /// The `Date` header.
    public var serverDate: String?

    /// Creates a response.
    public init(
        status: Int,
        code: String? = nil,
        namesToken: Bool = false,
        projectQuota: Bool = false,
        message: String? = nil,
        messageName: String? = nil,
        retryAfter: String? = nil,
        latency: Duration = .zero,
        serverDate: String? = nil
    ) {
        self.status = status
        self.code = code
        self.namesToken = namesToken
        self.projectQuota = projectQuota
        self.message = message
        self.messageName = messageName
        self.retryAfter = retryAfter
        self.latency = latency
        self.serverDate = serverDate
    }

    /// What the answer means for the job, with its trap id.
    public var verdict: APNsVerdict {
        FCMReason.classify(status: self.status, code: self.code, namesToken: self.namesToken)
    }

    /// The answer as ``Decision`` reads it, at wall time `now` (a `Retry-After` date is read against it).
    public func sendOutcome(at now: Date) -> SendOutcome {
        .fcm(
            status: self.status,
            code: self.code,
            namesToken: self.namesToken,
            retryAfter: RetryAfter.parse(self.retryAfter, now: now),
            projectQuota: self.projectQuota
        )
    }

    /// FCM's answer as read off its stream.
    init(_ answer: HTTP2Answer) {
        // A 200's body is `{"name": "projects/…/messages/…"}`: read without Foundation's parser.
        if answer.status == 200, let name = Self.plainName(answer.body) {
            self.init(
                status: 200,
                messageName: name,
                retryAfter: nil,
                latency: .nanoseconds(answer.latency.nanoseconds),
                serverDate: answer.headers.first(name: "date")
            )
            return
        }
        let object = (try? JSONSerialization.jsonObject(with: Data(answer.body))) as? [String: Any]
        var code: String?
        var namesToken = false
        var projectQuota = false
        var message: String?
        if answer.status != 200, let error = object?["error"] as? [String: Any] {
            message = error["message"] as? String
            code = error["status"] as? String
            var otherField = false
            for detail in error["details"] as? [[String: Any]] ?? [] {
                let type = detail["@type"] as? String ?? ""
                if type.hasSuffix(".FcmError"), let errorCode = detail["errorCode"] as? String { code = errorCode }
                if type.hasSuffix("google.rpc.BadRequest") {
                    for violation in detail["fieldViolations"] as? [[String: Any]] ?? [] {
                        if (violation["field"] as? String) == "message.token" {
                            namesToken = true
                        } else {
                            otherField = true
                        }
                    }
                }
                // google.rpc.QuotaFailure: violations with `subject` and `description`; one about the project
                // means the project's quota, not the target's.
                if type.hasSuffix("google.rpc.QuotaFailure") {
                    for violation in detail["violations"] as? [[String: Any]] ?? [] {
                        let text =
                            ((violation["subject"] as? String ?? "") + " " + (violation["description"] as? String ?? ""))
                            .lowercased()
                        if text.contains("project") { projectQuota = true }
                    }
                }
            }
            // Google's documented invalid-token answer: INVALID_ARGUMENT with this sentence and only FcmError.
            if !namesToken, !otherField, code == "INVALID_ARGUMENT",
                let text = message?.lowercased(), text.contains("not a valid fcm registration token")
            {
                namesToken = true
            }
        }
        self.init(
            status: answer.status,
            code: code,
            namesToken: namesToken,
            projectQuota: projectQuota,
            message: message,
            messageName: answer.status == 200 ? object?["name"] as? String : nil,
            retryAfter: answer.headers.first(name: "retry-after"),
            latency: .nanoseconds(answer.latency.nanoseconds),
            serverDate: answer.headers.first(name: "date")
        )
    }
}

extension FCMResponse {
    /// The `name` of a body that is exactly `{"name":"…"}` (whitespace allowed) with a plain string; `nil`
    /// for anything else (the full parse reads it).
    static func plainName(_ body: [UInt8]) -> String? {
        var i = 0
        func skip() {
            while i < body.count, body[i] == 0x20 || body[i] == 0x0A || body[i] == 0x0D || body[i] == 0x09 { i += 1 }
        }
        func expect(_ text: String) -> Bool {
            for byte in text.utf8 {
                skip()
                guard i < body.count, body[i] == byte else { return false }
                i += 1
            }
            return true
        }
        guard expect("{"), expect("\"name\""), expect(":"), expect("\"") else { return nil }
        let start = i
        while i < body.count, body[i] != UInt8(ascii: "\""), body[i] != UInt8(ascii: "\\"), body[i] >= 0x20 { i += 1 }
        guard i < body.count, body[i] == UInt8(ascii: "\"") else { return nil }
        let name = String(decoding: body[start..<i], as: UTF8.self)
        i += 1
        guard expect("}") else { return nil }
        skip()
        return i == body.count ? name : nil
    }
}

/// FCM as a provider of the shared HTTP/2 engine: its answers (``FCMResponse``), what they do to the
/// connection (``FCMReason``'s connection column), and the sentence for a credential with nothing configured.
struct FCMProvider: PushProvider {
    /// Where sends go.
    var endpoint: PushEndpoint = FCMClient.googleEndpoint
    /// The Firebase project each credential sends for (its service account's).
    var projects: [String: String] = [:]

    var peerName: String { "FCM" }

    var platform: Platform { .fcm }

    var warmUpEndpoint: PushEndpoint { self.endpoint }

    /// Each message as a POST to its credential's project.
    func route(_ requests: [ProviderRequest], credential: String) -> Result<RoutedBatch, TransportError> {
        self.own(requests) { request in if case .fcm(let message) = request { message } else { nil } }.flatMap {
            own in
            guard let project = self.projects[credential] else { return .failure(self.missingCredential(credential)) }
            return .success(
                RoutedBatch(
                    endpoint: self.endpoint,
                    requests: own.map { message in
                        OutgoingRequest(
                            method: "POST",
                            path: FCMMessage.path(project: project),
                            headers: [("content-type", "application/json")],
                            body: message.body
                        )
                    }
                )
            )
        }
    }

    func answer(_ response: FCMResponse) -> ProviderAnswer { .fcm(response) }

    /// FCM's request headers are the same on every request.
    func changesEveryRequest(_ headerName: String) -> Bool { false }

    func parse(_ answer: HTTP2Answer) -> FCMResponse { FCMResponse(answer) }

    func status(of response: FCMResponse) -> Int { response.status }

    func connectionEffect(of response: FCMResponse) -> ConnectionEffect {
        FCMReason.connectionEffect(status: response.status, code: response.code)
    }

    func credentialAccepted(by response: FCMResponse) -> Bool? {
        if (200...299).contains(response.status) { return true }
        return response.verdict.responseClass == .credentialFatal ? false : nil
    }

    func missingCredential(_ name: String) -> TransportError {
        TransportError(
            code: .credentialsMissing,
            mayHaveBeenProcessed: false,
            message:
                "no FCM service account is configured for credential '\(name)': name it in the config file as {\"type\": \"fcm\", \"service_account_path\": FILE}"
        )
    }
}
