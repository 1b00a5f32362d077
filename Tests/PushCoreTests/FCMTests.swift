import Foundation
import PushCore
import Testing

/// FCM's rules in PushCore: the message a job becomes, what a payload may not carry, and what each answer
/// of CONTRACT.md 1b does to the job. The expected classes are written out here from the contract, not
/// computed by the code under test.
@Suite("FCM: the message a job becomes, and what each answer does to it")
struct FCMTests {
    static let token = "fKx1Vd2hR0eQm7:APA91bH" + String(repeating: "x", count: 140)

    func job(_ payload: String, priority: Int? = nil, collapse: String? = nil, deliverOnce: Bool = false) -> PushJob {
        PushJob(
            id: 1,
            apnsID: UUID(uuidString: "6E1C5D0B-2F4A-4C36-9F7E-2B1D0C3A4E5F")!,
            topic: "com.example.app",
            deviceToken: Self.token,
            payload: payload,
            priority: priority,
            collapseID: collapse,
            deliverOnce: deliverOnce,
            expiresAt: Date(timeIntervalSince1970: 1_800_003_600),
            runAt: Date(),
            createdAt: Date(),
            platform: .fcm
        )
    }

    func message(_ job: PushJob) throws -> [String: Any] {
        let built = try FCMMessageBuilder.describe(job, now: Date(timeIntervalSince1970: 1_800_000_000))
        let object = try #require(try JSONSerialization.jsonObject(with: Data(built.body)) as? [String: Any])
        return try #require(object["message"] as? [String: Any])
    }

    @Test("the worker adds token, android.priority, ttl, collapse_key and data.push_id to the producer's fields")
    func builds() throws {
        let message = try self.message(
            self.job(
                #"{"notification":{"title":"Shipped"},"data":{"order":"42"},"android":{"notification":{"channel_id":"orders"}}}"#,
                collapse: "order-42"
            )
        )
        #expect(message["token"] as? String == Self.token)
        #expect((message["notification"] as? [String: Any])?["title"] as? String == "Shipped")
        let data = try #require(message["data"] as? [String: String])
        #expect(data == ["order": "42", "push_id": "6e1c5d0b-2f4a-4c36-9f7e-2b1d0c3a4e5f"])
        let android = try #require(message["android"] as? [String: Any])
        #expect(android["priority"] as? String == "HIGH")
        #expect(android["ttl"] as? String == "3600s")
        #expect(android["collapse_key"] as? String == "order-42")
        #expect((android["notification"] as? [String: Any])?["channel_id"] as? String == "orders")
    }

    @Test(
        "the spliced body (no Foundation parse) says what the payload says, escapes and nesting kept, whatever the member order and spacing",
        arguments: [
            #"{"notification":{"title":"a \"quoted\" caf\u00e9","body":"x"},"data":{"k":"v","n":"1"}}"#,
            #"{ "data" : { "k" : "v" } , "android" : { "notification" : { "channel_id" : "c", "tag" : [1, 2.5, true, null] } } }"#,
            #"{"fcm_options":{"analytics_label":"l"},"android":{"restricted_package_name":"com.example.app"}}"#,
            #"{}"#,
        ]
    )
    func splicedBody(payload: String) throws {
        let message = try self.message(self.job(payload, collapse: "k1"))
        let given = try #require(try JSONSerialization.jsonObject(with: Data(payload.utf8)) as? [String: Any])
        var expected = given
        var android = given["android"] as? [String: Any] ?? [:]
        android["priority"] = "HIGH"
        android["ttl"] = "3600s"
        android["collapse_key"] = "k1"
        // A notification message's tag is the push id, unless the producer set one.
        if given["notification"] != nil || android["notification"] != nil {
            var notification = android["notification"] as? [String: Any] ?? [:]
            if notification["tag"] == nil { notification["tag"] = "6e1c5d0b-2f4a-4c36-9f7e-2b1d0c3a4e5f" }
            android["notification"] = notification
        }
        var data = given["data"] as? [String: Any] ?? [:]
        data["push_id"] = "6e1c5d0b-2f4a-4c36-9f7e-2b1d0c3a4e5f"
        expected["android"] = android
        expected["data"] = data
        expected["token"] = Self.token
        #expect(NSDictionary(dictionary: message).isEqual(to: expected), "\(message) vs \(expected)")
    }

