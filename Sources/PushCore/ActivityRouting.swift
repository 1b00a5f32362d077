import Foundation

/// One Live Activity event as a job carries it: `aps.event`, `aps.timestamp` (seconds since 1970) and, for
/// an end, `aps.dismissal-date`.
public struct ActivityEvent: Sendable, Hashable {
    public enum Kind: String, Sendable, Hashable { case start, update, end }

    public var jobID: Int64
    public var kind: Kind
    public var timestamp: Int64
    /// The job's `priority` (`nil`: APNs' default for a Live Activity, 5): only a priority-10 update draws on
    /// the budget.
    public var priority: Int?
    /// An end's `aps.dismissal-date`, seconds since 1970.
    public var dismissalDate: Int64?

    public init(jobID: Int64, kind: Kind, timestamp: Int64, priority: Int? = nil, dismissalDate: Int64? = nil) {
        self.jobID = jobID
        self.kind = kind
        self.timestamp = timestamp
        self.priority = priority
        self.dismissalDate = dismissalDate
    }

    /// Reads the event of a job's payload, or says what is wrong with it and how to fix it.
    public static func read(jobID: Int64, payload: String, priority: Int?) -> Result<ActivityEvent, ActivityEventError>
    {
        guard let envelope = try? JSONDecoder().decode(Envelope.self, from: Data(payload.utf8)), let aps = envelope.aps
        else {
            return .failure(
                ActivityEventError(
                    "the payload has no aps object: a Live Activity event is {\"aps\":{\"event\":…,\"timestamp\":…}}"
                )
            )
        }
        guard let name = aps.event, let kind = Kind(rawValue: name) else {
            return .failure(ActivityEventError("aps.event must be start, update or end"))
        }
        guard let timestamp = Self.seconds(aps.timestamp) else {
            return .failure(
                ActivityEventError("aps.timestamp must be the event's time in whole seconds since 1970 (an integer)")
            )
        }
        return .success(
            ActivityEvent(
                jobID: jobID,
                kind: kind,
                timestamp: timestamp,
                priority: priority,
                dismissalDate: Self.seconds(aps.dismissalDate)
            )
        )
    }

    private static func seconds(_ value: Double?) -> Int64? {
        guard let value, value.isFinite, value >= 0, value < 1e11, value == value.rounded() else { return nil }
        return Int64(value)
    }

    /// The fields of `aps` the routing reads; each one of another JSON type reads as absent.
    private struct Envelope: Decodable {
        struct APS: Decodable {
            var event: String?
            var timestamp: Double?
            var dismissalDate: Double?

            enum CodingKeys: String, CodingKey {
                case event, timestamp
                case dismissalDate = "dismissal-date"
            }

            init(from decoder: any Decoder) throws {
                let container = try decoder.container(keyedBy: CodingKeys.self)
                self.event = try? container.decode(String.self, forKey: .event)
                self.timestamp = try? container.decode(Double.self, forKey: .timestamp)
                self.dismissalDate = try? container.decode(Double.self, forKey: .dismissalDate)
            }
        }

        var aps: APS?

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            self.aps = try? container.decode(APS.self, forKey: .aps)
        }

        enum CodingKeys: String, CodingKey { case aps }
    }
}

/// Why a job's payload is not a Live Activity event the worker can route.
public struct ActivityEventError: Error, Sendable, Hashable {
    public var sentence: String
    public init(_ sentence: String) { self.sentence = sentence }
}

/// A Live Activity's row as the routing locked it.
public struct ActivityRecord: Sendable, Hashable {
    public enum State: String, Sendable, Hashable { case requested, started, ended }

    public var state: State
    /// The newest timestamp routed, if any.
    public var lastTimestamp: Int64?
    /// A request of the last routed event may be in flight: a child is running, or a claim holds it.
    public var busy: Bool
    /// Children of the last routed event not yet sent (waiting for a retry): a newer event supersedes them.
    public var unsentChildren: [Int64]
    /// The timestamp of an end of this activity still in the queue, not among the claimed events (enqueued,
    /// or claimed by another worker): nothing as new as it may go first, or the device would drop the end.
    public var waitingEnd: Int64?
    /// The job id of a start of this activity still in the queue, not among the claimed events: no end
    /// enqueued after it may go first (the start would then be dropped as after the end).
    public var waitingStart: Int64?
    /// The activity asked for a broadcast channel the worker has not created yet: its updates and end wait.
    public var channelPending: Bool
    /// Priority-10 updates routed in the current hour, and the topic's budget for an hour.
    public var budgetUsed: Int
    public var budgetPerHour: Int

    public init(
        state: State,
        lastTimestamp: Int64?,
        busy: Bool,
        unsentChildren: [Int64] = [],
        waitingEnd: Int64? = nil,
        waitingStart: Int64? = nil,
        channelPending: Bool = false,
        budgetUsed: Int = 0,
        budgetPerHour: Int = 12
    ) {
        self.waitingEnd = waitingEnd
        self.waitingStart = waitingStart
        self.channelPending = channelPending
        self.state = state
        self.lastTimestamp = lastTimestamp
        self.busy = busy
        self.unsentChildren = unsentChildren
        self.budgetUsed = budgetUsed
        self.budgetPerHour = budgetPerHour
    }
}

