import ArgumentParser
import Foundation
import PushCore
import PushQueue

struct DeadCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dead",
        abstract: "Inspect, replay and purge dead letters (push.dead_jobs).",
        discussion: """
            A job moves here when it can never succeed (a permanent APNs reason, a pre-send check, past \
            expires_at) or has used its attempts. It keeps its id, apns_id, every producer column and its \
            attempt history. Replay moves it back to push.jobs as pending, with the same apns_id.
            """,
        subcommands: [List.self, Show.self, Replay.self, Purge.self]
    )

    /// The filters `list` and `replay` share.
    struct Filters: ParsableArguments {
        @Option(help: ArgumentHelp("Only dead letters that met this trap id, e.g. MS020.", valueName: "trap-id"))
        var trap: String?
        @Option(
            help: ArgumentHelp("Only this reason, e.g. Unregistered, BadDeviceToken, Expired.", valueName: "reason")
        )
        var reason: String?
        @Option(help: ArgumentHelp("Only this topic (bundle id).", valueName: "topic"))
        var topic: String?
        @Option(help: ArgumentHelp("Only those dead since this age (1h, 7d) or ISO 8601 time.", valueName: "time"))
        var since: HumanTime?
        @Option(help: ArgumentHelp("Only those dead before this age (1h, 7d) or ISO 8601 time.", valueName: "time"))
        var before: HumanTime?

        func filter(ids: [Int64] = [], limit: Int) -> DeadLetterFilter {
            DeadLetterFilter(
                ids: ids,
                trapID: self.trap,
                reason: self.reason,
                topic: self.topic,
                since: self.since?.date,
                before: self.before?.date,
                limit: limit
            )
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Dead letters, newest first.")

        @OptionGroup var database: DatabaseOptions
        @OptionGroup var filters: Filters
        @Option(help: "At most this many.") var limit: Int = 50
        @Flag(help: "Print the rows as a JSON array (includes tokens and payloads).") var json = false

        func validate() throws {
            guard self.limit > 0 else { throw ValidationError("--limit must be at least 1") }
        }

        func run() async throws {
            let (filter, json) = (self.filters.filter(limit: self.limit), self.json)
            try await self.database.withQueue { queue, _, _ in
                let letters = try await queue.operations.deadLetters(matching: filter)
                if json {
                    printJSONArray(letters.map(\.rowJSON))
                    return
                }
                if letters.isEmpty {
                    print("no dead letters match")
                    return
                }
                printTable(
                    ["ID", "DEAD AT", "REASON", "TRAPS", "TOPIC", "TRIES", "ERROR"],
                    letters.map { letter in
                        [
                            String(letter.job.id), formatDate(letter.deadAt), letter.reason,
                            letter.job.trapIDs.isEmpty
                                ? "-" : letter.job.trapIDs.map(\.rawValue).joined(separator: ","),
                            letter.job.topic, String(letter.job.attempts), truncate(letter.error, 60),
                        ]
                    }
                )
                if letters.count == filter.limit { print("(first \(filter.limit); use --limit for more)") }
            }
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "One dead letter with its attempt history.")

        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The job id.") var id: Int64
        @Flag(help: "Print the whole row as JSON (includes the token and payload).") var json = false
        @Flag(help: "Also print the payload.") var payload = false

        func run() async throws {
            let (id, json, showPayload) = (self.id, self.json, self.payload)
            try await self.database.withQueue { queue, _, _ in
                guard let letter = try await queue.operations.deadLetter(id: id) else {
                    if try await queue.operations.job(id: id) != nil {
                        throw CLIError("job \(id) is not dead: see `push-worker jobs show \(id)`")
                    }
                    throw CLIError("no dead letter \(id)")
                }
                if json {
                    print(letter.rowJSON)
                    return
                }
                printJobHeader(letter.job, title: "dead letter \(letter.job.id)  \(letter.reason)")
                print("  error       \(letter.error)")
                print("  status      \(letter.status.map(String.init) ?? "-")  attempts \(letter.job.attempts)")
                print(
                    "  trap ids    \(letter.job.trapIDs.isEmpty ? "-" : letter.job.trapIDs.map(\.rawValue).joined(separator: ", "))"
                )
                print("  dead at     \(formatDate(letter.deadAt))")
                if let unique = letter.apnsUniqueID { print("  unique id   \(unique)") }
                printHistory(letter.historyJSON)
                if showPayload { print("payload\n  \(letter.job.payload)") }
                print("replay with: push-worker dead replay \(letter.job.id)")
            }
        }
    }

    struct Replay: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Move dead letters back to push.jobs as pending, attempts reset, keeping apns_id.",
            discussion: """
                Select by ids, by filters, or everything with --all. A dead letter whose id or apns_id is \
                already in push.jobs (re-enqueued by a producer) is skipped and stays here; --new-apns-id sends \
                it as a new notification. A keyed job (coalesce_key) whose key has a revived older job above \
                it (jobs revive) is queued under a new id, shown as QUEUED-AS, so that its newer state goes out \
                last. Fix the cause first: a token APNs called Unregistered stays dead.
                """
        )

        @OptionGroup var database: DatabaseOptions
        @Argument(help: "Dead-letter ids to replay.") var ids: [Int64] = []
        @OptionGroup var filters: Filters
        @Flag(help: "Replay every dead letter (up to --limit).") var all = false
        @Flag(name: .customLong("new-apns-id"), help: "Mint a fresh apns-id instead of keeping the original.")
        var newAPNsID = false
        @Flag(name: .customLong("dry-run"), help: "List what would move; move nothing.") var dryRun = false
        @Option(
            name: .customLong("expires-in"),
            help: ArgumentHelp(
                "Give every replayed job a new expires_at this far from now (e.g. 1h): one that has passed would die Expired again at once.",
                valueName: "duration"
            )
        ) var expiresIn: HumanDuration?
        @Option(help: "At most this many.") var limit: Int = 1000
        @Flag(help: "Print the result as JSON.") var json = false

        func validate() throws {
            let filter = self.filters.filter(ids: self.ids, limit: self.limit)
            if filter.isUnrestricted && !self.all {
                throw ValidationError(
                    "name what to replay: ids, --trap, --reason, --topic, --since/--before, or --all for everything"
                )
            }
            if !filter.isUnrestricted && self.all {
                throw ValidationError("--all replays everything: leave out ids and filters, or drop --all")
            }
            guard self.limit > 0 else { throw ValidationError("--limit must be at least 1") }
        }

        func run() async throws {
            let (filter, newAPNsID, dryRun, json) = (
                self.filters.filter(ids: self.ids, limit: self.limit), self.newAPNsID, self.dryRun, self.json
            )
            let expiresIn = self.expiresIn?.duration
            let result = try await self.database.withQueue { queue, _, _ in
                try await queue.operations.replay(
                    matching: filter,
                    newAPNsID: newAPNsID,
                    expiresIn: expiresIn,
                    dryRun: dryRun
                )
            }
            if json {
                printJSON(ReplayJSON(result))
                return
            }
            let verb = dryRun ? "would replay" : "replayed"
            print("\(verb) \(result.moved.count) dead letter\(result.moved.count == 1 ? "" : "s")")
            if !result.moved.isEmpty {
                printTable(
                    ["ID", "QUEUED-AS", "APNS-ID", "WAS"],
                    result.moved.map {
                        [
                            String($0.id), $0.queuedAs.map(String.init) ?? ($0.renumbered ? "new id" : String($0.id)),
                            $0.apnsID.uuidString.lowercased(), $0.reason,
                        ]
                    }
                )
            }
            let renumbered = result.moved.filter(\.renumbered)
            if !renumbered.isEmpty {
                print(
                    "\(renumbered.count) \(dryRun ? "would be" : "were") queued under a new id (ids \(renumbered.prefix(10).map { String($0.id) }.joined(separator: ", "))\(renumbered.count > 10 ? ", …" : "")): a superseded job of the same coalesce_key, an older state, was revived above them; the new id puts this newer state after it, and the claim supersedes the older one. Same apns_id."
                )
            }
            let expired = result.moved.filter(\.expired)
            if !expired.isEmpty {
                print(
                    "warning: \(expired.count) \(dryRun ? "would be" : "were") replayed with an expires_at that has passed (ids \(expired.prefix(10).map { String($0.id) }.joined(separator: ", "))\(expired.count > 10 ? ", …" : "")): they die Expired again at once. Replay with --expires-in 1h (or longer) to give them a new one."
                )
            }
            if !result.skippedInvalid.isEmpty {
                print(
                    "skipped \(result.skippedInvalid.count) that break a rule the schema now checks at INSERT (they stay dead letters; fix the row or purge it):"
                )
                for invalid in result.skippedInvalid.prefix(20) { print("  \(invalid.id): \(invalid.rule)") }
            }
            if !result.skippedConflicts.isEmpty {
                print(
                    "skipped \(result.skippedConflicts.count) already in push.jobs (id or apns_id re-enqueued): \(result.skippedConflicts.map(String.init).joined(separator: ", "))"
                )
                print("  they stay dead letters; replay them with --new-apns-id to send them as new notifications")
            }
            if !dryRun && !result.moved.isEmpty && !ids.isEmpty {
                let missing = Set(ids).subtracting(result.moved.map(\.id)).subtracting(result.skippedConflicts)
                if !missing.isEmpty {
                    print("not dead letters: \(missing.sorted().map(String.init).joined(separator: ", "))")
                }
            }
        }
    }

    struct Purge: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete dead letters older than a cut-off, in bounded batches.",
            discussion: "Example: push-worker dead purge --older-than 30d"
        )

        @OptionGroup var database: DatabaseOptions
        @Option(
            name: .customLong("older-than"),
            help: ArgumentHelp("Age cut-off: 90s, 15m, 12h, 30d, 2w.", valueName: "age")
        )
        var olderThan: HumanDuration
        @Flag(help: "Print the result as JSON.") var json = false

        func run() async throws {
            let (age, json) = (self.olderThan, self.json)
            let purged = try await self.database.withQueue { queue, _, _ in
                try await queue.operations.purgeDeadLetters(olderThan: age.duration)
            }
            if json {
                printJSON(["purged": purged])
            } else {
                print(
                    "purged \(purged) dead letter\(purged == 1 ? "" : "s") older than \(HumanText.duration(Double(age.seconds)))"
                )
            }
        }
    }
}

/// `dead replay --json` output.
struct ReplayJSON: Encodable {
    struct Moved: Encodable {
        var id: Int64
        /// The id in push.jobs: the dead letter's own, or a new one when `renumbered` (null for a dry run).
        var queuedAs: Int64?
        var renumbered: Bool
        var apnsId: String
        var reason: String
    }

    var dryRun: Bool
    var moved: [Moved]
    var skippedConflicts: [Int64]
    var skippedInvalid: [[String: String]]

    init(_ result: ReplayResult) {
        self.skippedInvalid = result.skippedInvalid.map { ["id": String($0.id), "rule": $0.rule] }
        self.dryRun = result.dryRun
        self.moved = result.moved.map {
            Moved(
                id: $0.id,
                queuedAs: $0.queuedAs,
                renumbered: $0.renumbered,
                apnsId: $0.apnsID.uuidString.lowercased(),
                reason: $0.reason
            )
        }
        self.skippedConflicts = result.skippedConflicts
    }
}
