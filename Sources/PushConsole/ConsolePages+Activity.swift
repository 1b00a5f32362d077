import Foundation
import Hummingbird
import PushCore
import PushQueue

extension ConsolePages {
    /// One Live Activity: its state, target, budget and channel, and every event in the order enqueued with
    /// what became of it (sent and delivered, or why not), each linking to its job.
    func activity(_ request: Request, id: Int64?) async throws -> Response {
        try await self.page(request) { frame in
            _ = try self.requireReader(frame)
            guard let id else { throw ConsoleRefusal(status: .badRequest, message: "An activity's id is a number.") }
            guard let activity = try await self.queue.operations.activity(id: id) else {
                throw ConsoleRefusal(status: .notFound, message: "No activity \(id) in push.activities.")
            }
            let events = try await self.queue.operations.activityEvents(
                topic: activity.topic,
                activityID: activity.activityID
            )
            var facts: [(String, String)] = [
                ("Topic", activity.topic), ("Activity", activity.activityID), ("State", activity.state),
                (
                    "Target",
                    activity.channelID.map { "channel \($0)" } ?? activity.recipient.map { "recipient \($0)" }
                        ?? "its tokens of kind activity"
                ),
                (
                    "Last event",
                    "\(activity.lastEvent ?? "-") at timestamp \(activity.lastTimestamp.map(String.init) ?? "-")"
                ),
                (
                    "Budget",
                    "\(activity.budgetUsed) of \(activity.budgetPerHour) priority-10 updates this hour (past it: priority 5, MS015)"
                ),
            ]
            if let ended = activity.endedAt {
                facts.append(("Ended", timestamp(ended)))
                facts.append(("Dismissed by", activity.dismissalAt.map(timestamp) ?? "-"))
            }
            let view = ActivityView(
                facts: facts.map { DetailView.Fact(name: $0.0, value: $0.1) },
                events: events.map { event in
                    ActivityView.Event(
                        job: String(event.jobID),
                        event: event.event ?? "?",
                        timestamp: event.timestamp ?? "?",
                        priority: event.priority.map { String($0) } ?? "default",
                        state: event.state,
                        outcome: event.state == "fanned_out"
                            ? "sent: \(event.delivered) of \(event.children) delivered" : (event.reason ?? "-")
                    )
                },
                hasEvents: !events.isEmpty
            )
            return self.render("activity", title: "Live Activity \(activity.activityID)", page: view, frame: frame)
        }
    }
}
