import ArgumentParser
import Foundation
import PushCore
import PushQueue

struct JobsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "jobs",
        abstract: "Inspect jobs in push.jobs.",
        subcommands: [Show.self]
    )

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "One job with its outcome and attempt history (device tokens shown as fingerprints).",
            discussion:
                "A job that can never succeed has moved to the dead-letter table: see `push-worker dead show ID`."
        )

        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The job id.") var id: Int64
        @Flag(help: "Print the whole row as JSON (includes the token and payload).") var json = false
        @Flag(help: "Also print the payload.") var payload = false

        func run() async throws {
            let (id, json, showPayload) = (self.id, self.json, self.payload)
            try await self.database.withQueue { queue, _, _ in
                guard let details = try await queue.job(id: id) else {
                    if try await queue.deadLetter(id: id) != nil {
                        throw CLIError("job \(id) is a dead letter now: see `push-worker dead show \(id)`")
                    }
                    throw CLIError(
                        "no job \(id) in push.jobs or push.dead_jobs (delivered jobs are pruned after the retention period)"
                    )
                }
                if json {
                    print(details.rowJSON)
                    return
                }
                printJobHeader(details.job, title: "job \(details.job.id)  \(details.state.rawValue)")
                print(
                    "  status      \(details.status.map(String.init) ?? "-")\(details.reason.map { "  reason \($0)" } ?? "")"
                )
                print("  attempts    \(details.job.attempts)\(details.job.maxAttempts.map { " (max \($0))" } ?? "")")
                print(
                    "  trap ids    \(details.job.trapIDs.isEmpty ? "-" : details.job.trapIDs.map(\.rawValue).joined(separator: ", "))"
                )
                print(
                    "  delivered   \(formatDate(details.deliveredAt))\(details.latencyMs.map { "  latency \($0) ms" } ?? "")"
                )
                print("  last try    \(formatDate(details.lastAttemptAt))")
                if let unique = details.apnsUniqueID { print("  unique id   \(unique)") }
                if let key = details.job.coalesceKey { print("  coalesce    \(key)") }
                if let newer = details.supersededBy {
                    print("  superseded  by job \(newer) (same coalesce_key, newer): never sent")
                }
                if let worker = details.lockedBy {
                    print("  locked by   \(worker) until \(formatDate(details.lockedUntil))")
                }
                printHistory(details.historyJSON)
                if showPayload { print("payload\n  \(details.job.payload)") }
            }
        }
    }
}

/// The producer's side of a job, the same for live jobs and dead letters.
func printJobHeader(_ job: PushJob, title: String) {
    print(title)
    print("  apns-id     \(job.apnsID.uuidString.lowercased())")
    print(
        "  topic       \(job.topic)  push type \(job.pushType)  priority \(job.priority.map(String.init) ?? "default")"
    )
    print(
        "  target      \(job.deviceToken != nil ? "device token" : "channel") fp \(job.tokenFingerprint)  \(job.environment)  credential \(job.credential)"
    )
    if let collapse = job.collapseID { print("  collapse id \(collapse)") }
    print(
        "  created     \(formatDate(job.createdAt))  run at \(formatDate(job.runAt))  expires \(formatDate(job.expiresAt))"
    )
    print("  payload     \(job.payload.utf8.count) bytes")
}

/// The attempt history, one line per entry.
func printHistory(_ json: String) {
    guard let entries = try? JSONSerialization.jsonObject(with: Data(json.utf8)) as? [[String: Any]], !entries.isEmpty
    else {
        print("history       (no attempts yet)")
        return
    }
    print("history")
    for entry in entries {
        var parts: [String] = []
        if let attempt = entry["attempt"] as? Int { parts.append("#\(attempt)") }
        if let at = entry["at"] as? String { parts.append(String(at.prefix(23))) }
        if let outcome = entry["outcome"] as? String { parts.append(outcome) }
        if let status = entry["status"] as? Int { parts.append("\(status)") }
        if let reason = entry["reason"] as? String { parts.append(reason) }
        if let traps = entry["trap_ids"] as? [String], !traps.isEmpty { parts.append(traps.joined(separator: ",")) }
        if let latency = entry["latency_ms"] as? Int { parts.append("\(latency) ms") }
        if let sent = entry["sent"] as? Bool, !sent { parts.append("(not sent)") }
        if let dead = entry["dead_reason"] as? String { parts.append("after \(dead)") }
        print("  " + parts.joined(separator: "  "))
    }
}
