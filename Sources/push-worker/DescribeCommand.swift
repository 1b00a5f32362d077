import ArgumentParser
import Foundation
import PushCore
import PushQueue
import PushTransport

struct DescribeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "describe",
        abstract:
            "The exact HTTP/2 request a send of job ID would issue: method, path, headers, payload, bytes and limit.",
        discussion: """
            No JWT is minted and no socket is opened. A job that would be refused before sending shows the trap \
            id and the fix instead; fields APNs accepts but a device ignores are listed as warnings (PW codes). \
            The device token is masked unless --show-token.

            --row describes a producer's row before it is inserted (no database needed): a JSON object with the \
            producer's columns, for example
              echo '{"topic":"com.example.app","device_token":"<hex>","payload":{"aps":{"alert":"hi"}}}' \\
                | push-worker describe --row -
            The INSERT still checks the schema's rules (the constraint's name is the rule).
            """
    )

    @OptionGroup var database: DatabaseOptions
    @Option(
        help: ArgumentHelp(
            "The worker's config file: an FCM job's URL then names its credential's Firebase project.",
            valueName: "path"
        )
    )
    var config: String?
    @Argument(help: "The job id (live or dead letter); leave it out with --row.") var id: Int64?
    @Option(
        help: ArgumentHelp(
            "Describe a producer row instead of a job: a JSON object of push.jobs' producer columns, from this file or - for standard input.",
            valueName: "file"
        )
    )
    var row: String?
    @Option(
        name: .customLong("apns-port"),
        help: ArgumentHelp("The port of Apple's send hosts the request would go to: 443 or 2197.", valueName: "port")
    )
    var applePort: Int = 443
    @Flag(name: .customLong("show-token"), help: "Print the device token in the path instead of its fingerprint.")
    var showToken = false
    @Flag(help: "Print the result as JSON.") var json = false

    func validate() throws {
        if (self.id == nil) == (self.row == nil) {
            throw ValidationError("name a job id, or --row FILE (- for standard input) for a row not yet inserted")
        }
        guard self.applePort == 443 || self.applePort == 2197 else {
            throw ValidationError("--apns-port \(self.applePort): Apple's send hosts listen on 443 and 2197 only")
        }
    }

    func run() async throws {
        let job: PushJob
        let isDeadLetter: Bool
        if let row = self.row {
            job = try ProducerRow.job(from: try ProducerRow.read(row))
            isDeadLetter = false
        } else {
            let id = self.id ?? 0
            (job, isDeadLetter) = try await self.database.withQueue { queue, _, _ -> (PushJob, Bool) in
                if let details = try await queue.operations.job(id: id) { return (details.job, false) }
                if var letter = try await queue.operations.deadLetter(id: id) {
                    // The request a replay would send: a replay starts the default expiry afresh.
                    letter.job.firstAttemptAt = nil
                    return (letter.job, true)
                }
                throw CLIError("no job \(id) in push.jobs or push.dead_jobs")
            }
        }
        let what = self.row == nil ? "job \(self.id ?? 0)" : "the row"
        if let recipient = job.recipient {
            try await self.describeRecipient(job, recipient: recipient, what: what)
            return
        }
        if let activityID = job.activityID {
            try await self.describeActivityEvent(job, activityID: activityID, what: what)
            return
        }
        let request: APNsRequest
        do {
            if job.platform == .fcm {
                try self.describeFCM(job, isDeadLetter: isDeadLetter)
                return
            }
            request = try RequestBuilder.describe(job, now: processClock.wallNow)
        } catch {
            if self.json {
                printJSON([
                    "job_id": self.id.map(String.init) ?? "", "rejected": error.reason,
                    "trap_id": error.trapID?.rawValue ?? "",
                    "error": error.message,
                ])
            } else {
                print("\(what) would not be sent: \(error.reason)\(error.trapID.map { " [\($0)]" } ?? "")")
                print("  \(error.message)")
                if isDeadLetter && error.reason == "Expired" {
                    print(
                        "  a replay would die Expired again: `push-worker dead replay \(self.id ?? 0) --expires-in 1h`"
                    )
                }
            }
            throw ExitCode(2)
        }
        var path = request.path
        if !self.showToken, let token = job.deviceToken {
            path = path.replacingOccurrences(of: token, with: "<token fp \(job.tokenFingerprint)>")
        }
        let endpoint = APNsEndpoint.apple(request.environment, port: self.applePort)
        let host = endpoint.port == 443 ? endpoint.host : "\(endpoint.host):\(endpoint.port)"
        let payload = String(decoding: request.body, as: UTF8.self)
        if self.json {
            printJSON(
                DescribeJSON(
                    method: request.method,
                    url: "https://\(host)\(path)",
                    headers: Dictionary(request.headers.map { ($0.name, $0.value) }, uniquingKeysWith: { $1 }),
                    payload: payload,
                    bytes: request.byteCount,
                    limit: request.limit,
                    warnings: request.warnings.map { ["code": $0.trapID.rawValue, "message": $0.message] }
                )
            )
            return
        }
        print("\(request.method) https://\(host)\(path)  HTTP/2")
        print(
            "authorization: bearer <ES256 provider token for credential '\(job.credential)'; none if it is a certificate credential>"
        )
        for header in request.headers { print("\(header.name): \(header.value)") }
        print("")
        print(payload)
        print("")
        print("\(request.byteCount) bytes of \(request.limit) allowed")
        for warning in request.warnings {
            print("warning \(warning.trapID.rawValue): \(warning.message) (APNs accepts it; the job is sent)")
        }
        if job.autoEnvironment {
            print(
                job.environment == "production"
                    ? "environment production: the job's environment is auto (the build is not known); if APNs answers BadDeviceToken there, it is sent once to development with the same apns-id"
                    : "environment development: the job's environment is auto and APNs production answered BadDeviceToken (a development build's token)"
            )
        } else if job.deviceToken != nil {
            print("environment \(job.environment): the job names it, and it never switches")
        }
        if isDeadLetter {
            print("(job \(self.id ?? 0) is a dead letter: this is the request a replay would send)")
        }
    }

    /// A recipient's job is not sent itself: where its children go (the live devices now), or went.
    func describeRecipient(_ job: PushJob, recipient: String, what: String) async throws {
        let (details, devices) = try await self.database.withQueue { queue, _, _ in
            (
                try await queue.operations.job(id: job.id),
                try await queue.operations.devices(recipient: recipient, topic: job.topic, limit: 1_000)
            )
        }
        if let details, !details.children.isEmpty {
            print("\(what) went to recipient \(recipient): fanned out to \(details.children.count) child jobs")
            for child in details.children {
                print("  job \(child.id)  \(child.state)  device fp \(child.tokenFingerprint)  \(child.environment)")
            }
            print("describe a child for its request: push-worker describe \(details.children[0].id)")
            return
        }
        let live = devices.filter { $0.isLive && $0.kind == "device" && $0.platform == job.platform.rawValue }
        print(
            "\(what) goes to recipient \(recipient): when a worker claims it, one child job per live device of topic \(job.topic) on \(job.platform.rawValue), each with its own apns-id derived from this job's (\(job.apnsID.uuidString.lowercased()))"
        )
        if live.isEmpty {
            print(
                "  no live device now: it would end a dead letter NoDevice; register the app's token in push.devices (kind device)"
            )
        }
        for device in live {
            let why =
                device.environment == "auto"
                ? "auto: production first, development once on BadDeviceToken" : "the device's environment"
            print("  device fp \(device.tokenFingerprint)  \(device.environment) (\(why))")
        }
    }
}

