import Foundation
import PushCore
import Testing

@Suite("APNs reasons: class and trap id")
struct ClassificationTests {
    static let table: [(Int?, String?, APNsResponseClass, String?)] = [
        (200, nil, .delivered, nil),
        (410, "Unregistered", .tokenInvalid, "MS020"), (410, "ExpiredToken", .tokenInvalid, "MS020"),
        (400, "BadDeviceToken", .tokenInvalid, "MS014"), (400, "DeviceTokenNotForTopic", .tokenInvalid, nil),
        (429, "TooManyRequests", .retryable, "MS015"), (500, "InternalServerError", .retryable, nil),
        (503, "ServiceUnavailable", .retryable, nil), (503, "Shutdown", .retryable, nil),
        (400, "IdleTimeout", .retryable, nil),
        (nil, nil, .retryable, nil),
        (403, "ExpiredProviderToken", .credentialRetry, "MS030"),
        (403, "UnrelatedKeyIdInToken", .credentialRetry, "MS030"),
        (403, "InvalidProviderToken", .credentialFatal, "MS030"),
        (403, "MissingProviderToken", .credentialFatal, "MS030"),
        (403, "Forbidden", .credentialFatal, "MS030"), (403, "BadEnvironmentKeyIdInToken", .credentialFatal, nil),
        (403, "BadCertificate", .credentialFatal, nil), (403, "BadCertificateEnvironment", .credentialFatal, nil),
        (429, "TooManyProviderTokenUpdates", .credentialFatal, "MS030"),
        (400, "TopicDisallowed", .topicFatal, "MS018"),
        (400, "BadExpirationDate", .permanent, "MS032"), (400, "MissingTopic", .permanent, "MS035"),
        (413, "PayloadTooLarge", .permanent, "MS011"), (400, "MissingChannelId", .permanent, "MS031"),
        (400, "BadChannelId", .permanent, "MS031"), (400, "ChannelNotRegistered", .permanent, "MS031"),
        (400, "FeatureNotEnabled", .permanent, "MS034"), (400, "BadCollapseId", .permanent, nil),
        (400, "BadMessageId", .permanent, nil), (400, "BadPriority", .permanent, nil),
        (400, "BadTopic", .permanent, nil),
        (400, "DuplicateHeaders", .permanent, nil), (400, "InvalidPushType", .permanent, nil),
        (400, "MissingDeviceToken", .permanent, nil), (400, "PayloadEmpty", .permanent, nil),
        (404, "BadPath", .permanent, nil), (405, "MethodNotAllowed", .permanent, nil),
        (403, "BadDate", .credentialFatal, "MS030"), (400, "MissingPushType", .permanent, nil),
        (400, "CannotCreateChannelConfig", .permanent, "MS031"),
        (400, "SomethingNew", .unknown, nil), (418, "Teapot", .unknown, nil),
    ]

    @Test("every reason maps to its class and trap id", arguments: table)
    func classify(status: Int?, reason: String?, expected: APNsResponseClass, trap: String?) {
        let verdict = APNsVerdict.classify(status: status, reason: reason)
        #expect(verdict.responseClass == expected)
        #expect(verdict.trapID?.rawValue == trap)
    }
}

@Suite("Retry: the priority-aware stretch, backoff and Retry-After")
struct RetryPolicyTests {
    let defaults = RetryPolicy.Configuration()

    @Test("priority 5 keeps the configuration; priority 10 gets at most 2 retries and doubled delays")
    func stretch() {
        let p5 = RetryPolicy(defaults, priority: 5, environment: [:])
        #expect(p5.maxRetries == 3 && p5.maxAttempts == 4)
        #expect(p5.baseDelay == .milliseconds(100) && p5.maxDelay == .seconds(5))
        let p10 = RetryPolicy(defaults, priority: 10, environment: [:])
        #expect(p10.maxRetries == 2 && p10.maxAttempts == 3)
        #expect(p10.baseDelay == .milliseconds(200) && p10.maxDelay == .seconds(10))
        let p1 = RetryPolicy(defaults, priority: 1, environment: [:])
        #expect(p1.maxRetries == 3)
        // One way only: a configuration below 2 retries stays below.
        #expect(RetryPolicy(.init(maxRetries: 1), priority: 10, environment: [:]).maxRetries == 1)
        // max_attempts narrows, never widens.
        #expect(RetryPolicy(defaults, priority: 5, maxAttempts: 2, environment: [:]).maxAttempts == 2)
        #expect(RetryPolicy(defaults, priority: 5, maxAttempts: 9, environment: [:]).maxAttempts == 4)
        // The kill switch.
        #expect(RetryPolicy(defaults, priority: 5, environment: ["PUSH_WORKER_DISABLE_RETRY": "1"]).maxRetries == 0)
        #expect(RetryPolicy(defaults, priority: 5, environment: ["PUSH_WORKER_DISABLE_RETRY": ""]).maxRetries == 3)
    }

