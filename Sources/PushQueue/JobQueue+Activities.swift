public import Foundation
import PostgresNIO
public import PushCore

/// What routing a claim's Live Activity events did.
public struct ActivityRouteResult: Sendable, Hashable {
    /// Events routed, with their children's ids.
    public var routed: [Int64: [Int64]] = [:]
    /// Events superseded, with the reason (`StaleTimestamp`, `ActivityEnded`).
    public var superseded: [Int64: String] = [:]
    /// Events whose activity has a request in flight: to be claimed again shortly, uncounted.
    public var waiting: [Int64] = []
    /// Events that cannot be sent, with a reason and a sentence naming the fix (dead letters).
    public var refused: [Int64: ActivityRefusal] = [:]
    /// Routed priority-10 updates sent at priority 5 past their topic's budget, by topic.
    public var demoted: [String: Int] = [:]
}

/// Why an event cannot be sent.
public struct ActivityRefusal: Sendable, Hashable {
    public var reason: String
    public var sentence: String
}

/// One row of `push.activities`, as operators see it.
public struct Activity: Sendable, Hashable, Codable {
    public var id: Int64
    public var topic: String
    public var activityID: String
    public var recipient: String?
    public var channelID: String?
    /// `requested`, `started` or `ended`.
    public var state: String
    public var lastEvent: String?
    public var lastTimestamp: Int64?
    public var lastRoutedAt: Date?
    public var endedAt: Date?
    public var dismissalAt: Date?
    public var createdAt: Date
    /// Priority-10 updates routed this hour, and the topic's budget.
    public var budgetUsed: Int
    public var budgetPerHour: Int
}

/// One event job of an activity, in enqueue order.
public struct ActivityEventRow: Sendable, Hashable, Codable {
    public var jobID: Int64
    public var event: String?
    public var timestamp: String?
    public var state: String
    public var reason: String?
    public var priority: Int?
    public var createdAt: Date
    /// Once routed: children delivered, of children.
    public var delivered: Int
    public var children: Int
}