extension DescribeCommand {
    /// A Live Activity event is not sent itself: where it went, why it was not sent, or where it will go (the
    /// activity's tokens or channel now) and whether the routing will send it at all.
    func describeActivityEvent(_ job: PushJob, activityID: String, what: String) async throws {
        let (details, activity, devices) = try await self.database.withQueue { queue, _, _ in
            (
                try await queue.operations.job(id: job.id),
                try await queue.operations.activity(topic: job.topic, activityID: activityID),
                try await queue.operations.devices(topic: job.topic, limit: 10_000)
            )
        }
        let event = ActivityEvent.read(jobID: job.id, payload: job.payload, priority: job.priority)
        let named: String
        switch event {
        case .success(let event): named = "event \(event.kind.rawValue) (timestamp \(event.timestamp))"
        case .failure(let error):
            print("\(what) is not a Live Activity event the worker can route: \(error.sentence)")
            print("  it ends a dead letter ActivityEventInvalid when claimed; fix the payload and replay it")
            return
        }
        let about = "\(what) is \(named) of Live Activity '\(activityID)' (topic \(job.topic))"
        if let details, !details.children.isEmpty {
            print("\(about): sent to \(details.children.count) child jobs")
            for child in details.children {
                print("  job \(child.id)  \(child.state)  token fp \(child.tokenFingerprint)")
            }
            return
        }
        if let details, details.state == .superseded {
            let why =
                details.reason == "ActivityEnded"
                ? "the activity's end went before it, and iOS drops everything after an end"
                : "an event as new or newer went before it, and iOS drops an update older than the one it shows"
            print("\(about): not sent, superseded \(details.reason ?? "-"): \(why)")
            return
        }
        guard case .success(let parsed) = event else { return }
        guard let activity else {
            print("\(about): the activity is not in push.activities yet; its first event creates it")
            return
        }
        if activity.state == "ended" {
            print(
                "\(about): will not be sent: the activity ended \(formatDate(activity.endedAt)) (ActivityEnded); iOS drops everything after an end"
            )
            return
        }
        if parsed.kind != .start, let last = activity.lastTimestamp, parsed.timestamp <= last {
            print(
                "\(about): will not be sent: its timestamp is not newer than \(last), already sent (StaleTimestamp)"
            )
            return
        }
        let targets: [String]
        if parsed.kind == .start {
            targets = devices.filter {
                $0.isLive && $0.kind == "push_to_start" && $0.recipient == activity.recipient
            }.map { "push-to-start token fp \($0.tokenFingerprint)" }
            print("\(about): goes to recipient \(activity.recipient ?? "-")'s live push-to-start tokens")
        } else if let channel = activity.channelID {
            targets = ["channel \(channel)"]
            print("\(about): goes to the activity's broadcast channel")
        } else {
            targets = devices.filter { $0.isLive && $0.kind == "activity" && $0.activityID == activityID }.map {
                "activity token fp \($0.tokenFingerprint)"
            }
            print("\(about): goes to the activity's own live tokens (push.devices kind activity)")
        }
        if targets.isEmpty {
            print("  none now: it would end a dead letter NoDevice; register the token in push.devices")
        }
        for target in targets { print("  \(target)") }
        if parsed.kind == .update && job.priority == 10 && activity.budgetUsed >= activity.budgetPerHour {
            print(
                "  priority 5 with trap MS015: the activity used its \(activity.budgetPerHour) priority-10 updates this hour"
            )
        }
    }

