import Foundation
import Hummingbird
import PushCore
import PushQueue

extension ConsolePages {
    /// What a replay form names: the dead letters and the options, as `dead replay` takes them.
    struct ReplaySelection {
        var filter: DeadLetterFilter
        var all: Bool
        var newAPNsID: Bool
        var expiresIn: String
        /// The fields that carry the selection from the preview to the confirm step.
        var hidden: [[String: String]]

        var expiresInDuration: Duration? {
            parseDuration(self.expiresIn).map { .seconds($0) }
        }
    }

    func replaySelection(_ fields: [String: String]) throws -> ReplaySelection {
        var filter = try self.deadFilter(fields, limit: 1_000)
        if fields["limit"] == nil || fields["limit"] == "" { filter.limit = 1_000 }
        let all = fields["all"] == "1"
        guard !filter.isUnrestricted || all else {
            throw ConsoleRefusal(
                status: .badRequest,
                message:
                    "Name what to replay: dead letter ids, a trap id, a reason, a topic or a since, or all=1 for every dead letter."
            )
        }
        let expiresIn = fields["expires_in"]?.trimmingCharacters(in: .whitespaces) ?? ""
        if !expiresIn.isEmpty && parseDuration(expiresIn) == nil {
            throw ConsoleRefusal(
                status: .badRequest,
                message: "expires_in must be a duration such as 30m, 1h or 1d, not “\(expiresIn)”."
            )
        }
        let hidden = ["ids", "trap", "died_with", "reason", "topic", "since", "limit", "all"].compactMap {
            name -> [String: String]? in
            guard let value = fields[name], !value.isEmpty else { return nil }
            return ["name": name, "value": value]
        }
        return ReplaySelection(
            filter: filter,
            all: all,
            newAPNsID: fields["new_apns_id"] == "1",
            expiresIn: expiresIn,
            hidden: hidden
        )
    }

    func replayView(_ result: ReplayResult, selection: ReplaySelection, preview: Bool) -> ReplayView {
        let summary: String
        if preview {
            summary =
                "Dry run: nothing has moved. \(result.moved.count) dead letter(s) would go back to the queue as pending, due now, attempts reset"
                + (selection.newAPNsID ? ", each with a new apns-id" : ", each keeping its apns-id")
                + "; \(result.skippedConflicts.count) conflict(s) and \(result.skippedInvalid.count) refused would stay dead."
        } else {
            summary =
                "Replayed \(result.moved.count) dead letter(s): they are pending and due now. \(result.skippedConflicts.count) conflict(s) and \(result.skippedInvalid.count) refused stayed dead."
        }
        return ReplayView(
            summary: summary,
            truncated: result.moved.count > 500,
            // The confirm step replays these and no others: dead letters that die after the preview, or
            // that a changed filter would now take in, stay where they are.
            confirmIDs: result.moved.map { String($0.id) }.joined(separator: ","),
            moved: result.moved.prefix(500).map { moved in
                ReplayView.Moved(
                    id: moved.id,
                    apnsID: moved.apnsID.uuidString.lowercased(),
                    reason: moved.reason,
                    expired: moved.expired && selection.expiresInDuration == nil
                )
            },
            conflicts: Array(result.skippedConflicts.prefix(500)),
            invalid: result.skippedInvalid.prefix(500).map { ReplayView.Invalid(id: $0.id, rule: $0.rule) },
            preview: preview,
            canConfirm: preview && !result.moved.isEmpty,
            movedCount: grouped(result.moved.count),
            hidden: selection.hidden.map { ReplayView.Hidden(name: $0["name"] ?? "", value: $0["value"] ?? "") },
            newAPNsID: selection.newAPNsID,
            expiresIn: selection.expiresIn,
            hasMoved: !result.moved.isEmpty,
            hasConflicts: !result.skippedConflicts.isEmpty,
            hasInvalid: !result.skippedInvalid.isEmpty
        )
    }

    func replayPreview(_ request: Request) async throws -> Response {
        try await self.page(request) { frame in
            try self.requireReader(frame)
            let selection = try self.replaySelection(Self.queryFields(request))
            let result = try await self.queue.operations.replay(
                matching: selection.filter,
                newAPNsID: selection.newAPNsID,
                expiresIn: selection.expiresInDuration,
                dryRun: true
            )
            return self.render(
                "replay",
                title: "Replay: preview",
                page: self.replayView(result, selection: selection, preview: true),
                frame: frame
            )
        }
    }

    func replay(_ request: Request) async throws -> Response {
        try await self.page(request) { frame in
            let (session, form) = try await self.authorizeChange(request, frame: frame)
            var selection = try self.replaySelection(form)
            // Only what the preview listed: its ids travel in the confirm form.
            let confirmed = (form["confirm_ids"] ?? "").split(separator: ",").map { Int64($0) }
            guard !confirmed.isEmpty, confirmed.allSatisfy({ $0 != nil }) else {
                throw ConsoleRefusal(
                    status: .badRequest,
                    message: "A replay is confirmed from its preview: open the preview and use its Replay button."
                )
            }
            selection.filter.ids = confirmed.compactMap { $0 }
            let result = try await self.queue.operations.replay(
                matching: selection.filter,
                newAPNsID: selection.newAPNsID,
                expiresIn: selection.expiresInDuration,
                dryRun: false
            )
            self.logChange(
                session,
                "replayed \(result.moved.count) dead letter(s)",
                [
                    "selection": "\(selection.hidden.map { "\($0["name"]!)=\($0["value"]!)" }.joined(separator: " "))",
                    "moved": "\(result.moved.prefix(50).map { String($0.id) }.joined(separator: ","))",
                    "conflicts": "\(result.skippedConflicts.count)", "refused": "\(result.skippedInvalid.count)",
                    "new_apns_id": "\(selection.newAPNsID)",
                ]
            )
            return self.render(
                "replay",
                title: "Replay: done",
                page: self.replayView(result, selection: selection, preview: false),
                frame: frame
            )
        }
    }

