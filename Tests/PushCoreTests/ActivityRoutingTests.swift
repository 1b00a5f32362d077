import PushCore
import Testing

/// A Live Activity's life as one pure decision per claim (CONTRACT 1e): iOS drops an update older than one
/// it showed and everything after an end, silently; the routing sends neither.
@Suite("Live Activity routing: the newest event goes, stale and post-end events are superseded, one request in flight")
struct ActivityRoutingTests {
    static func event(_ id: Int64, _ kind: ActivityEvent.Kind, _ ts: Int64, priority: Int? = nil) -> ActivityEvent {
        ActivityEvent(jobID: id, kind: kind, timestamp: ts, priority: priority)
    }

    @Test("the newest of the claimed events is routed; older and equal ones are superseded by it, StaleTimestamp")
    func newestWins() {
        let record = ActivityRecord(state: .started, lastTimestamp: 100, busy: false, unsentChildren: [77])
        let decision = ActivityRouting.decide(
            record,
            events: [Self.event(1, .update, 105), Self.event(2, .update, 110), Self.event(3, .update, 110)]
        )
        #expect(decision.routed?.jobID == 3, "equal timestamps: the later job")
        #expect(decision.verdicts[1] == .superseded(reason: "StaleTimestamp", by: 3))
        #expect(decision.verdicts[2] == .superseded(reason: "StaleTimestamp", by: 3))
        #expect(decision.verdicts[3] == .route(demoted: false))
        #expect(decision.supersededChildren == [77], "the older event's unsent children")
        #expect(decision.state == .started)
    }

