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

/// An activity waiting for the channel it asked for.
public struct ActivityChannelRequest: Sendable, Hashable {
    public var activity: Int64
    public var topic: String
    public var environment: String
    public var credential: String
    /// Apple's message-storage policy: 0 none, 1 the most recent message.
    public var storage: Int
}

/// The broadcast channel of an ended activity, due for deletion.
public struct ActivityChannel: Sendable, Hashable {
    public var activity: Int64
    public var topic: String
    public var channelID: String
    public var environment: String
    public var credential: String
}

extension JobQueue {
    /// Up to `limit` channels of ended activities whose dismissal passed, leased to this worker for `lease`.
    public func activityChannelsToDelete(limit: Int, lease: Duration) async throws -> [ActivityChannel] {
        let rows = try await self.client.query(
            ActivitiesSQL.channelsToDelete.query {
                $0.bind("lease_seconds", lease.seconds)
                $0.bind("limit", Int64(max(limit, 0)))
            },
            logger: self.logger
        )
        var channels: [ActivityChannel] = []
        for try await (id, topic, channel, environment, credential) in rows.decode(
            (Int64, String, String, String, String).self
        ) {
            channels.append(
                ActivityChannel(
                    activity: id,
                    topic: topic,
                    channelID: channel,
                    environment: environment,
                    credential: credential
                )
            )
        }
        return channels
    }

    /// Up to `limit` activities that asked for a channel and have none, leased to this worker for `lease`.
    public func activityChannelsToCreate(limit: Int, lease: Duration) async throws -> [ActivityChannelRequest] {
        let rows = try await self.client.query(
            ActivitiesSQL.channelsToCreate.query {
                $0.bind("lease_seconds", lease.seconds)
                $0.bind("limit", Int64(max(limit, 0)))
            },
            logger: self.logger
        )
        var requests: [ActivityChannelRequest] = []
        for try await (id, topic, environment, credential, storage) in rows.decode(
            (Int64, String, String, String, Int32).self
        ) {
            requests.append(
                ActivityChannelRequest(
                    activity: id,
                    topic: topic,
                    environment: environment,
                    credential: credential,
                    storage: Int(storage)
                )
            )
        }
        return requests
    }

    /// Records activity `id`'s new channel; `false` when another worker recorded one first (delete this one).
    public func activityChannelCreated(_ id: Int64, channelID: String) async throws -> Bool {
        let rows = try await self.client.query(
            ActivitiesSQL.channelCreated.query {
                $0.bind("channel_id", channelID)
                $0.bind("id", id)
            },
            logger: self.logger
        )
        for try await _ in rows.decode(Int64.self) { return true }
        return false
    }

    /// APNs refused to create activity `id`'s channel (`error`): it asks for none any more.
    public func activityChannelRefused(_ id: Int64, error: String) async throws {
        try await self.client.query(
            ActivitiesSQL.channelRefused.query {
                $0.bind("id", id)
                $0.bind("error", error)
            },
            logger: self.logger
        )
    }

    /// Records the channels of `activities` deleted.
    public func activityChannelsDeleted(_ activities: [Int64]) async throws {
        guard !activities.isEmpty else { return }
        try await self.client.query(
            ActivitiesSQL.channelsDeleted.query { $0.bind("ids", activities) },
            logger: self.logger
        )
    }
}

extension QueueOperations {
    /// Channels of activities in use (not deleted), by environment: Apple allows an app 10,000 per environment.
    public func activityChannelCounts() async throws -> [String: Int] {
        let rows = try await self.client.query(ActivitiesSQL.channelCounts.query(), logger: self.logger)
        var counts: [String: Int] = [:]
        for try await (environment, count) in rows.decode((String, Int64).self) { counts[environment] = Int(count) }
        return counts
    }

    /// Activities of `topic` (when given), the newest first.
    public func activities(topic: String? = nil, limit: Int = 100) async throws -> [Activity] {
        let rows = try await self.client.query(
            ActivitiesSQL.list.query {
                $0.bind("topic", topic)
                $0.bind("limit", Int64(max(limit, 0)))
            },
            logger: self.logger
        )
        var activities: [Activity] = []
        for try await row in rows { activities.append(try Self.decodeActivity(row)) }
        return activities
    }

    /// One activity, by its row id or by topic and activity id, with its budget this hour.
    public func activity(id: Int64? = nil, topic: String? = nil, activityID: String? = nil) async throws -> Activity? {
        let rows = try await self.client.query(
            ActivitiesSQL.show.query {
                $0.bind("id", id)
                $0.bind("topic", topic)
                $0.bind("activity_id", activityID)
            },
            logger: self.logger
        )
        for try await row in rows { return try Self.decodeActivity(row) }
        return nil
    }

    /// The events of an activity in the order they were enqueued.
    public func activityEvents(topic: String, activityID: String) async throws -> [ActivityEventRow] {
        let rows = try await self.client.query(
            ActivitiesSQL.events.query {
                $0.bind("topic", topic)
                $0.bind("activity_id", activityID)
            },
            logger: self.logger
        )
        var events: [ActivityEventRow] = []
        for try await row in rows.decode(
            (Int64, String?, String?, String, String?, Int16?, Date, Int64, Int32?).self
        ) {
            events.append(
                ActivityEventRow(
                    jobID: row.0,
                    event: row.1,
                    timestamp: row.2,
                    state: row.3,
                    reason: row.4,
                    priority: row.5.map(Int.init),
                    createdAt: row.6,
                    delivered: Int(row.7),
                    children: Int(row.8 ?? 0)
                )
            )
        }
        return events
    }

    /// An activity from a row of `list` or `show` (the same columns, by position).
    static func decodeActivity(_ row: PostgresRow) throws -> Activity {
        var c = RowCursor(row)
        return Activity(
            id: try c.next(Int64.self),
            topic: try c.next(String.self),
            activityID: try c.next(String.self),
            recipient: try c.next(String?.self),
            channelID: try c.next(String?.self),
            state: try c.next(String.self),
            lastEvent: try c.next(String?.self),
            lastTimestamp: try c.next(Int64?.self),
            lastRoutedAt: try c.next(Date?.self),
            endedAt: try c.next(Date?.self),
            dismissalAt: try c.next(Date?.self),
            createdAt: try c.next(Date.self),
            budgetUsed: Int(try c.next(Int32.self)),
            budgetPerHour: Int(try c.next(Int32.self))
        )
    }

    /// Enqueues an end for activity `id` (the content-state given, or its last routed event's), dismissed
    /// `dismissAfter` from now; `nil` when the activity is already ended.
    public func endActivity(id: Int64, contentState: String?, dismissAfter: Duration) async throws -> Int64? {
        let rows = try await self.client.query(
            ActivitiesSQL.enqueueEnd.query {
                $0.bind("dismiss_after_seconds", dismissAfter.components.seconds)
                $0.bind("content_state", contentState)
                $0.bind("id", id)
            },
            logger: self.logger
        )
        for try await job in rows.decode(Int64.self) { return job }
        return nil
    }

    /// Sets `topic`'s hourly budget of priority-10 updates per activity; returns it.
    public func setActivityBudget(topic: String, perHour: Int) async throws -> Int {
        let rows = try await self.client.query(
            ActivitiesSQL.setBudget.query {
                $0.bind("topic", topic)
                $0.bind("per_hour", Int32(clamping: perHour))
            },
            logger: self.logger
        )
        for try await value in rows.decode(Int32.self) { return Int(value) }
        return perHour
    }
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