    func purgeAge(_ fields: [String: String]) throws -> (String, Double) {
        let text = fields["older_than"]?.trimmingCharacters(in: .whitespaces) ?? ""
        guard let seconds = parseDuration(text), seconds >= 3600 else {
            throw ConsoleRefusal(
                status: .badRequest,
                message: "older_than must be a duration of at least 1h, such as 30d, not “\(text)”."
            )
        }
        return (text, seconds)
    }

    func purgePreview(_ request: Request) async throws -> Response {
        try await self.page(request) { frame in
            try self.requireReader(frame)
            let (text, seconds) = try self.purgeAge(Self.queryFields(request))
            // The cut-off is fixed here and travels in the confirm form: a preview left open for a day still
            // deletes only what it counted.
            let cutoff = Int64((self.queue.clock.wallNow.timeIntervalSince1970 - seconds) * 1_000_000)
            let groups = try await self.queue.operations.deadLetterGroups(
                matching: DeadLetterFilter(before: Date(timeIntervalSince1970: Double(cutoff) / 1_000_000), limit: 0)
            )
            let total = groups.reduce(0) { $0 + $1.count }
            return self.render(
                "purge",
                title: "Purge: preview",
                page: PurgeView(
                    summary:
                        "Dry run: nothing is deleted. \(groups.count >= 200 || groups.first?.sampledNewest != nil ? "At least " : "")\(grouped(total)) dead letter(s) died more than \(text) ago and would be deleted for good (no replay after that)\(groups.first?.sampledNewest.map { "; the groups below count the newest \(grouped($0)) of them" } ?? "").",
                    groups: groups.map {
                        PurgeView.Group(count: grouped($0.count), reason: $0.reason, trap: $0.trapID ?? "")
                    },
                    preview: true,
                    any: total > 0,
                    olderThan: text,
                    cutoff: String(cutoff),
                    hasGroups: !groups.isEmpty
                ),
                frame: frame
            )
        }
    }

    func purge(_ request: Request) async throws -> Response {
        try await self.page(request) { frame in
            let (session, form) = try await self.authorizeChange(request, frame: frame)
            let (text, _) = try self.purgeAge(form)
            let now = Int64(self.queue.clock.wallNow.timeIntervalSince1970 * 1_000_000)
            guard let cutoff = form["cutoff"].flatMap({ Int64($0) }), cutoff >= 0, cutoff <= now - 3_600_000_000 else {
                throw ConsoleRefusal(
                    status: .badRequest,
                    message: "A purge is confirmed from its preview: open the preview and use its Delete button."
                )
            }
            let deleted = try await self.queue.operations.purgeDeadLetters(diedBeforeMicros: cutoff)
            self.logChange(session, "purged \(deleted) dead letter(s) older than \(text)")
            return self.message(
                "Deleted \(grouped(deleted)) dead letter(s) that died more than \(text) ago.",
                title: "Purge: done",
                status: .ok,
                frame: frame,
                links: [(self.base + "/dead", "Dead letters")]
            )
        }
    }

    // MARK: pause and resume

    func pause(_ request: Request) async throws -> Response {
        try await self.page(request) { frame in
            let (session, form) = try await self.authorizeChange(request, frame: frame)
            let credential = Self.optional(form["credential"])
            let topic = Self.optional(form["topic"])
            guard credential != nil || topic != nil || form["everything"] == "1" else {
                throw ConsoleRefusal(
                    status: .badRequest,
                    message:
                        "With no credential and no topic a pause stops every job: tick “pause every job” to mean that."
                )
            }
            guard let reason = Self.optional(form["reason"]) else {
                throw ConsoleRefusal(
                    status: .badRequest,
                    message: "A pause needs a reason: the next person on call reads it."
                )
            }
            let pause = try await self.queue.operations.pause(
                credential: credential,
                topic: topic,
                reason: "\(reason) (console: \(session.operatorName))"
            )
            self.logChange(session, "paused \(pause.scope)", ["reason": "\(reason)"])
            return self.redirect("/")
        }
    }

    func resume(_ request: Request) async throws -> Response {
        try await self.page(request) { frame in
            let (session, form) = try await self.authorizeChange(request, frame: frame)
            let credential = Self.optional(form["credential"])
            let topic = Self.optional(form["topic"])
            let removed = try await self.queue.operations.resume(credential: credential, topic: topic)
            self.logChange(
                session,
                removed ? "resumed" : "resume found no pause",
                ["scope": "credential=\(credential ?? "*") topic=\(topic ?? "*")"]
            )
            return self.redirect("/")
        }
    }

    static func optional(_ value: String?) -> String? {
        guard let trimmed = value?.trimmingCharacters(in: .whitespaces), !trimmed.isEmpty else { return nil }
        return trimmed
    }
}
