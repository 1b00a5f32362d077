import Foundation

/// What kind of Live Activity token a device gave its app (Apple: "Starting and updating Live Activities with
/// ActivityKit push notifications"): a push-to-start token starts activities; an activity's own push token
/// updates and ends that one activity.
public enum LiveActivityTokenKind: String, Sendable, Hashable {
    case pushToStart = "push_to_start"
    case activity
}

/// A push APNs accepted (200) that the device would drop without a word, as iOS does.
public struct DroppedPush: Sendable, Hashable {
    public var token: String
    public var event: String?
    public var timestamp: Int64?
    /// Why iOS ignores it: `start to an activity token`, `update to a push-to-start token`, `stale timestamp`,
    /// `after the end`.
    public var why: String
}

/// One Live Activity token's device, as far as the simulator keeps it: the newest timestamp it showed, and
/// whether its activity ended.
struct LiveActivityDevice: Sendable {
    var kind: LiveActivityTokenKind
    var lastTimestamp: Int64?
    var ended = false
    /// Events shown (started, updated, ended), in order.
    var shown: [(event: String, timestamp: Int64)] = []

    /// What the device does with an accepted `liveactivity` push: shows it (nil) or drops it (why).
    mutating func receive(event: String?, timestamp: Int64?) -> String? {
        switch (self.kind, event) {
        case (.activity, "start"): return "start to an activity token"
        case (.pushToStart, "update"), (.pushToStart, "end"): return "update or end to a push-to-start token"
        case (.pushToStart, "start"):
            // Each start makes a new activity: no order to keep across them.
            self.shown.append(("start", timestamp ?? 0))
            return nil
        default: break
        }
        if self.ended { return "after the end" }
        guard let timestamp else { return "no timestamp" }
        if let last = self.lastTimestamp, timestamp <= last { return "stale timestamp" }
        self.lastTimestamp = timestamp
        if event == "end" { self.ended = true }
        self.shown.append((event ?? "", timestamp))
        return nil
    }
}

extension APNsSimulator {
    /// Makes `token` a Live Activity token of `kind`: a `liveactivity` push to it that iOS would ignore (a
    /// start to an activity's token, an update or end to a push-to-start token, a timestamp not newer than
    /// the last one shown, anything after the end) is answered 200, as APNs answers it, and recorded in
    /// ``droppedByDevice``.
    public func registerLiveActivity(token: String, kind: LiveActivityTokenKind) {
        self.state.withLock { $0.liveActivityTokens[token] = LiveActivityDevice(kind: kind) }
    }

    /// The pushes APNs accepted that the devices dropped, in arrival order.
    public var droppedByDevice: [DroppedPush] { self.state.withLock { $0.droppedByDevice } }

    /// The events a Live Activity token's device showed, in order.
    public func shownEvents(token: String) -> [(event: String, timestamp: Int64)] {
        self.state.withLock { $0.liveActivityTokens[token]?.shown ?? [] }
    }

    /// Hands an accepted request to its Live Activity device, if its token is one.
    func deliverToLiveActivity(_ request: RecordedRequest) {
        guard request.status == 200, request.headers["apns-push-type"] == "liveactivity",
            let token = request.deviceToken
        else { return }
        let aps =
            (try? JSONSerialization.jsonObject(with: Data(request.body)) as? [String: Any])?["aps"]
            as? [String: Any]
        let event = aps?["event"] as? String
        let timestamp = (aps?["timestamp"] as? NSNumber).map { Int64(truncating: $0) }
        self.state.withLock { state in
            guard var device = state.liveActivityTokens[token] else { return }
            if let why = device.receive(event: event, timestamp: timestamp) {
                state.droppedByDevice.append(DroppedPush(token: token, event: event, timestamp: timestamp, why: why))
            }
            state.liveActivityTokens[token] = device
        }
    }
}