extension JobQueue {
    /// Routes Live Activity events this worker claimed (``PushJob/activityID``) by ``ActivityRouting``, under
    /// their activities' row locks, in one transaction: each routed event becomes child jobs to its targets
    /// and ends `fanned_out`; stale and post-end events end superseded; events of an activity whose previous
    /// request may be in flight are returned as waiting. Fenced like an outcome: a parent cancelled or taken
    /// back meanwhile is left alone. An activity no producer inserted is created by its first event.
    public func routeActivities(_ jobs: [PushJob], workerID: String) async throws -> ActivityRouteResult {
        let jobs = jobs.filter { $0.activityID != nil }
        guard !jobs.isEmpty else { return ActivityRouteResult() }
        let logger = self.logger
        let topics = jobs.map(\.topic)
        let activityIDs = jobs.map { $0.activityID ?? "" }
        return try await self.client.withTransaction(logger: logger) { connection in
            var result = ActivityRouteResult()
            try await connection.query(JobsSQL.markInternalInsert.query(), logger: logger)
            try await connection.query(
                ActivitiesSQL.ensure.query {
                    $0.bind("topics", topics)
                    $0.bind("activity_ids", activityIDs)
                },
                logger: logger
            )
            struct Locked {
                var id: Int64
                var state: String
                var lastTimestamp: Int64?
                var budgetUsed: Int
                var perHour: Int
                var children: [Int64]
                var lastEvent: String?
                var waitingEnd: Int64?
                var waitingStart: Int64?
                var channelPending: Bool
            }
            var locked: [String: Locked] = [:]
            let rows = try await connection.query(
                ActivitiesSQL.lock.query {
                    $0.bind("topics", topics)
                    $0.bind("activity_ids", activityIDs)
                },
                logger: logger
            )
            for try await row in rows.decode(
                (Int64, String, String, String, Int64?, Int32, Int32, [Int64], String?, Bool).self
            ) {
                locked[Self.activityKey(row.1, row.2)] = Locked(
                    id: row.0,
                    state: row.3,
                    lastTimestamp: row.4,
                    budgetUsed: Int(row.5),
                    perHour: Int(row.6),
                    children: row.7,
                    lastEvent: row.8,
                    waitingEnd: nil,
                    waitingStart: nil,
                    channelPending: row.9
                )
            }
            // Ends still in the queue, read after the lock. One whose timestamp cannot be read is refused when
            // claimed: nothing to hold back for it.
            let ends = try await connection.query(
                ActivitiesSQL.waitingEnds.query {
                    $0.bind("activity_rows", locked.values.map(\.id))
                    $0.bind("held_ids", jobs.map(\.id))
                },
                logger: logger
            )
            var waitingEnds: [Int64: Int64] = [:]
            var waitingStarts: [Int64: Int64] = [:]
            for try await (activity, _, text, start) in ends.decode((Int64, Int64?, String?, Int64?).self) {
                if let text, let seconds = Double(text), seconds.isFinite, seconds == seconds.rounded(),
                    seconds >= 0, seconds < 1e11
                {
                    waitingEnds[activity] = Int64(seconds)
                }
                waitingStarts[activity] = start
            }
            for (key, activity) in locked {
                locked[key]?.waitingEnd = waitingEnds[activity.id]
                locked[key]?.waitingStart = waitingStarts[activity.id]
            }
            let children = locked.values.flatMap(\.children)
            var lockedPending: Set<Int64> = []
            var unfinished: Set<Int64> = []
            if !children.isEmpty {
                for try await id in try await connection.query(
                    ActivitiesSQL.lockUnsentChildren.query { $0.bind("ids", children) },
                    logger: logger
                ).decode(Int64.self) { lockedPending.insert(id) }
                for try await id in try await connection.query(
                    ActivitiesSQL.unfinishedChildren.query { $0.bind("ids", children) },
                    logger: logger
                ).decode(Int64.self) { unfinished.insert(id) }
            }
            // Each activity's events, read from the payloads; an unreadable one is refused.
            var events: [String: [ActivityEvent]] = [:]
            var byID: [Int64: PushJob] = [:]
            for job in jobs {
                byID[job.id] = job
                switch ActivityEvent.read(jobID: job.id, payload: job.payload, priority: job.priority) {
                case .success(let event):
                    events[Self.activityKey(job.topic, job.activityID ?? ""), default: []].append(event)
                case .failure(let error):
                    result.refused[job.id] = ActivityRefusal(
                        reason: "ActivityEventInvalid",
                        sentence:
                            "this Live Activity event cannot be routed: \(error.sentence); fix the payload and replay it."
                    )
                }
            }
            var superseded: [(id: Int64, attempt: Int16, reason: String, by: Int64?)] = []
            var stale: [(id: Int64, by: Int64)] = []
            var winners: [(id: Int64, attempt: Int16, activity: Int64, demoted: Bool, timestamp: Int64)] = []
            var activityRows:
                [(id: Int64, winner: Int64, state: String, ts: Int64, event: String, used: Int32, dismissal: Int64?)] =
                    []
            for (key, activityEvents) in events.sorted(by: { $0.key < $1.key }) {
                guard let activity = locked[key], let state = ActivityRecord.State(rawValue: activity.state) else {
                    continue
                }
                let record = ActivityRecord(
                    state: state,
                    lastTimestamp: activity.lastTimestamp,
                    // In flight: a child running or held by a claim; and a start's or an end's child not yet
                    // sent (only an update's may be replaced by a newer event).
                    busy: !Set(activity.children).intersection(unfinished)
                        .subtracting(activity.lastEvent == "update" ? lockedPending : []).isEmpty,
                    unsentChildren: activity.lastEvent == "update"
                        ? activity.children.filter { lockedPending.contains($0) } : [],
                    waitingEnd: activity.waitingEnd,
                    waitingStart: activity.waitingStart,
                    channelPending: activity.channelPending,
                    budgetUsed: activity.budgetUsed,
                    budgetPerHour: activity.perHour
                )
                let decision = ActivityRouting.decide(record, events: activityEvents)
                for (id, verdict) in decision.verdicts.sorted(by: { $0.key < $1.key }) {
                    let attempt = Int16(clamping: byID[id]?.attempts ?? 0)
                    switch verdict {
                    case .superseded(let reason, let by):
                        superseded.append((id, attempt, reason, by))
                    case .wait:
                        result.waiting.append(id)
                    case .route(let demoted):
                        winners.append((id, attempt, activity.id, demoted, decision.payloadTimestamp ?? -1))
                        if demoted, let topic = byID[id]?.topic { result.demoted[topic, default: 0] += 1 }
                    }
                }
                if let routed = decision.routed {
                    stale += decision.supersededChildren.map { ($0, routed.jobID) }
                    activityRows.append(
                        (
                            activity.id, routed.jobID, decision.state.rawValue, routed.timestamp, routed.kind.rawValue,
                            Int32(clamping: decision.budgetUsed), routed.dismissalDate
                        )
                    )
                }
            }
            let routedRows = try await connection.query(
                ActivitiesSQL.route.query {
                    $0.bind("superseded_ids", superseded.map(\.id))
                    $0.bind("superseded_attempts", superseded.map(\.attempt))
                    $0.bind("superseded_reasons", superseded.map(\.reason))
                    // 0: superseded by no event of this claim (an event routed before it).
                    $0.bind("superseded_by", superseded.map { $0.by ?? 0 })
                    $0.bind("worker_id", workerID)
                    $0.bind("stale_children", stale.map(\.id))
                    $0.bind("stale_by", stale.map(\.by))
                    $0.bind("winner_ids", winners.map(\.id))
                    $0.bind("winner_attempts", winners.map(\.attempt))
                    $0.bind("winner_activities", winners.map(\.activity))
                    $0.bind("winner_demoted", winners.map(\.demoted))
                    $0.bind("winner_timestamps", winners.map(\.timestamp))
                    $0.bind("activity_rows", activityRows.map(\.id))
                    $0.bind("activity_winners", activityRows.map(\.winner))
                    $0.bind("activity_states", activityRows.map(\.state))
                    $0.bind("activity_timestamps", activityRows.map(\.ts))
                    $0.bind("activity_events", activityRows.map(\.event))
                    $0.bind("activity_budget_used", activityRows.map(\.used))
                    $0.bind("activity_dismissals", activityRows.map { $0.dismissal ?? -1 })
                },
                logger: logger
            )
            var noTarget: Set<Int64> = []
            var supersededNow: Set<Int64> = []
            for try await (id, children, what) in routedRows.decode((Int64, [Int64], String).self) {
                switch what {
                case "routed": result.routed[id] = children
                case "no_target": noTarget.insert(id)
                case "superseded": supersededNow.insert(id)
                default: break
                }
            }
            for entry in superseded {
                if supersededNow.contains(entry.id) {
                    result.superseded[entry.id] = entry.reason
                } else if entry.by != nil {
                    // Its winner was not routed (its fence failed, or it had nowhere to go): judged again.
                    result.waiting.append(entry.id)
                }
            }
            // A winner whose fence failed (cancelled, taken back) is not this worker's any more: left alone.
            for winner in winners where result.routed[winner.id] == nil {
                guard let job = byID[winner.id] else { continue }
                result.demoted[job.topic]? -= winner.demoted ? 1 : 0
                guard noTarget.contains(winner.id) else { continue }
                result.refused[winner.id] = ActivityRefusal(
                    reason: "NoDevice",
                    sentence:
                        "Live Activity '\(job.activityID ?? "")' of topic '\(job.topic)' has nothing to send this event to: a start goes to its recipient's live push_to_start tokens, an update or an end to its channel_id or its live tokens of kind activity in push.devices; register them (or set the activity's recipient or channel_id), then replay this job."
                )
            }
            result.demoted = result.demoted.filter { $0.value > 0 }
            return result
        }
    }

