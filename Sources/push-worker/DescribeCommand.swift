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

struct DescribeJSON: Encodable {
    var method: String
    var url: String
    var headers: [String: String]
    var payload: String
    var bytes: Int
    var limit: Int
    var warnings: [[String: String]]
}
