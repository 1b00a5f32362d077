import ArgumentParser
import Foundation
import PushQueue

struct ActivitiesCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "activities",
        abstract:
            "Live Activities (push.activities): their state, their events in order, ending one, the update budget.",
        discussion: """
            A producer inserts an activity (topic, activity_id, and the recipient whose push-to-start tokens \
            start it, or a broadcast channel_id) and enqueues its events as jobs naming activity_id (push_type \
            liveactivity; aps.event start, update or end; aps.timestamp). The worker routes each under the \
            activity's lock: a start to the recipient's push-to-start tokens, an update or end to the activity's \
            token (push.devices kind activity) or channel; stale updates end superseded StaleTimestamp, \
            everything after the end ActivityEnded, and priority-10 updates past the topic's hourly budget go at \
            priority 5 with trap MS015.
              push-worker activities                                   # the newest activities
              push-worker activities show 17                           # one activity's events in order
              push-worker activities show order-42 --topic com.example.app
              push-worker activities end 17                            # end it now, dismissed in 15 minutes
              push-worker activities end order-42 --topic com.example.app
              push-worker activities budget --topic com.example.app --per-hour 60
            """,
        subcommands: [List.self, Show.self, End.self, Budget.self],
        defaultSubcommand: List.self
    )

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "list",
            abstract: "List activities, the newest first, with their state and last event."
        )
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Only this topic's (the app's bundle id).") var topic: String?
        @Option(help: "At most this many rows.") var limit = 50
        @Flag(help: "Print the result as JSON.") var json = false

        func validate() throws {
            guard (1...10_000).contains(self.limit) else {
                throw ValidationError("--limit must be 1 to 10000, not \(self.limit)")
            }
        }

        func run() async throws {
            let activities = try await self.database.withQueue { queue, _, _ in
                try await queue.operations.activities(topic: self.topic, limit: self.limit)
            }
            if self.json {
                printJSON(activities)
                return
            }
            print("activities \(activities.count)\(self.topic.map { " of topic \($0)" } ?? "")")
            guard !activities.isEmpty else { return }
            printTable(
                ["ID", "TOPIC", "ACTIVITY", "TARGET", "STATE", "LAST EVENT", "TIMESTAMP", "ROUTED"],
                activities.map { activity in
                    [
                        String(activity.id), truncate(activity.topic, 40), truncate(activity.activityID, 32),
                        ActivitiesCommand.target(activity), activity.state, activity.lastEvent ?? "-",
                        activity.lastTimestamp.map(String.init) ?? "-", formatDate(activity.lastRoutedAt),
                    ]
                }
            )
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "show",
            abstract: "One activity: its state, budget, and every event in the order enqueued, with what became of it."
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The activity's id in push.activities, or its activity_id with --topic.") var activity: String
        @Option(help: "The topic, when the activity is named by its activity_id.") var topic: String?
        @Flag(help: "Print the result as JSON.") var json = false

        func run() async throws {
            let id = self.topic == nil ? Int64(self.activity) : nil
            if self.topic == nil && id == nil {
                throw ValidationError(
                    "\(self.activity) is not an activity's id: give the number `push-worker activities` shows, or --topic with the activity_id"
                )
            }
            let (topic, name) = (self.topic, self.activity)
            let (found, events) = try await self.database.withQueue {
                queue,
                _,
                _ -> (Activity?, [ActivityEventRow]) in
                let found = try await queue.operations.activity(id: id, topic: topic, activityID: name)
                guard let found else { return (nil, []) }
                let events = try await queue.operations.activityEvents(topic: found.topic, activityID: found.activityID)
                return (found, events)
            }
            guard let found else {
                throw CLIError(
                    "no activity \(self.activity)\(self.topic.map { " of topic \($0)" } ?? ""): `push-worker activities` lists them"
                )
            }
            if self.json {
                printJSON(["activity": AnyEncodable(found), "events": AnyEncodable(events)])
                return
            }
            print("activity \(found.id)  \(found.activityID)  \(found.state)")
            print("  topic       \(found.topic)")
            print("  target      \(ActivitiesCommand.target(found))")
            print(
                "  last event  \(found.lastEvent ?? "-")  timestamp \(found.lastTimestamp.map(String.init) ?? "-")  routed \(formatDate(found.lastRoutedAt))"
            )
            if let ended = found.endedAt {
                print("  ended       \(formatDate(ended))  dismissed by \(formatDate(found.dismissalAt))")
            }
            print(
                "  budget      \(found.budgetUsed) of \(found.budgetPerHour) priority-10 updates this hour (past it: priority 5, MS015)"
            )
            print("events \(events.count)")
            guard !events.isEmpty else { return }
            printTable(
                ["JOB", "EVENT", "TIMESTAMP", "PRIORITY", "STATE", "WHY / SENT"],
                events.map(ActivitiesCommand.row)
            )
        }
    }

    struct End: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "end",
            abstract:
                "End an activity now: an end event with its last content-state (or the one given), newer than every event sent."
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The activity's id in push.activities, or its activity_id with --topic.") var activity: String
        @Option(help: "The topic, when the activity is named by its activity_id.") var topic: String?
        @Option(
            name: .customLong("content-state"),
            help: "The final content-state, as JSON (default: the last event's, so the app can decode it)."
        )
        var contentState: String?
        @Option(
            name: .customLong("dismiss-after"),
            help: "Seconds the ended activity stays on the lock screen (0 to 14400; iOS keeps it 4 hours at most)."
        )
        var dismissAfter = 900

        func validate() throws {
            guard (0...14_400).contains(self.dismissAfter) else {
                throw ValidationError("--dismiss-after must be 0 to 14400 seconds, not \(self.dismissAfter)")
            }
            if let state = self.contentState {
                let object = try? JSONSerialization.jsonObject(with: Data(state.utf8))
                guard object is [String: Any] else {
                    throw ValidationError(
                        "--content-state must be a JSON object, as the app's ContentState decodes it: \(truncate(state, 60))"
                    )
                }
            }
        }

        func run() async throws {
            let id = self.topic == nil ? Int64(self.activity) : nil
            if self.topic == nil && id == nil {
                throw ValidationError(
                    "\(self.activity) is not an activity's id: give the number `push-worker activities` shows, or --topic with the activity_id"
                )
            }
            let (topic, name, state, dismiss) = (self.topic, self.activity, self.contentState, self.dismissAfter)
            let (found, job) = try await self.database.withQueue { queue, _, _ -> (Activity?, Int64?) in
                guard let found = try await queue.operations.activity(id: id, topic: topic, activityID: name) else {
                    return (nil, nil)
                }
                let job = try await queue.operations.endActivity(
                    id: found.id,
                    contentState: state,
                    dismissAfter: .seconds(dismiss)
                )
                return (found, job)
            }
            guard let found else {
                throw CLIError(
                    "no activity \(self.activity)\(self.topic.map { " of topic \($0)" } ?? ""): `push-worker activities` lists them"
                )
            }
            guard let job else {
                throw CLIError(
                    "activity \(found.id) (\(found.activityID)) is already ended: `push-worker activities show \(found.id)`"
                )
            }
            print(
                "activity \(found.id) (\(found.activityID)): end enqueued as job \(job); it goes before anything newer"
            )
        }
    }

    struct Budget: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "budget",
            abstract: "Set a topic's hourly budget of priority-10 updates per activity (default 12).",
            discussion: """
                Apple throttles frequent priority-10 Live Activity updates unless the app declares \
                NSSupportsLiveActivitiesFrequentUpdates; past the budget the worker sends updates at priority 5 \
                with trap MS015 instead (push_activity_updates_demoted_total counts them). Raise it for apps that \
                declare frequent updates.
                """
        )
        @OptionGroup var database: DatabaseOptions
        @Option(help: "The topic (the app's bundle id).") var topic: String
        @Option(
            name: .customLong("per-hour"),
            help: "Priority-10 updates an activity may send in an hour (1 to 10000)."
        )
        var perHour: Int

        func validate() throws {
            guard (1...10_000).contains(self.perHour) else {
                throw ValidationError("--per-hour must be 1 to 10000, not \(self.perHour)")
            }
        }

        func run() async throws {
            let set = try await self.database.withQueue { queue, _, _ in
                try await queue.operations.setActivityBudget(topic: self.topic, perHour: self.perHour)
            }
            print("topic \(self.topic): \(set) priority-10 updates an hour per activity")
        }
    }

    /// One event's row of `activities show`.
    static func row(_ event: ActivityEventRow) -> [String] {
        let outcome: String =
            event.state == "fanned_out"
            ? "sent: \(event.delivered) of \(event.children) delivered" : (event.reason ?? "-")
        let priority: String = event.priority.map { String($0) } ?? "default"
        return [String(event.jobID), event.event ?? "?", event.timestamp ?? "?", priority, event.state, outcome]
    }

    static func target(_ activity: Activity) -> String {
        if let channel = activity.channelID { return "channel \(truncate(channel, 24))" }
        return activity.recipient.map { "recipient \(truncate($0, 24))" } ?? "its tokens"
    }
}

/// A value of any Encodable type, for JSON objects of mixed values.
struct AnyEncodable: Encodable {
    let value: any Encodable
    init(_ value: any Encodable) { self.value = value }
    func encode(to encoder: any Encoder) throws { try self.value.encode(to: encoder) }
}
