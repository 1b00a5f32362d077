import Foundation
import PostgresNIO
import PushCore
import PushQueueTesting
import Testing

@testable import PushQueue

/// Live Activities as rows (schema 19, CONTRACT 1e): events routed under the activity's lock to the right
/// kind of token, stale and post-end events superseded, one request in flight, the budget's demotion.
@Suite("Live Activities: events routed by kind, in order, and nothing after the end")
struct ActivitiesTests {
    static let pushToStart = String(repeating: "1a", count: 32)
    static let activityToken = String(repeating: "2b", count: 32)
    static let device = String(repeating: "3c", count: 32)

    static func register(_ db: TestDatabase, token: String, kind: String, activity: String? = nil) async throws {
        let activityID = activity.map { "'\($0)'" } ?? "NULL"
        try await db.execute(
            "INSERT INTO push.devices (recipient, topic, token, kind, activity_id) VALUES ('user:1', 'com.example.app', '\(token)', '\(kind)', \(activityID))"
        )
    }

    /// A job for `activity` carrying `event` at `ts`.
    static func event(
        _ db: TestDatabase,
        _ event: String,
        _ ts: Int,
        activity: String = "order-1",
        priority: Int? = nil
    ) async throws -> Int64 {
        try await db.int64(
            """
            INSERT INTO push.jobs (topic, activity_id, push_type, priority, payload)
            VALUES ('com.example.app', '\(unescaped: activity)', 'liveactivity', \(unescaped: priority.map(String.init) ?? "NULL"),
                    '{"aps":{"event":"\(unescaped: event)","timestamp":\(unescaped: String(ts)),"content-state":{}}}')
            RETURNING id
            """
        )
    }

    static func claimAndRoute(_ db: TestDatabase, worker: String = "w") async throws -> ActivityRouteResult {
        let claimed = try await db.queue.claim(limit: 100, workerID: worker, lease: .seconds(60))
        return try await db.queue.routeActivities(claimed.filter { $0.activityID != nil }, workerID: worker)
    }

    /// Children of `parent`: (token or channel, state, priority, trap ids).
    static func children(_ db: TestDatabase, of parent: Int64) async throws -> [(String, String, Int16?, [String])] {
        try await db.client.query(
            "SELECT coalesce(device_token, channel_id), state, priority, trap_ids FROM push.jobs WHERE parent_id = \(unescaped: String(parent)) ORDER BY id"
        ).decode((String, String, Int16?, [String]).self).collect()
    }

