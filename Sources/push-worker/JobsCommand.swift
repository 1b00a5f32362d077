import ArgumentParser
import Foundation
import PushCore
import PushQueue

struct JobsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "jobs",
        abstract: "Inspect jobs in push.jobs.",
        subcommands: [Show.self, Cancel.self, Revive.self]
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
                guard let details = try await queue.operations.job(id: id) else {
                    if try await queue.operations.deadLetter(id: id) != nil {
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
                if let name = details.providerMessageID { print("  message     \(name)  (FCM's id)") }
                if let key = details.job.coalesceKey { print("  coalesce    \(key)") }
                if let newer = details.supersededBy {
                    print("  superseded  by job \(newer) (same coalesce_key, newer): never sent")
                }
                if !details.children.isEmpty {
                    let counts = Dictionary(grouping: details.children, by: \.state).mapValues(\.count)
                    print(
                        "  children    \(details.children.count): \(counts.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", "))"
                    )
                    for child in details.children {
                        print(
                            "    job \(child.id)  \(child.state)  device fp \(child.tokenFingerprint)  \(child.environment)\(child.state == "delivered" ? "" : child.reason.map { "  \($0)" } ?? "")"
                        )
                    }
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

extension JobsCommand {
    struct Cancel: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract:
                "Cancel queued or retrying jobs: they end cancelled, unsent (a request already in flight completes).",
            discussion: """
                By id, or every queued job of a coalesce_key (--topic narrows it to one app). A job a worker \
                holds is cancelled too: the worker withdraws it if its request is not yet written (a \
                rate-limited job waiting for its slot, for one); a request already in flight completes and \
                its outcome is recorded. Jobs that already ended are named and left as they are.

                Examples:
                  push-worker jobs cancel 4711 4712
                  push-worker jobs cancel --coalesce-key order-991 --topic com.example.app
                """
        )

        @OptionGroup var database: DatabaseOptions
        @Argument(help: "Job ids.") var ids: [Int64] = []
        @Option(name: .customLong("coalesce-key"), help: "Cancel every queued job of this coalesce_key.")
        var coalesceKey: String?
        @Option(help: "With --coalesce-key: only this topic (bundle id).") var topic: String?
        @Flag(help: "Print the result as JSON.") var json = false

        func validate() throws {
            if self.ids.isEmpty && self.coalesceKey == nil {
                throw ValidationError("name the jobs to cancel: ids, or --coalesce-key K")
            }
            if self.topic != nil && self.coalesceKey == nil {
                throw ValidationError("--topic narrows --coalesce-key: give the key too")
            }
        }

        func run() async throws {
            let (ids, key, topic, json) = (self.ids, self.coalesceKey, self.topic, self.json)
            let result = try await self.database.withQueue { queue, _, _ in
                try await queue.cancel(ids: ids, coalesceKey: key, topic: topic)
            }
            if json {
                printJSON(result)
                return
            }
            let total = result.cancelled.count + result.heldByWorkers.count
            print("cancelled \(total) job\(total == 1 ? "" : "s")")
            if !result.cancelled.isEmpty {
                print("  waiting, never sent: \(result.cancelled.map(String.init).joined(separator: ", "))")
            }
            if !result.heldByWorkers.isEmpty {
                print(
                    "  held by a worker: \(result.heldByWorkers.map(String.init).joined(separator: ", ")) (withdrawn if not yet written; a request in flight completes: see `jobs show`)"
                )
            }
            for (id, state) in result.ended.sorted(by: { $0.key < $1.key }) {
                print("  \(id) is \(state): left as it is")
            }
            if !result.missing.isEmpty {
                print("  no such job: \(result.missing.map(String.init).joined(separator: ", "))")
            }
            if total == 0 { throw ExitCode(1) }
        }
    }

    struct Revive: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Send superseded jobs after all, when the newer job of their key died unsent.",
            discussion: """
                Latest wins: once a newer job of a coalesce_key is claimed, older ones end superseded, never \
                sent. If that newer job then died (a dead letter: never delivered), the device holds neither \
                state. Revive queues the superseded job again, under a new id above its key's high-water mark, \
                with the same apns_id. It refuses a job when a newer job of its key is pending, running or \
                delivered (that would send an older state after a newer one), and when the job that superseded \
                it is no longer kept. Fixing and replaying the dead letter itself (`push-worker dead replay`) is \
                the other way: it sends the newer state.
                """
        )

        @OptionGroup var database: DatabaseOptions
        @Argument(help: "Ids of superseded jobs.") var ids: [Int64] = []
        @Flag(name: .customLong("dry-run"), help: "Say what would be revived; change nothing.") var dryRun = false
        @Flag(help: "Print the result as JSON.") var json = false

        func validate() throws {
            if self.ids.isEmpty { throw ValidationError("name the superseded jobs to revive by id") }
        }

        func run() async throws {
            let (ids, dryRun, json) = (self.ids, self.dryRun, self.json)
            let result = try await self.database.withQueue { queue, _, _ in
                try await queue.operations.reviveSuperseded(ids: ids, dryRun: dryRun)
            }
            if json {
                printJSON(ReviveJSON(result))
            } else {
                let verb = dryRun ? "would revive" : "revived"
                print("\(verb) \(result.revived.count) superseded job\(result.revived.count == 1 ? "" : "s")")
                if !result.revived.isEmpty {
                    printTable(
                        ["ID", "NEW ID", "APNS-ID", "DEAD SUPERSEDER"],
                        result.revived.map {
                            [
                                String($0.id), $0.newID.map(String.init) ?? "-", $0.apnsID.uuidString.lowercased(),
                                String($0.deadSuperseder),
                            ]
                        }
                    )
                }
                let expired = result.revived.filter(\.expired)
                if !expired.isEmpty {
                    print(
                        "warning: \(expired.count) of them have an expires_at that has passed: they die Expired at once"
                    )
                }
                for refused in result.refused { print("refused: \(refused.why)") }
            }
            if result.revived.isEmpty && !result.refused.isEmpty { throw ExitCode(1) }
        }
    }
}