    @Test("backoff doubles to the cap, then jitter is added after the cap within [0, base]")
    func backoff() {
        let noJitter = RetryPolicy(.init(jitter: false), priority: 5, environment: [:])
        #expect(
            (0..<8).map { noJitter.backoff(beforeRetry: $0) } == [
                .milliseconds(100), .milliseconds(200), .milliseconds(400), .milliseconds(800), .milliseconds(1600),
                .milliseconds(3200), .seconds(5), .seconds(5),
            ]
        )
        let jittered = RetryPolicy(defaults, priority: 10, environment: [:])
        var generator = SystemRandomNumberGenerator()
        var saturated: [Duration] = []
        for _ in 0..<500 { saturated.append(jittered.backoff(beforeRetry: 20, using: &generator)) }
        #expect(saturated.allSatisfy { $0 >= .seconds(10) && $0 <= .seconds(10) + .milliseconds(200) })
        #expect(Set(saturated).count > 50, "saturated retries still spread")
    }

    @Test(
        "terminal classes never retry; retryable ones stop when attempts are used; Retry-After replaces the delay uncapped"
    )
    func decide() {
        let policy = RetryPolicy(.init(maxRetries: 10), priority: 5, environment: [:])
        for terminal in [APNsResponseClass.tokenInvalid, .permanent, .credentialFatal, .topicFatal, .delivered] {
            #expect(policy.decide(after: 1, responseClass: terminal) == .stop)
        }
        let p10 = RetryPolicy(defaults, priority: 10, environment: [:])
        #expect(p10.decide(after: 1, responseClass: .retryable) != .exhausted)
        #expect(p10.decide(after: 3, responseClass: .retryable) == .exhausted)
        #expect(
            p10.decide(after: 1, responseClass: .retryable, retryAfter: .seconds(3600)) == .retry(after: .seconds(3600))
        )
        #expect(p10.decide(after: 1, responseClass: .unknown) != .stop)
    }

    @Test("Retry-After: seconds and HTTP dates, rounded up")
    func retryAfter() {
        let now = Date(timeIntervalSince1970: 1_800_000_000.4)
        #expect(RetryAfter.parse("120", now: now) == .seconds(120))
        #expect(RetryAfter.parse("1.2", now: now) == .seconds(2))
        #expect(
            RetryAfter.parse("Fri, 15 Jan 2027 08:00:10 GMT", now: Date(timeIntervalSince1970: 1_800_000_000)) != nil
        )
        let date = Date(timeIntervalSince1970: 1_800_000_000 + 30)
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        #expect(RetryAfter.parse(formatter.string(from: date), now: now) == .seconds(30), "29.6 s rounds up to 30")
        #expect(RetryAfter.parse("soon", now: now) == nil)
        #expect(RetryAfter.parse(nil, now: now) == nil)
    }
}

@Suite("APNs reasons: one table of class, trap id and sentence")
struct ReasonTableTests {
    @Test("every row round-trips its wire text; unknown text is kept; final reasons name what to fix")
    func table() {
        #expect(Set(APNsReason.table.map(\.text)).count == APNsReason.table.count, "no reason twice")
        for (reason, text, row) in APNsReason.table {
            #expect(APNsReason(text) == reason)
            #expect(reason.description == text)
            #expect(reason.row?.responseClass == row.responseClass)
            let sentence = reason.sentence(status: 400)
            #expect(
                !sentence.contains("%@") && sentence.contains(text) || row.sentence == nil && sentence.contains(text),
                "\(text): \(sentence)"
            )
        }
        #expect(APNsReason("SomethingNew") == .unknown("SomethingNew"))
        #expect(APNsReason("SomethingNew").description == "SomethingNew")
        #expect(APNsReason("SomethingNew").row == nil)
        #expect(
            DeadLetterSentence.sentence(status: 410, reason: "Unregistered", attempts: 1, exhausted: false).contains(
                "no longer valid"
            )
        )
        #expect(
            DeadLetterSentence.sentence(status: 503, reason: "ServiceUnavailable", attempts: 3, exhausted: true)
                .hasPrefix("gave up after 3 attempts")
        )
    }

    @Test("what an answer does to the connection is a column of the reason table: three reasons act, no other")
    func connectionColumn() {
        let acting: [String: ConnectionEffect] = [
            "ExpiredProviderToken": .reMintToken, "TooManyProviderTokenUpdates": .adoptSharedToken,
            "UnrelatedKeyIdInToken": .reconnect,
        ]
        for entry in APNsReason.table {
            #expect(entry.row.connection == acting[entry.text] ?? .none, "\(entry.text)")
            #expect(APNsReason.connectionEffect(status: 403, reason: entry.text) == acting[entry.text] ?? .none)
        }
        #expect(APNsReason.connectionEffect(status: 200, reason: "ExpiredProviderToken") == .none)
        #expect(APNsReason.connectionEffect(status: 403, reason: "SomethingNew") == .none)
        #expect(APNsReason.connectionEffect(status: 403, reason: nil) == .none)
    }
}