    @Test(
        "start to the recipient's push-to-start tokens only, update and end to the activity's token only; the activity's state and timestamp follow; after the end, ActivityEnded"
    )
    func routesByKind() async throws {
        try await TestPostgres.withDatabase { db in
            try await Self.register(db, token: Self.pushToStart, kind: "push_to_start")
            try await Self.register(db, token: Self.device, kind: "device")
            try await db.execute(
                "INSERT INTO push.activities (topic, activity_id, recipient) VALUES ('com.example.app', 'order-1', 'user:1')"
            )
            let start = try await Self.event(db, "start", 100)
            var result = try await Self.claimAndRoute(db)
            #expect(result.routed.keys.sorted() == [start])
            #expect(try await Self.children(db, of: start).map(\.0) == [Self.pushToStart], "push-to-start only")
            // The app registers the activity's own token; the start's child is sent (here: delivered by hand).
            try await Self.register(db, token: Self.activityToken, kind: "activity", activity: "order-1")
            try await db.execute("UPDATE push.jobs SET state = 'delivered' WHERE parent_id = \(start)")
            let update = try await Self.event(db, "update", 110)
            result = try await Self.claimAndRoute(db)
            #expect(result.routed.keys.sorted() == [update])
            #expect(
                try await Self.children(db, of: update).map(\.0) == [Self.activityToken],
                "the activity's token only"
            )
            try await db.execute("UPDATE push.jobs SET state = 'delivered' WHERE parent_id = \(update)")
            let stale = try await Self.event(db, "update", 105)
            let end = try await Self.event(db, "end", 120)
            result = try await Self.claimAndRoute(db)
            #expect(result.superseded == [stale: "StaleTimestamp"] && result.routed.keys.sorted() == [end])
            let row = try await db.client.query(
                "SELECT state, last_timestamp, last_event, dismissal_at > now() FROM push.activities WHERE activity_id = 'order-1'"
            ).decode((String, Int64, String, Bool).self).collect()
            #expect(row.first?.0 == "ended" && row.first?.1 == 120 && row.first?.2 == "end" && row.first?.3 == true)
            try await db.execute("UPDATE push.jobs SET state = 'delivered' WHERE parent_id = \(end)")
            let late = try await Self.event(db, "update", 130)
            result = try await Self.claimAndRoute(db)
            #expect(result.superseded == [late: "ActivityEnded"] && result.routed.isEmpty)
            let parent = try await db.client.query(
                "SELECT state, reason, attempts FROM push.jobs WHERE id = \(unescaped: String(late))"
            ).decode((String, String, Int16).self).collect()
            #expect(parent.first?.0 == "superseded" && parent.first?.1 == "ActivityEnded" && parent.first?.2 == 0)
        }
    }

    @Test(
        "the previous event's request in flight (its child running): newer events wait; once the child is only pending (a retry), the newer event is routed and supersedes it"
    )
    func oneRequestInFlight() async throws {
        try await TestPostgres.withDatabase { db in
            try await Self.register(db, token: Self.activityToken, kind: "activity", activity: "order-1")
            let first = try await Self.event(db, "update", 100)
            _ = try await Self.claimAndRoute(db)
            // Its child is claimed by another worker: running.
            let child = try await db.queue.claim(limit: 10, workerID: "v", lease: .seconds(60))
            #expect(child.count == 1 && child.first?.deviceToken == Self.activityToken)
            let second = try await Self.event(db, "update", 110)
            var result = try await Self.claimAndRoute(db)
            #expect(result.waiting == [second] && result.routed.isEmpty, "the first's request may be in flight")
            // The child's send ends in a retry: pending, not in flight. The waiting event (released by hand as
            // the worker's requeue would) is routed now, and supersedes the older unsent child.
            try await db.execute(
                "UPDATE push.jobs SET state = 'pending', locked_by = NULL, locked_until = NULL, run_at = now() + interval '1 minute' WHERE id = \(child[0].id)"
            )
            try await db.execute(
                "UPDATE push.jobs SET state = 'pending', attempts = attempts - 1, locked_by = NULL, locked_until = NULL WHERE id = \(second)"
            )
            result = try await Self.claimAndRoute(db)
            #expect(result.routed.keys.sorted() == [second])
            let old = try await db.client.query(
                "SELECT state, reason, superseded_by FROM push.jobs WHERE id = \(unescaped: String(child[0].id))"
            ).decode((String, String, Int64).self).collect()
            #expect(old.first?.0 == "superseded" && old.first?.1 == "StaleTimestamp" && old.first?.2 == second)
            _ = first
        }
    }

    @Test(
        "a claim holding the previous event's pending child at its lock: the routing does not wait for it (SKIP LOCKED) and takes it for in flight"
    )
    func childHeldByAClaim() async throws {
        try await TestPostgres.withDatabase { db in
            try await Self.register(db, token: Self.activityToken, kind: "activity", activity: "order-1")
            _ = try await Self.event(db, "update", 100)
            let routed = try await Self.claimAndRoute(db)
            let childID = try #require(routed.routed.values.first?.first)
            let second = try await Self.event(db, "update", 110)
            // A session holds the child's row as a claim would, between its read and its update.
            let holder = try await FleetInterleavingTests.session(db, applicationName: "holder")
            try await holder.query("BEGIN", logger: db.logger)
            try await holder.query(
                "SELECT id FROM push.jobs WHERE id = \(childID) FOR UPDATE",
                logger: db.logger
            )
            let result = try await Self.claimAndRoute(db)
            #expect(result.waiting == [second], "held by another: possibly in flight")
            // The routing did not queue behind the holder: nothing waits on a lock now.
            #expect(
                try await db.int64(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
                ) == 0
            )
            try await holder.query("ROLLBACK", logger: db.logger)
            try await holder.close()
        }
    }

    @Test(
        "an end claimed by another worker, not yet routed: newer updates claimed here wait for it (the device would drop an end older than what it shows); older ones go"
    )
    func endClaimedElsewhere() async throws {
        try await TestPostgres.withDatabase { db in
            try await Self.register(db, token: Self.activityToken, kind: "activity", activity: "order-1")
            let end = try await Self.event(db, "end", 200)
            let other = try await db.queue.claim(limit: 10, workerID: "v", lease: .seconds(60))
            #expect(other.map(\.id) == [end])
            let older = try await Self.event(db, "update", 150)
            let newer = try await Self.event(db, "update", 250)
            var result = try await Self.claimAndRoute(db)
            #expect(result.routed.keys.sorted() == [older] && result.waiting == [newer])
            // The end is routed by its worker once the older update's child is sent; then the newer one ends.
            try await db.execute("UPDATE push.jobs SET state = 'delivered' WHERE parent_id = \(older)")
            result = try await db.queue.routeActivities(other, workerID: "v")
            #expect(result.routed.keys.sorted() == [end])
            try await db.execute(
                "UPDATE push.jobs SET state = 'pending', attempts = attempts - 1, locked_by = NULL, locked_until = NULL WHERE id = \(newer)"
            )
            result = try await Self.claimAndRoute(db)
            #expect(result.superseded == [newer: "ActivityEnded"])
        }
    }

    @Test(
        "activities end: an end newer than every event sent, with the last event's content-state and the dismissal asked; none for an ended activity"
    )
    func endByOperator() async throws {
        try await TestPostgres.withDatabase { db in
            try await Self.register(db, token: Self.activityToken, kind: "activity", activity: "order-1")
            let future = Int(Date().timeIntervalSince1970) + 3600
            let update = try await db.int64(
                """
                INSERT INTO push.jobs (topic, activity_id, push_type, payload) VALUES ('com.example.app', 'order-1',
                'liveactivity', '{"aps":{"event":"update","timestamp":\(unescaped: String(future)),"content-state":{"eta":7}}}')
                RETURNING id
                """
            )
            _ = try await Self.claimAndRoute(db)
            let activity = try #require(
                try await db.queue.operations.activity(topic: "com.example.app", activityID: "order-1")
            )
            let end = try #require(
                try await db.queue.operations.endActivity(
                    id: activity.id,
                    contentState: nil,
                    dismissAfter: .seconds(60)
                )
            )
            let payload = try await db.client.query(
                "SELECT (payload->'aps'->>'timestamp')::bigint, payload->'aps'->'content-state'->>'eta', (payload->'aps'->>'dismissal-date')::bigint - extract(epoch FROM now())::bigint FROM push.jobs WHERE id = \(unescaped: String(end))"
            ).decode((Int64, String, Int64).self).collect()
            #expect(payload.first?.0 == Int64(future) + 1, "newer than the update sent")
            #expect(payload.first?.1 == "7" && (59...61).contains(payload.first?.2 ?? 0))
            try await db.execute("UPDATE push.jobs SET state = 'delivered' WHERE parent_id = \(update)")
            let result = try await Self.claimAndRoute(db)
            #expect(result.routed.keys.sorted() == [end])
            #expect(
                try await db.queue.operations.endActivity(id: activity.id, contentState: nil, dismissAfter: .zero)
                    == nil
            )
        }
    }

    @Test(
        "a start's child not yet sent (waiting for a retry) is in flight for the routing: the end waits for it, and then goes with a timestamp newer than the last event's if its own is not"
    )
    func startChildPending() async throws {
        try await TestPostgres.withDatabase { db in
            try await Self.register(db, token: Self.pushToStart, kind: "push_to_start")
            try await Self.register(db, token: Self.activityToken, kind: "activity", activity: "order-1")
            try await db.execute(
                "INSERT INTO push.activities (topic, activity_id, recipient) VALUES ('com.example.app', 'order-1', 'user:1')"
            )
            let start = try await Self.event(db, "start", 100)
            _ = try await Self.claimAndRoute(db)
            try await db.execute("UPDATE push.jobs SET run_at = now() + interval '1 minute' WHERE parent_id = \(start)")
            let update = try await Self.event(db, "update", 200)
            var result = try await Self.claimAndRoute(db)
            #expect(result.waiting == [update], "the start's child goes first")
            try await db.execute("UPDATE push.jobs SET state = 'delivered' WHERE parent_id = \(start)")
            try await db.execute(
                "UPDATE push.jobs SET state = 'pending', attempts = attempts - 1, locked_by = NULL, locked_until = NULL WHERE id = \(update)"
            )
            result = try await Self.claimAndRoute(db)
            #expect(result.routed.keys.sorted() == [update])
            try await db.execute("UPDATE push.jobs SET state = 'delivered' WHERE parent_id = \(update)")
            // An end committed late, with the update's own second: it still ends the activity, one second later.
            let end = try await Self.event(db, "end", 200)
            result = try await Self.claimAndRoute(db)
            #expect(result.routed.keys.sorted() == [end])
            let sent = try await db.int64(
                "SELECT (payload->'aps'->>'timestamp')::bigint FROM push.jobs WHERE parent_id = \(end)"
            )
            #expect(sent == 201)
            #expect(try await db.int64("SELECT count(*) FROM push.activities WHERE state = 'ended'") == 1)
        }
    }

    @Test(
        "a dead Live Activity request is not replayed (it would reach the device out of order): reported with the rule"
    )
    func deadChildNotReplayed() async throws {
        try await TestPostgres.withDatabase { db in
            try await Self.register(db, token: Self.activityToken, kind: "activity", activity: "order-1")
            let update = try await Self.event(db, "update", 100)
            let routed = try await Self.claimAndRoute(db)
            let child = try #require(routed.routed[update]?.first)
            let claimed = try await db.queue.claim(limit: 10, workerID: "v", lease: .seconds(60))
            #expect(claimed.map(\.id) == [child])
            _ = try await db.queue.writeOutcomes(
                [
                    JobOutcome(
                        jobID: child,
                        attempt: 1,
                        disposition: .dead(sentence: "test"),
                        attemptedAt: .now,
                        status: 503,
                        reason: "ServiceUnavailable"
                    )
                ],
                workerID: "v"
            )
            let result = try await db.queue.operations.replay(matching: .init(ids: [child]))
            #expect(result.moved.isEmpty)
            let rule = "live_activity_requests_are_not_replayed_enqueue_a_new_event"
            #expect(result.skippedInvalid.map(\.rule) == [rule])
        }
    }

    @Test(
        "channels of ended activities: due once the dismissal passed, leased to one worker at a time, counted until deleted"
    )
    func channelCleanup() async throws {
        try await TestPostgres.withDatabase { db in
            try await db.execute(
                """
                INSERT INTO push.activities (topic, activity_id, channel_id, state, dismissal_at) VALUES
                ('com.example.app', 'a', 'Y2hhbm5lbC1h', 'ended', now() - interval '1 minute'),
                ('com.example.app', 'b', 'Y2hhbm5lbC1i', 'ended', now() + interval '1 hour'),
                ('com.example.app', 'c', 'Y2hhbm5lbC1j', 'started', NULL),
                ('com.example.app', 'd', 'Y2hhbm5lbC1j', 'ended', now() - interval '1 minute')
                """
            )
            // An ended, dismissed activity whose end is still to go out (a retry): its channel stays.
            let pendingEnd = try await db.int64(
                "INSERT INTO push.jobs (topic, channel_id, push_type, payload) VALUES ('com.example.app', 'Y2hhbm5lbC1l', 'liveactivity', '{\"aps\":{\"event\":\"end\",\"timestamp\":1}}') RETURNING id"
            )
            try await db.execute(
                "INSERT INTO push.activities (topic, activity_id, channel_id, state, dismissal_at, children) VALUES ('com.example.app', 'e', 'Y2hhbm5lbC1l', 'ended', now() - interval '1 minute', ARRAY[\(pendingEnd)]::bigint[])"
            )
            #expect(try await db.queue.operations.activityChannelCounts() == ["production": 4], "channels, not rows")
            let due = try await db.queue.activityChannelsToDelete(limit: 10, lease: .seconds(60))
            // Not b (not dismissed yet), c's (c has not ended, d shares it), nor e's (its end not sent).
            #expect(due.map(\.channelID) == ["Y2hhbm5lbC1h"], "only the one dismissed, free and sent")
            #expect(
                try await db.queue.activityChannelsToDelete(limit: 10, lease: .seconds(60)).isEmpty,
                "leased: another worker does not take it"
            )
            try await db.queue.activityChannelsDeleted(due.map(\.activity))
            #expect(try await db.queue.operations.activityChannelCounts() == ["production": 3])
        }
    }

    @Test(
        "budget: 40 priority-10 updates in an hour with a budget of 12: 12 at priority 10, 28 at priority 5 with MS015, none refused"
    )
    func budgetDemotion() async throws {
        try await TestPostgres.withDatabase { db in
            try await Self.register(db, token: Self.activityToken, kind: "activity", activity: "order-1")
            #expect(try await db.queue.operations.setActivityBudget(topic: "com.example.app", perHour: 12) == 12)
            var demoted = 0
            var parents: [Int64] = []
            for n in 1...40 {
                parents.append(try await Self.event(db, "update", 1000 + n, priority: 10))
                let result = try await Self.claimAndRoute(db)
                demoted += result.demoted["com.example.app"] ?? 0
                #expect(result.routed.count == 1 && result.refused.isEmpty)
                try await db.execute("UPDATE push.jobs SET state = 'delivered' WHERE parent_id IS NOT NULL")
            }
            let priorities = try await db.client.query(
                "SELECT priority, trap_ids FROM push.jobs WHERE parent_id IS NOT NULL ORDER BY id"
            ).decode((Int16?, [String]).self).collect()
            #expect(priorities.filter { $0.0 == 10 && $0.1.isEmpty }.count == 12)
            #expect(priorities.filter { $0.0 == 5 && $0.1 == ["MS015"] }.count == 28)
            #expect(demoted == 28)
            let shown = try await db.queue.operations.activity(topic: "com.example.app", activityID: "order-1")
            #expect(shown?.budgetUsed == 12 && shown?.budgetPerHour == 12)
        }
    }

    @Test(
        "an activity no producer inserted is created by its first event; with nothing to send to: NoDevice with the fix; an unreadable event refused; a job naming activity_id must be liveactivity"
    )
    func refusals() async throws {
        try await TestPostgres.withDatabase { db in
            let lonely = try await Self.event(db, "update", 100, activity: "nobody")
            let broken = try await db.int64(
                "INSERT INTO push.jobs (topic, activity_id, push_type, payload) VALUES ('com.example.app', 'order-2', 'liveactivity', '{\"aps\":{\"event\":\"update\",\"timestamp\":\"soon\"}}') RETURNING id"
            )
            let result = try await Self.claimAndRoute(db)
            #expect(result.refused[lonely]?.reason == "NoDevice")
            #expect(result.refused[lonely]?.sentence.contains("push_to_start") == true)
            #expect(result.refused[broken]?.reason == "ActivityEventInvalid")
            #expect(try await db.int64("SELECT count(*) FROM push.activities") == 2)
            await #expect(throws: PSQLError.self) {
                try await db.execute(
                    "INSERT INTO push.jobs (topic, activity_id, payload) VALUES ('com.example.app', 'x', '{}')"
                )
            }
        }
    }
}