struct ReviveJSON: Encodable {
    struct Revived: Encodable {
        var id: Int64
        var newId: Int64?
        var apnsId: String
        var deadSuperseder: Int64
        var expired: Bool
    }

    var dryRun: Bool
    var revived: [Revived]
    var refused: [[String: String]]

    init(_ result: ReviveResult) {
        self.dryRun = result.dryRun
        self.revived = result.revived.map {
            Revived(
                id: $0.id,
                newId: $0.newID,
                apnsId: $0.apnsID.uuidString.lowercased(),
                deadSuperseder: $0.deadSuperseder,
                expired: $0.expired
            )
        }
        self.refused = result.refused.map { ["id": String($0.id), "why": $0.why] }
    }
}

/// The producer's side of a job, the same for live jobs and dead letters.
func printJobHeader(_ job: PushJob, title: String) {
    print(title)
    if job.platform == .fcm {
        // FCM: the apns_id travels as data.push_id; no push type, no sandbox.
        print("  platform    fcm (Android)  push_id \(job.apnsID.uuidString.lowercased())")
        print("  topic       \(job.topic)  priority \(job.priority.map(String.init) ?? "default (10, HIGH)")")
        print("  target      registration token fp \(job.tokenFingerprint)  credential \(job.credential)")
    } else {
        print("  apns-id     \(job.apnsID.uuidString.lowercased())")
        print(
            "  topic       \(job.topic)  push type \(job.pushType)  priority \(job.priority.map(String.init) ?? "default")"
        )
        let environment =
            job.autoEnvironment
            ? "\(job.environment) (auto: production first, development once on BadDeviceToken)" : job.environment
        if job.recipient == nil {
            print(
                "  target      \(job.deviceToken != nil ? "device token" : "channel") fp \(job.tokenFingerprint)  \(environment)  credential \(job.credential)"
            )
        }
    }
    if let recipient = job.recipient {
        print(
            "  target      recipient \(recipient): one child job per live device (push.devices)  credential \(job.credential)"
        )
    }
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
        if let previous = entry["previous_id"] as? Int { parts.append("was job \(previous)") }
        print("  " + parts.joined(separator: "  "))
    }
}