    @Test("an expires_at beyond FCM's 28 days is sent as the longest ttl FCM takes")
    func ttlClamped() throws {
        var job = self.job(#"{}"#)
        job.expiresAt = Date(timeIntervalSince1970: 1_800_000_000 + 60 * 86_400)
        let android = try #require(try self.message(job)["android"] as? [String: Any])
        #expect(android["ttl"] as? String == "2419200s")
    }

    @Test("priority 5 is NORMAL; deliver_once is ttl 0s; priority 1 is refused")
    func priorities() throws {
        let normal = try self.message(self.job(#"{"data":{"a":"b"}}"#, priority: 5, deliverOnce: true))
        let android = try #require(normal["android"] as? [String: Any])
        #expect(android["priority"] as? String == "NORMAL")
        #expect(android["ttl"] as? String == "0s")
        #expect(throws: PreSendRejection.self) { try self.message(self.job(#"{}"#, priority: 1)) }
    }

    @Test(
        "a payload that is not an FCM message's fields, or sets what the worker sets, is refused with a trap id and a sentence naming the field",
        arguments: [
            (#"{"aps":{"alert":"hi"}}"#, "FC001", "aps"),
            (#"{"token":"x"}"#, "FC001", "token"),
            (#"{"topic":"news"}"#, "FC001", "topic"),
            (#"{"webpush":{}}"#, "FC001", "webpush"),
            (#"{"android":{"priority":"high"}}"#, "FC001", "android.priority"),
            (#"{"android":{"ttl":"10s"}}"#, "FC001", "android.ttl"),
            (#"{"android":{"collapse_key":"k"}}"#, "FC001", "android.collapse_key"),
            (#"{"data":{"push_id":"mine"}}"#, "FC001", "data.push_id"),
            (#"{"data":{"a":"1"},"android":{"data":{"b":"2"}}}"#, "FC001", "android.data"),
            (#"{"data":{"count":3}}"#, "FC002", "data.count"),
            (#"{"data":{"blob":"\#(String(repeating: "a", count: 4100))"}}"#, "FC003", "4096"),
        ]
    )
    func refused(payload: String, trap: String, named: String) {
        do {
            _ = try FCMMessageBuilder.describe(self.job(payload), now: Date(timeIntervalSince1970: 1_800_000_000))
            Issue.record("\(payload.prefix(60)) was accepted")
        } catch {
            #expect(error.trapID?.rawValue == trap)
            #expect(error.message.contains(named), "\(error.message)")
        }
    }

    @Test("an expired job, or a token FCM declared dead after the job was enqueued, is never sent")
    func expiredAndDead() {
        var job = self.job(#"{}"#)
        #expect(throws: PreSendRejection.self) {
            try FCMMessageBuilder.describe(job, now: Date(timeIntervalSince1970: 1_800_003_601))
        }
        job.tokenInvalidatedAt = Date(timeIntervalSince1970: 1_799_999_000)
        do {
            _ = try FCMMessageBuilder.describe(job, now: Date(timeIntervalSince1970: 1_800_000_000))
            Issue.record("sent to a dead token")
        } catch {
            #expect(error.reason == "TokenInvalidated")
            #expect(error.trapID == .fcmTokenUnregistered)
        }
    }

    func decide(_ outcome: SendOutcome, attempt: Int = 1) -> DecidedOutcome {
        var random = SystemRandomNumberGenerator()
        let policy = RetryPolicy(
            .init(maxRetries: 3, baseDelay: .milliseconds(100), maxDelay: .seconds(5), jitter: false),
            priority: 10,
            environment: [:]
        )
        return Decision.decide(
            outcome,
            attempt: attempt,
            transportRetries: 0,
            policy: policy,
            transportBudget: 10,
            using: &random
        )
    }

    @Test("CONTRACT.md 1b's answer table, row by row")
    func answers() {
        // 200: delivered.
        #expect(self.decide(.fcm(status: 200, code: nil, namesToken: false, retryAfter: nil)).decision == .delivered)
        // UNREGISTERED, and INVALID_ARGUMENT naming the token: dead, the token recorded.
        for (status, code, names) in [(404, "UNREGISTERED", false), (400, "INVALID_ARGUMENT", true)] {
            let decided = self.decide(.fcm(status: status, code: code, namesToken: names, retryAfter: nil))
            guard case .dead(let sentence) = decided.decision else {
                Issue.record("\(code) not dead: \(decided.decision)")
                continue
            }
            #expect(decided.invalidatesToken)
            #expect(decided.trapID == .fcmTokenUnregistered)
            #expect(sentence.contains("FC010"))
        }
        // SENDER_ID_MISMATCH and other INVALID_ARGUMENT: dead with a sentence, the token kept.
        for (status, code, trap) in [
            (403, "SENDER_ID_MISMATCH", TrapID.fcmSenderMismatch), (400, "INVALID_ARGUMENT", .fcmInvalidArgument),
        ] {
            let decided = self.decide(.fcm(status: status, code: code, namesToken: false, retryAfter: nil))
            guard case .dead = decided.decision else {
                Issue.record("\(code) not dead")
                continue
            }
            #expect(!decided.invalidatesToken)
            #expect(decided.trapID == trap)
        }
        // QUOTA_EXCEEDED is about the message's target: that job alone waits Retry-After (10 s doubling without),
        // an attempt used each time; the credential goes on.
        let quota = self.decide(.fcm(status: 429, code: "QUOTA_EXCEEDED", namesToken: false, retryAfter: .seconds(17)))
        #expect(quota.decision == .retry(after: .seconds(17)))
        #expect(!quota.pausesCredential && quota.trapID == .fcmQuota)
        let second = self.decide(
            .fcm(status: 429, code: "QUOTA_EXCEEDED", namesToken: false, retryAfter: nil),
            attempt: 2
        )
        #expect(second.decision == .retry(after: .seconds(20)) && !second.pausesCredential)
        guard
            case .dead(let quotaSentence) = self.decide(
                .fcm(status: 429, code: "QUOTA_EXCEEDED", namesToken: false, retryAfter: nil),
                attempt: 3
            ).decision
        else {
            Issue.record("a target over its rate is not dead after its last attempt")
            return
        }
        #expect(quotaSentence.contains("240 messages a minute") && quotaSentence.contains("coalesce_key"))
        // The project's quota (a QuotaFailure naming the project, Google Cloud's RESOURCE_EXHAUSTED, a bare 429):
        // not processed; the credential waits Retry-After (60 s without), no attempt used.
        let project = self.decide(
            .fcm(status: 429, code: "QUOTA_EXCEEDED", namesToken: false, retryAfter: .seconds(17), projectQuota: true)
        )
        #expect(project.decision == .requeue(after: .seconds(17)))
        #expect(project.pausesCredential && project.pauseLength == .seconds(17))
        for code in [nil, "RESOURCE_EXHAUSTED"] {
            let bare = self.decide(.fcm(status: 429, code: code, namesToken: false, retryAfter: nil))
            #expect(
                bare.decision == .requeue(after: .seconds(60)) && bare.pauseLength == .seconds(60),
                "\(code ?? "-")"
            )
        }
        // THIRD_PARTY_AUTH_ERROR: an iOS token of a project without an APNs key; that job alone is dead.
        let thirdParty = self.decide(
            .fcm(status: 401, code: "THIRD_PARTY_AUTH_ERROR", namesToken: false, retryAfter: nil)
        )
        guard case .dead(let thirdPartySentence) = thirdParty.decision else {
            Issue.record("THIRD_PARTY_AUTH_ERROR not dead: \(thirdParty.decision)")
            return
        }
        #expect(!thirdParty.pausesCredential && !thirdParty.invalidatesToken && thirdParty.trapID == .fcmThirdPartyAuth)
        #expect(thirdPartySentence.contains("APNs auth key") && thirdPartySentence.contains("Cloud Messaging"))
        // UNAVAILABLE and INTERNAL: retried with the backoff, Retry-After honoured.
        #expect(
            self.decide(.fcm(status: 503, code: "UNAVAILABLE", namesToken: false, retryAfter: .seconds(9))).decision
                == .retry(after: .seconds(9))
        )
        if case .retry = self.decide(.fcm(status: 500, code: "INTERNAL", namesToken: false, retryAfter: nil)).decision {
        } else {
            Issue.record("INTERNAL not retried")
        }
        // A refused service account holds the credential's jobs, uncounted.
        for code in ["PERMISSION_DENIED", "UNAUTHENTICATED"] {
            let decided = self.decide(
                .fcm(status: code == "PERMISSION_DENIED" ? 403 : 401, code: code, namesToken: false, retryAfter: nil)
            )
            #expect(decided.pausesCredential && decided.pauseLength == nil, "\(code)")
            #expect(decided.decision == .requeue(after: Decision.requeueDelay))
            #expect(decided.trapID == .fcmCredential)
        }
        // The last attempt of a retryable answer: dead, naming FCM.
        guard
            case .dead(let sentence) = self.decide(
                .fcm(status: 503, code: "UNAVAILABLE", namesToken: false, retryAfter: nil),
                attempt: 3
            ).decision
        else {
            Issue.record("not dead after the last attempt")
            return
        }
        #expect(sentence.contains("FCM"))
    }

    @Test("a 401 re-mints the access token once on the connection; nothing else touches it")
    func connectionEffects() {
        #expect(FCMReason.connectionEffect(status: 401, code: "UNAUTHENTICATED") == .reMintToken)
        #expect(FCMReason.connectionEffect(status: 401, code: nil) == .reMintToken)
        #expect(FCMReason.connectionEffect(status: 401, code: "THIRD_PARTY_AUTH_ERROR") == .none)
        #expect(FCMReason.connectionEffect(status: 404, code: "UNREGISTERED") == .none)
        #expect(FCMReason.connectionEffect(status: 200, code: nil) == .none)
    }
}
