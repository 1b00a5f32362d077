import ArgumentParser
import Foundation
import PushCore
import PushQueue
import PushTransport

extension DescribeCommand {
    /// A Live Activity event is not sent itself: where it went, why it was not sent, or where it will go (the
    /// activity's tokens or channel now) and whether the routing will send it at all.
    func describeActivityEvent(_ job: PushJob, activityID: String, what: String) async throws {
        let (details, activity, devices) = try await self.database.withQueue { queue, _, _ in
            (
                try await queue.operations.job(id: job.id),
                try await queue.operations.activity(topic: job.topic, activityID: activityID),
                try await queue.operations.devices(topic: job.topic, limit: 10_000)
            )
        }
        let event = ActivityEvent.read(jobID: job.id, payload: job.payload, priority: job.priority)
        let named: String
        switch event {
        case .success(let event): named = "event \(event.kind.rawValue) (timestamp \(event.timestamp))"
        case .failure(let error):
            print("\(what) is not a Live Activity event the worker can route: \(error.sentence)")
            print("  it ends a dead letter ActivityEventInvalid when claimed; fix the payload and replay it")
            return
        }
        let about = "\(what) is \(named) of Live Activity '\(activityID)' (topic \(job.topic))"
        if let details, !details.children.isEmpty {
            print("\(about): sent to \(details.children.count) child jobs")
            for child in details.children {
                print("  job \(child.id)  \(child.state)  token fp \(child.tokenFingerprint)")
            }
            return
        }
        if let details, details.state == .superseded {
            let why =
                details.reason == "ActivityEnded"
                ? "the activity's end went before it, and iOS drops everything after an end"
                : "an event as new or newer went before it, and iOS drops an update older than the one it shows"
            print("\(about): not sent, superseded \(details.reason ?? "-"): \(why)")
            return
        }
        guard case .success(let parsed) = event else { return }
        guard let activity else {
            print("\(about): the activity is not in push.activities yet; its first event creates it")
            return
        }
        if activity.state == "ended" {
            print(
                "\(about): will not be sent: the activity ended \(formatDate(activity.endedAt)) (ActivityEnded); iOS drops everything after an end"
            )
            return
        }
        if parsed.kind != .start, let last = activity.lastTimestamp, parsed.timestamp <= last {
            print(
                "\(about): will not be sent: its timestamp is not newer than \(last), already sent (StaleTimestamp)"
            )
            return
        }
        let targets: [String]
        if parsed.kind == .start {
            targets = devices.filter {
                $0.isLive && $0.kind == "push_to_start" && $0.recipient == activity.recipient
            }.map { "push-to-start token fp \($0.tokenFingerprint)" }
            print("\(about): goes to recipient \(activity.recipient ?? "-")'s live push-to-start tokens")
        } else if let channel = activity.channelID {
            targets = ["channel \(channel)"]
            print("\(about): goes to the activity's broadcast channel")
        } else {
            targets = devices.filter { $0.isLive && $0.kind == "activity" && $0.activityID == activityID }.map {
                "activity token fp \($0.tokenFingerprint)"
            }
            print("\(about): goes to the activity's own live tokens (push.devices kind activity)")
        }
        if targets.isEmpty {
            print("  none now: it would end a dead letter NoDevice; register the token in push.devices")
        }
        for target in targets { print("  \(target)") }
        if parsed.kind == .update && job.priority == 10 && activity.budgetUsed >= activity.budgetPerHour {
            print(
                "  priority 5 with trap MS015: the activity used its \(activity.budgetPerHour) priority-10 updates this hour"
            )
        }
    }

    /// An FCM job's exact request: the send URL (the credential's project, when the config file names
    /// it), headers without the access token, and the message body.
    func describeFCM(_ job: PushJob, isDeadLetter: Bool) throws(PreSendRejection) {
        // Built around a stand-in for the token (unless --show-token): a token FCM escapes in JSON would
        // survive a search and replace on the finished body.
        var shown = job
        if !self.showToken { shown.deviceToken = "<token fp \(job.tokenFingerprint)>" }
        let message = try FCMMessageBuilder.describe(shown, now: processClock.wallNow)
        let project =
            (try? self.config.map(ConfigFile.load)?.serviceAccounts()[job.credential]?.projectID) ?? "<project_id>"
        let body = String(decoding: message.body, as: UTF8.self)
        let url = "https://\(FCMClient.googleEndpoint.host)\(FCMMessage.path(project: project))"
        if self.json {
            printJSON(
                DescribeJSON(
                    method: "POST",
                    url: url,
                    headers: ["content-type": "application/json"],
                    payload: body,
                    bytes: message.body.count,
                    limit: FCMMessageBuilder.payloadLimit,
                    warnings: []
                )
            )
            return
        }
        print("POST \(url)  HTTP/2")
        print("authorization: Bearer <OAuth access token of the service account of credential '\(job.credential)'>")
        print("content-type: application/json")
        print("")
        print(body)
        print("")
        print(
            "android.priority \(message.androidPriority), ttl \(message.ttl), data.push_id \(job.apnsID.uuidString.lowercased())"
        )
        if isDeadLetter {
            print("(job \(self.id ?? 0) is a dead letter: this is the request a replay would send)")
        }
    }
}