    /// An FCM job's exact request: the send URL (the credential's project, when the config file names
    /// it), headers without the access token, and the message body.
    func describeFCM(_ job: PushJob, isDeadLetter: Bool) throws(PreSendRejection) {
        // Built around a stand-in for the token (unless --show-token): a token FCM escapes in JSON would
        // survive a search and replace on the finished body.
        var shown = job
        if !self.showToken { shown.deviceToken = "<token fp \(job.tokenFingerprint)>" }
        let message = try FCMMessageBuilder.describe(shown, now: processClock.wallNow)
        let project =
            (try? self.config.map(ConfigFile.load)?.serviceAccounts()[job.credential]?.projectID) ?? "<project_id>"
        let body = String(decoding: message.body, as: UTF8.self)
        let url = "https://\(FCMClient.googleEndpoint.host)\(FCMMessage.path(project: project))"
        if self.json {
            printJSON(
                DescribeJSON(
                    method: "POST",
                    url: url,
                    headers: ["content-type": "application/json"],
                    payload: body,
                    bytes: message.body.count,
                    limit: FCMMessageBuilder.payloadLimit,
                    warnings: []
                )
            )
            return
        }
        print("POST \(url)  HTTP/2")
        print("authorization: Bearer <OAuth access token of the service account of credential '\(job.credential)'>")
        print("content-type: application/json")
        print("")
        print(body)
        print("")
        print(
            "android.priority \(message.androidPriority), ttl \(message.ttl), data.push_id \(job.apnsID.uuidString.lowercased())"
        )
        if isDeadLetter {
            print("(job \(self.id ?? 0) is a dead letter: this is the request a replay would send)")
        }
    }
}

struct DescribeJSON: Encodable {
    var method: String
    var url: String
    var headers: [String: String]
    var payload: String
    var bytes: Int
    var limit: Int
    var warnings: [[String: String]]
}

/// A producer's row as JSON (`describe --row`): the columns a producer sets, with push.jobs' defaults for
/// those left out.
enum ProducerRow {
    static let columns: Set<String> = [
        "topic", "device_token", "channel_id", "payload", "push_type", "priority", "environment", "credential",
        "collapse_id", "expires_at", "run_at", "apns_id", "max_attempts", "deliver_once", "coalesce_key",
        "platform", "traceparent",
    ]