    @Test("not newer than the last event routed: StaleTimestamp; after an end: ActivityEnded, whatever its timestamp")
    func staleAndEnded() {
        let stale = ActivityRouting.decide(
            ActivityRecord(state: .started, lastTimestamp: 100, busy: false),
            events: [Self.event(1, .update, 100), Self.event(2, .update, 99)]
        )
        #expect(
            stale.routed == nil
                && stale.verdicts.values.allSatisfy { $0 == .superseded(reason: "StaleTimestamp", by: nil) }
        )
        let ended = ActivityRouting.decide(
            ActivityRecord(state: .ended, lastTimestamp: 100, busy: false),
            events: [Self.event(1, .update, 500), Self.event(2, .start, 600)]
        )
        #expect(
            ended.routed == nil
                && ended.verdicts.values.allSatisfy { $0 == .superseded(reason: "ActivityEnded", by: nil) }
        )
    }

    @Test(
        "a request of the previous event in flight: the fresh events wait (claimed again), the stale ones end at once"
    )
    func busyWaits() {
        let decision = ActivityRouting.decide(
            ActivityRecord(state: .started, lastTimestamp: 100, busy: true),
            events: [Self.event(1, .update, 90), Self.event(2, .update, 120)]
        )
        #expect(decision.verdicts == [1: .superseded(reason: "StaleTimestamp", by: nil), 2: .wait])
        #expect(decision.routed == nil && decision.state == .started)
    }

    @Test("an end among the events is routed even beside newer updates; those wait to be judged after it")
    func endFirst() {
        let decision = ActivityRouting.decide(
            ActivityRecord(state: .started, lastTimestamp: 100, busy: false),
            events: [Self.event(1, .update, 150), Self.event(2, .end, 140), Self.event(3, .update, 130)]
        )
        #expect(decision.routed?.jobID == 2 && decision.state == .ended)
        #expect(decision.verdicts[1] == .wait && decision.verdicts[3] == .superseded(reason: "StaleTimestamp", by: 2))
        let after = ActivityRouting.decide(
            ActivityRecord(state: decision.state, lastTimestamp: 140, busy: false),
            events: [Self.event(1, .update, 150)]
        )
        #expect(after.verdicts[1] == .superseded(reason: "ActivityEnded", by: nil))
    }

    @Test(
        "an end is never stale: one not newer than the last event sent goes one second after it, so the activity ends; a start goes before an end, and leaves an older update's unsent child alone"
    )
    func lateEndAndStartBehindAChild() {
        let late = ActivityRouting.decide(
            ActivityRecord(state: .started, lastTimestamp: 300, busy: false),
            events: [Self.event(1, .end, 300)]
        )
        #expect(late.routed?.jobID == 1 && late.payloadTimestamp == 301 && late.routed?.timestamp == 301)
        #expect(late.state == .ended)
        let start = ActivityRouting.decide(
            ActivityRecord(state: .started, lastTimestamp: 300, busy: false, unsentChildren: [9]),
            events: [Self.event(2, .start, 400), Self.event(3, .end, 500)]
        )
        #expect(start.routed?.jobID == 2 && start.supersededChildren.isEmpty, "the update's child is kept")
        #expect(start.verdicts[3] == .wait, "the end goes after the start")
    }

    @Test(
        "a channel asked for and not created yet: updates and ends wait for it, a start goes (to push-to-start tokens)"
    )
    func channelPending() {
        let decision = ActivityRouting.decide(
            ActivityRecord(state: .requested, lastTimestamp: nil, busy: false, channelPending: true),
            events: [Self.event(1, .update, 10), Self.event(2, .start, 5), Self.event(3, .end, 20)]
        )
        #expect(decision.routed?.jobID == 2 && decision.verdicts[1] == .wait && decision.verdicts[3] == .wait)
    }

    @Test("a start enqueued before an end and claimed elsewhere: the end waits for it; updates go")
    func startWaitingElsewhere() {
        let decision = ActivityRouting.decide(
            ActivityRecord(state: .requested, lastTimestamp: nil, busy: false, waitingStart: 5),
            events: [Self.event(9, .end, 300), Self.event(7, .update, 200)]
        )
        #expect(decision.routed?.jobID == 7 && decision.verdicts[9] == .wait)
        // An update newer than the held end waits with it: it must not reach the device before the end.
        let newer = ActivityRouting.decide(
            ActivityRecord(state: .requested, lastTimestamp: nil, busy: false, waitingStart: 5),
            events: [Self.event(9, .end, 300), Self.event(10, .update, 301)]
        )
        #expect(newer.routed == nil && newer.verdicts == [9: .wait, 10: .wait])
    }

    @Test(
        "an end still in the queue elsewhere (enqueued, or claimed by another worker): events as new as it wait for it, older ones go"
    )
    func endWaitingElsewhere() {
        let decision = ActivityRouting.decide(
            ActivityRecord(state: .started, lastTimestamp: 100, busy: false, waitingEnd: 200),
            events: [Self.event(1, .update, 150), Self.event(2, .update, 250), Self.event(3, .update, 200)]
        )
        #expect(decision.routed?.jobID == 1)
        #expect(decision.verdicts[2] == .wait && decision.verdicts[3] == .wait)
    }

    @Test(
        "a late start (older than the updates shown) is still sent, to push-to-start tokens, and never lowers the mark; a start goes before the updates claimed with it"
    )
    func lateStart() {
        let late = ActivityRouting.decide(
            ActivityRecord(state: .started, lastTimestamp: 500, busy: false),
            events: [Self.event(1, .start, 100), Self.event(2, .update, 90), Self.event(3, .update, 600)]
        )
        #expect(late.routed?.jobID == 1 && late.routed?.timestamp == 500, "routed, the mark kept at 500")
        #expect(late.verdicts[2] == .superseded(reason: "StaleTimestamp", by: nil))
        #expect(late.verdicts[3] == .wait, "after the start")
    }

    @Test(
        "priority-10 updates past the hour's budget go at priority 5 (demoted); starts, ends and priority 5 do not count"
    )
    func budget() {
        var record = ActivityRecord(state: .started, lastTimestamp: 0, busy: false, budgetUsed: 0, budgetPerHour: 12)
        var demoted = 0
        var routed = 0
        for n in 1...40 {
            let decision = ActivityRouting.decide(
                record,
                events: [Self.event(Int64(n), .update, Int64(n), priority: 10)]
            )
            if decision.verdicts[Int64(n)] == .route(demoted: true) { demoted += 1 }
            if decision.routed != nil { routed += 1 }
            record.budgetUsed = decision.budgetUsed
            record.lastTimestamp = Int64(n)
        }
        #expect(routed == 40 && demoted == 28 && record.budgetUsed == 12)
        let low = ActivityRouting.decide(record, events: [Self.event(41, .update, 41, priority: 5)])
        #expect(low.verdicts[41] == .route(demoted: false) && low.budgetUsed == 12)
        let end = ActivityRouting.decide(record, events: [Self.event(42, .end, 42, priority: 10)])
        #expect(end.verdicts[42] == .route(demoted: false))
    }

    @Test(
        "payloads: event and integer timestamp read; a missing aps, an unknown event, a string or fractional timestamp refused with the fix"
    )
    func reading() {
        let ok = ActivityEvent.read(
            jobID: 1,
            payload: #"{"aps":{"event":"end","timestamp":1700000000,"dismissal-date":1700003600,"content-state":{}}}"#,
            priority: 10
        )
        #expect(
            (try? ok.get())
                == ActivityEvent(
                    jobID: 1,
                    kind: .end,
                    timestamp: 1_700_000_000,
                    priority: 10,
                    dismissalDate: 1_700_003_600
                )
        )
        for (payload, words) in [
            (#"{"alert":"x"}"#, "no aps object"),
            (#"{"aps":{"event":"pause","timestamp":1}}"#, "aps.event must be start, update or end"),
            (#"{"aps":{"event":"update","timestamp":"1700000000"}}"#, "aps.timestamp must be"),
            (#"{"aps":{"event":"update","timestamp":1700000000.5}}"#, "aps.timestamp must be"),
            (#"{"aps":{"event":"update"}}"#, "aps.timestamp must be"),
        ] {
            guard case .failure(let error) = ActivityEvent.read(jobID: 1, payload: payload, priority: nil) else {
                Issue.record("\(payload) was read")
                continue
            }
            #expect(error.sentence.contains(words), "\(payload): \(error.sentence)")
        }
    }
}