/// What becomes of one claimed event.
public enum ActivityVerdict: Sendable, Hashable {
    /// Sent: to the recipient's push-to-start tokens (a start) or the activity's token or channel; `demoted`:
    /// a priority-10 update past the hour's budget, sent at priority 5 with trap MS015.
    case route(demoted: Bool)
    /// Never sent: `StaleTimestamp` (an update or end not newer than an event routed, or than `by`, routed
    /// now) or `ActivityEnded` (the activity's end was routed).
    case superseded(reason: String, by: Int64?)
    /// The previous event's request may be in flight: claimed again shortly, uncounted, so that a device never
    /// receives an older timestamp after a newer one.
    case wait
}

/// The rules of a Live Activity's life, as one pure decision per activity and claim: iOS drops an update
/// older than one it showed and anything after an end, silently, so the worker sends neither.
public enum ActivityRouting {
    /// What the routing does to an activity and the events of it a claim holds.
    public struct Decision: Sendable, Hashable {
        public var verdicts: [Int64: ActivityVerdict]
        /// The event sent, if any.
        public var routed: ActivityEvent?
        /// The activity's state once it is.
        public var state: ActivityRecord.State
        /// Priority-10 updates of the hour once it is.
        public var budgetUsed: Int
        /// Children of an older event, unsent, that the routed one supersedes (StaleTimestamp).
        public var supersededChildren: [Int64]
        /// The timestamp the routed event's requests carry instead of its own (a late end), if any.
        public var payloadTimestamp: Int64? = nil
    }

    /// The budget when a topic sets none (`push-worker activities budget`).
    public static let defaultBudgetPerHour = 12

    public static func decide(_ record: ActivityRecord, events: [ActivityEvent]) -> Decision {
        var decision = Decision(
            verdicts: [:],
            routed: nil,
            state: record.state,
            budgetUsed: record.budgetUsed,
            supersededChildren: []
        )
        if record.state == .ended {
            for event in events { decision.verdicts[event.jobID] = .superseded(reason: "ActivityEnded", by: nil) }
            return decision
        }
        var fresh: [ActivityEvent] = []
        for event in events {
            // Only an update can be stale. A start goes to push-to-start tokens, where it makes a new activity:
            // no timestamp shown there to be older than. An end is never dropped (the activity would never end
            // on the device): one not newer than the last event sent goes with a newer timestamp.
            if event.kind == .update, let last = record.lastTimestamp, event.timestamp <= last {
                decision.verdicts[event.jobID] = .superseded(reason: "StaleTimestamp", by: nil)
            } else {
                fresh.append(event)
            }
        }
        // An end waiting elsewhere in the queue goes before anything as new as it.
        if let end = record.waitingEnd {
            for event in fresh where event.timestamp >= end { decision.verdicts[event.jobID] = .wait }
            fresh.removeAll { $0.timestamp >= end }
        }
        // A start enqueued before an end and still in the queue elsewhere goes first; the end, held back for
        // it, still goes before anything as new as it.
        if let start = record.waitingStart,
            let heldEnd = fresh.filter({ $0.kind == .end && $0.jobID > start }).map(\.timestamp).min()
        {
            for event in fresh where (event.kind == .end && event.jobID > start) || event.timestamp >= heldEnd {
                decision.verdicts[event.jobID] = .wait
            }
            fresh.removeAll { ($0.kind == .end && $0.jobID > start) || $0.timestamp >= heldEnd }
        }
        // Updates and ends go through the channel the activity asked for, once it exists; a start does not.
        if record.channelPending {
            for event in fresh where event.kind != .start { decision.verdicts[event.jobID] = .wait }
            fresh.removeAll { $0.kind != .start }
        }
        guard !fresh.isEmpty else { return decision }
        guard !record.busy else {
            for event in fresh { decision.verdicts[event.jobID] = .wait }
            return decision
        }
        // The first start, if one is here (it makes the activity the other events are for, and an end before
        // it would leave the device an activity that never ends); else the newest end (nothing after it may be
        // sent); else the newest update.
        let newest: (ActivityEvent, ActivityEvent) -> Bool = {
            ($0.timestamp, $0.jobID) < ($1.timestamp, $1.jobID)
        }
        let winner =
            fresh.filter { $0.kind == .start }.min { $0.jobID < $1.jobID }
            ?? fresh.filter { $0.kind == .end }.max(by: newest)
            ?? fresh.max(by: newest)!
        for event in fresh where event.jobID != winner.jobID {
            // An update older than the event sent: stale once it is. Anything else (newer, an end behind a
            // start, other starts): judged in a later round (after the end: ended).
            decision.verdicts[event.jobID] =
                event.kind == .update && event.timestamp <= winner.timestamp
                ? .superseded(reason: "StaleTimestamp", by: winner.jobID) : .wait
        }
        var demoted = false
        if winner.kind == .update && winner.priority == 10 {
            if record.budgetUsed >= record.budgetPerHour {
                demoted = true
            } else {
                decision.budgetUsed += 1
            }
        }
        decision.verdicts[winner.jobID] = .route(demoted: demoted)
        decision.routed = winner
        // A late start (older than the updates shown) never lowers the mark the activity's token is held to;
        // a late end goes one second after it.
        if let last = record.lastTimestamp, winner.timestamp <= last {
            if winner.kind == .end {
                decision.payloadTimestamp = last + 1
                decision.routed?.timestamp = last + 1
            } else {
                decision.routed?.timestamp = last
            }
        }
        decision.state = winner.kind == .end ? .ended : .started
        // An update or an end replaces an older update's unsent child on the activity's token; a start goes to
        // other tokens and leaves it to be sent (the activity keeps it among its children: nothing overtakes it).
        decision.supersededChildren = winner.kind == .start ? [] : record.unsentChildren
        return decision
    }
}