    /// The JSON object in `path` (`-`: standard input).
    static func read(_ path: String) throws -> [String: Any] {
        let data: Data
        if path == "-" {
            data = FileHandle.standardInput.readDataToEndOfFile()
        } else {
            guard let read = FileManager.default.contents(atPath: path) else {
                throw CLIError("--row \(path): no such file (use - to read the row from standard input)")
            }
            data = read
        }
        guard let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw CLIError(
                "--row \(path) is not a JSON object: give the row's columns as {\"topic\": …, \"device_token\": …, \"payload\": {…}}"
            )
        }
        return object
    }

    /// The job the row would be, or an error naming the field and the fix.
    static func job(from row: [String: Any]) throws -> PushJob {
        if let unknown = row.keys.filter({ !Self.columns.contains($0) }).sorted().first {
            throw CLIError(
                "--row: \(unknown) is not a producer column; use \(Self.columns.sorted().joined(separator: ", "))"
            )
        }
        func text(_ name: String) throws -> String? {
            guard let value = row[name], !(value is NSNull) else { return nil }
            guard let text = value as? String else { throw CLIError("--row: \(name) must be a string") }
            return text
        }
        func integer(_ name: String) throws -> Int? {
            guard let value = row[name], !(value is NSNull) else { return nil }
            guard !(value is String), let number = value as? NSNumber,
                number.doubleValue == number.doubleValue.rounded(), abs(number.doubleValue) <= 32_767
            else {
                throw CLIError("--row: \(name) must be a whole number (priority 10, 5 or 1; max_attempts 1 to 32767)")
            }
            return number.intValue
        }
        func time(_ name: String) throws -> Date? {
            guard let value = try text(name) else { return nil }
            let formatter = ISO8601DateFormatter()
            formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
            let plain = ISO8601DateFormatter()
            guard let date = formatter.date(from: value) ?? plain.date(from: value) else {
                throw CLIError("--row: \(name) must be an ISO 8601 time such as 2026-11-25T18:00:00Z")
            }
            return date
        }
        guard let topic = try text("topic") else { throw CLIError("--row: topic is required (the app's bundle id)") }
        if try text("platform") == "fcm" {
            // What the INSERT would refuse for an Android row, said before it.
            for field in ["push_type", "channel_id", "environment"] where row[field] != nil && !(row[field] is NSNull) {
                throw CLIError("--row: \(field) is APNs' only; leave it out of an fcm row")
            }
        }
        let payload: String
        switch row["payload"] {
        case let text as String: payload = text
        case .some(let value) where JSONSerialization.isValidJSONObject(value):
            payload = String(decoding: try JSONSerialization.data(withJSONObject: value), as: UTF8.self)
        default: throw CLIError("--row: payload is required: a JSON object such as {\"aps\": {\"alert\": \"hi\"}}")
        }
        let apnsID: UUID
        if let text = try text("apns_id") {
            guard let parsed = UUID(uuidString: text) else { throw CLIError("--row: apns_id must be a UUID") }
            apnsID = parsed
        } else {
            apnsID = UUID()
        }
        var deliverOnce = false
        if let value = row["deliver_once"], !(value is NSNull) {
            guard let flag = value as? Bool else { throw CLIError("--row: deliver_once must be true or false") }
            deliverOnce = flag
        }
        return PushJob(
            id: 0,
            apnsID: apnsID,
            topic: topic,
            deviceToken: try text("device_token"),
            channelID: try text("channel_id"),
            payload: payload,
            pushType: try text("push_type") ?? "alert",
            priority: try integer("priority"),
            environment: try text("environment") ?? (try text("platform") == "fcm" ? "fcm" : "production"),
            credential: try text("credential") ?? "default",
            collapseID: try text("collapse_id"),
            deliverOnce: deliverOnce,
            expiresAt: try time("expires_at"),
            runAt: try time("run_at") ?? processClock.wallNow,
            maxAttempts: try integer("max_attempts"),
            createdAt: processClock.wallNow,
            coalesceKey: try text("coalesce_key"),
            platform: try text("platform").map { name in
                guard let platform = Platform(rawValue: name) else {
                    throw CLIError("--row: platform must be apns or fcm")
                }
                return platform
            } ?? .apns,
            traceparent: try text("traceparent").map { value in
                guard TraceParent(value) != nil else {
                    throw CLIError(
                        "--row: traceparent \(value) is not a W3C trace context (00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>, lowercase, ids not all zero); the worker would send the job untraced"
                    )
                }
                return value
            }
        )
    }
}
