import APNsTransport
import ArgumentParser
import Foundation
import PushCore
import PushQueue

struct DescribeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "describe",
        abstract:
            "The exact HTTP/2 request a send of job ID would issue: method, path, headers, payload, bytes and limit.",
        discussion:
            "No JWT is minted and no socket is opened. A job that would be refused before sending shows the trap id and the fix instead. The device token is masked unless --show-token."
    )

    @OptionGroup var database: DatabaseOptions
    @Argument(help: "The job id (live or dead letter).") var id: Int64
    @Flag(name: .customLong("show-token"), help: "Print the device token in the path instead of its fingerprint.")
    var showToken = false
    @Flag(help: "Print the result as JSON.") var json = false

    func run() async throws {
        let id = self.id
        let (job, isDeadLetter) = try await self.database.withQueue { queue, _, _ -> (PushJob, Bool) in
            if let details = try await queue.job(id: id) { return (details.job, false) }
            if var letter = try await queue.deadLetter(id: id) {
                // The request a replay would send: a replay starts the default expiry afresh.
                letter.job.firstAttemptAt = nil
                return (letter.job, true)
            }
            throw CLIError("no job \(id) in push.jobs or push.dead_jobs")
        }
        let request: APNsRequest
        do {
            request = try RequestBuilder.describe(job)
        } catch {
            if self.json {
                printJSON([
                    "job_id": String(id), "rejected": error.reason, "trap_id": error.trapID?.rawValue ?? "",
                    "error": error.message,
                ])
            } else {
                print("job \(id) would not be sent: \(error.reason)\(error.trapID.map { " [\($0)]" } ?? "")")
                print("  \(error.message)")
                if isDeadLetter && error.reason == "Expired" {
                    print("  a replay would die Expired again: `push-worker dead replay \(id) --expires-in 1h`")
                }
            }
            throw ExitCode(2)
        }
        var path = request.path
        if !self.showToken, let token = job.deviceToken {
            path = path.replacingOccurrences(of: token, with: "<token fp \(job.tokenFingerprint)>")
        }
        let host = APNsEndpoint.apple(request.environment)
        let payload = String(decoding: request.body, as: UTF8.self)
        if self.json {
            printJSON(
                DescribeJSON(
                    method: request.method,
                    url: "https://\(host.host)\(path)",
                    headers: Dictionary(request.headers.map { ($0.name, $0.value) }, uniquingKeysWith: { $1 }),
                    payload: payload,
                    bytes: request.byteCount,
                    limit: request.limit,
                    warnings: request.warnings.map { ["code": $0.trapID.rawValue, "message": $0.message] }
                )
            )
            return
        }
        print("\(request.method) https://\(host.host)\(path)  HTTP/2")
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
        if isDeadLetter { print("(job \(id) is a dead letter: this is the request a replay would send)") }
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