    private static func activityKey(_ topic: String, _ activityID: String) -> String { topic + "\u{0}" + activityID }
}

/// The statements of `Statements/activities.sql`, with their binds in order.
enum ActivitiesSQL: StatementFile {
    static let file = "activities"

    static let ensure = named("ensure", "topics", "activity_ids")
    static let lock = named("lock", "topics", "activity_ids")
    static let waitingEnds = named("waiting_ends", "activity_rows", "held_ids")
    static let lockUnsentChildren = named("lock_unsent_children", "ids")
    static let unfinishedChildren = named("unfinished_children", "ids")
    static let route = named(
        "route",
        "superseded_ids",
        "superseded_attempts",
        "superseded_reasons",
        "superseded_by",
        "worker_id",
        "stale_children",
        "stale_by",
        "winner_ids",
        "winner_attempts",
        "winner_activities",
        "winner_demoted",
        "winner_timestamps",
        "activity_rows",
        "activity_winners",
        "activity_states",
        "activity_timestamps",
        "activity_events",
        "activity_budget_used",
        "activity_dismissals"
    )
    static let list = named("list", "topic", "limit")
    static let show = named("show", "id", "topic", "activity_id")
    static let events = named("events", "topic", "activity_id")
    static let setBudget = named("set_budget", "topic", "per_hour")
    static let enqueueEnd = named("enqueue_end", "dismiss_after_seconds", "content_state", "id")
    static let channelsToDelete = named("channels_to_delete", "lease_seconds", "limit")
    static let channelsDeleted = named("channels_deleted", "ids")
    static let channelCounts = named("channel_counts")
    static let channelsToCreate = named("channels_to_create", "lease_seconds", "limit")
    static let channelCreated = named("channel_created", "channel_id", "id")
    static let channelRefused = named("channel_refused", "id", "error")

    static let all = [
        ensure, lock, waitingEnds, lockUnsentChildren, unfinishedChildren, route, list, show, events, setBudget,
        enqueueEnd, channelsToDelete, channelsDeleted, channelCounts, channelsToCreate, channelCreated,
        channelRefused,
    ]
}
