import Foundation
import Hummingbird
import PushCore
import PushQueue

/// A job's detail, as the job and dead-letter pages show it: its facts, its request, its attempts.
extension ConsolePages {
    static func jobFacts(_ job: PushJob) -> [(String, String)] {
        if job.platform == .fcm {
            var facts: [(String, String)] = [
                ("Platform", "FCM (Android)"), ("Topic", job.topic),
                ("Target", job.deviceToken.map { "registration token, fingerprint \(tokenFingerprint($0))" } ?? "none"),
                ("Credential", job.credential),
                ("push_id", job.apnsID.uuidString.lowercased() + " (data.push_id: the app drops a second delivery)"),
                ("Attempts", "\(job.attempts)" + (job.maxAttempts.map { " of at most \($0)" } ?? "")),
                ("Created", timestamp(job.createdAt)),
            ]
            if let collapse = job.collapseID { facts.append(("Collapse key", collapse)) }
            if let expires = job.expiresAt { facts.append(("Expires", timestamp(expires))) }
            if job.deliverOnce { facts.append(("Deliver once", "yes: sent with android.ttl 0s")) }
            return facts
        }
        var facts: [(String, String)] = [
            ("Topic", job.topic), ("Push type", job.pushType),
            (
                "Target",
                job.deviceToken.map { "device token, fingerprint \(tokenFingerprint($0))" } ?? job.channelID.map {
                    "broadcast channel \($0)"
                } ?? job.recipient.map { "recipient \($0): one child job per live device" } ?? "none"
            ),
            ("Credential", job.credential),
            (
                "Environment",
                job.autoEnvironment
                    ? "\(job.environment) (auto: production first, development once on BadDeviceToken)"
                    : job.environment
            ),
            ("apns-id", job.apnsID.uuidString.lowercased()),
            ("Attempts", "\(job.attempts)" + (job.maxAttempts.map { " of at most \($0)" } ?? "")),
            ("Created", timestamp(job.createdAt)),
        ]
        if let collapse = job.collapseID { facts.append(("Collapse id", collapse)) }
        if let expires = job.expiresAt { facts.append(("Expires", timestamp(expires))) }
        if job.deliverOnce {
            facts.append(
                (
                    "Deliver once",
                    "yes: sent with apns-expiration: 0, so APNs stores nothing for an offline device (a resend after a lost answer or a crash can still reach the device twice)"
                )
            )
        }
        return facts
    }

    /// Facts, runbook advice, the attempt history and the describe block, shared by both detail pages.
    func detailView(job: PushJob, facts: [(String, String)], historyJSON: String, showPayload: Bool) -> DetailView {
        let attempts = Self.attempts(historyJSON)
        let advice = job.trapIDs.reversed().compactMap { trap -> AdviceView? in
            guard let entry = TrapRunbook.entry(for: trap.rawValue) else { return nil }
            return AdviceView(code: trap.rawValue, title: entry.title, html: RunbookHTML.render(entry.markdown))
        }
        var described: DetailView.Request?
        var rejected: DetailView.Rejected?
        // A recipient's job is never sent itself: its children's pages show their requests.
        if job.recipient != nil {
            return DetailView(
                facts: facts.map { DetailView.Fact(name: $0.0, value: $0.1) },
                attempts: attempts,
                advice: [],
                request: nil,
                rejected: nil,
                hasAttempts: !attempts.isEmpty
            )
        }
        do {
            if job.platform == .fcm {
                // Built around a stand-in for the token, never the token itself.
                var shown = job
                shown.deviceToken = job.deviceToken.map { "<token fp \(tokenFingerprint($0))>" }
                let message = try FCMMessageBuilder.describe(shown, now: self.queue.clock.wallNow)
                let body = String(decoding: message.body, as: UTF8.self)
                described = DetailView.Request(
                    line: "POST https://fcm.googleapis.com/v1/projects/<project_id>/messages:send  HTTP/2",
                    credential: job.credential,
                    headers: [DetailView.Header(name: "content-type", value: "application/json")],
                    bytes: grouped(message.body.count),
                    limit: grouped(FCMMessageBuilder.payloadLimit),
                    warnings: [],
                    payload: showPayload ? body : nil
                )
                return DetailView(
                    facts: facts.map { DetailView.Fact(name: $0.0, value: $0.1) },
                    attempts: attempts,
                    advice: advice.first.map { [$0] } ?? [],
                    request: described,
                    rejected: nil,
                    hasAttempts: !attempts.isEmpty
                )
            }
            let request = try RequestBuilder.describe(job, now: self.queue.clock.wallNow)
            var path = request.path
            if let token = job.deviceToken {
                path = path.replacingOccurrences(of: token, with: "<token fp \(tokenFingerprint(token))>")
            }
            described = DetailView.Request(
                line: "\(request.method) https://\(request.environment.sendHost)\(path)  HTTP/2",
                credential: job.credential,
                headers: request.headers.map { DetailView.Header(name: $0.name, value: $0.value) },
                bytes: grouped(request.byteCount),
                limit: grouped(request.limit),
                warnings: request.warnings.map { DetailView.Warning(code: $0.trapID.rawValue, message: $0.message) },
                payload: showPayload ? String(decoding: request.body, as: UTF8.self) : nil
            )
        } catch {
            rejected = DetailView.Rejected(reason: error.reason, message: error.message, trap: error.trapID?.rawValue)
        }
        return DetailView(
            facts: facts.map { DetailView.Fact(name: $0.0, value: $0.1) },
            attempts: attempts,
            advice: advice.first.map { [$0] } ?? [],
            request: described,
            rejected: rejected,
            hasAttempts: !attempts.isEmpty
        )
    }

    /// A history value as JSON shows it: `null`, `410`, `"text"` without quotes, `[…]` compact.
    static func shown(_ value: Any?) -> String {
        switch value {
        case .none, is NSNull: return "null"
        case let text as String: return text
        case let number as NSNumber: return number.stringValue
        case .some(let other):
            guard JSONSerialization.isValidJSONObject(other),
                let data = try? JSONSerialization.data(withJSONObject: other, options: [.sortedKeys])
            else { return "\(other)" }
            return String(decoding: data, as: UTF8.self)
        }
    }

    /// The history's entries as table rows: attempt number, time, outcome, and every other field.
    static func attempts(_ json: String) -> [DetailView.Attempt] {
        guard let array = try? JSONSerialization.jsonObject(with: Data(json.utf8)) as? [[String: Any]] else {
            return []
        }
        return array.enumerated().map { n, entry in
            let details = entry.keys.sorted().filter { !["attempt", "at", "outcome"].contains($0) }.map { key in
                "\(key)=\(Self.shown(entry[key]))"
            }
            return DetailView.Attempt(
                number: (entry["attempt"] as? Int).map(String.init) ?? String(n + 1),
                at: (entry["at"] as? String) ?? "",
                outcome: (entry["outcome"] as? String) ?? "",
                details: details.joined(separator: "  ")
            )
        }
    }
}
