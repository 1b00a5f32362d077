import Foundation
import Hummingbird
import PushCore
import PushQueue

extension ConsolePages {
    // MARK: overview

    func overview(_ request: Request) async throws -> Response {
        try await self.page(request) { frame in
            // Without a session: counts and the chart only (no topic, reason, host or sentence).
            let reader = frame.session != nil
            async let overview = self.queue.operations.consoleOverview()
            async let minutes = self.queue.operations.outcomesByMinute(minutes: 60)
            async let pauses = reader ? self.queue.pauses() : []
            async let limits = reader ? self.queue.operations.rateLimits() : []
            async let workers = reader ? self.queue.operations.workers() : []
            async let deadMix =
                reader
                ? self.queue.operations.deadLetterGroups(
                    matching: DeadLetterFilter(since: self.queue.clock.wallNow.addingTimeInterval(-3600), limit: 0)
                ) : []
            async let channels = self.queue.operations.activityChannelCounts()
            let (o, m, p, l, w, d) = try await (overview, minutes, pauses, limits, workers, deadMix)
            let now = self.queue.clock.wallNow
            // Apple allows an app 10,000 broadcast channels per environment: shown once Live Activities use any.
            let channelCards = try await channels.sorted { $0.key < $1.key }.map { environment, count in
                OverviewView.Card(
                    label: "Live Activity channels (\(environment), of 10,000)",
                    value: String(count),
                    alert: count > 9_000
                )
            }
            let cards =
                [
                    OverviewView.Card(label: "due now", value: o.pendingDue.shown, alert: false),
                    OverviewView.Card(
                        label: "scheduled (retries, later run_at)",
                        value: o.pendingScheduled.shown,
                        alert: false
                    ),
                    OverviewView.Card(label: "sending now", value: o.running.shown, alert: false),
                    OverviewView.Card(
                        label: "oldest due waits",
                        value: HumanText.duration(o.oldestDueAgeSeconds),
                        alert: o.oldestDueAgeSeconds > 60
                    ),
                    OverviewView.Card(label: "delivered (kept)", value: o.delivered.shown, alert: false),
                    OverviewView.Card(label: "superseded (kept)", value: o.superseded.shown, alert: false),
                    OverviewView.Card(
                        label: "dead letters",
                        value: o.deadLetters.shown,
                        alert: o.deadLetters.value > 0
                    ),
                ] + channelCards
            let view = OverviewView(
                cards: cards,
                chart: ConsoleChart.svg(m),
                deliveredHour: grouped(m.reduce(0) { $0 + $1.delivered }),
                deadHour: grouped(m.reduce(0) { $0 + $1.dead }),
                deadMix: d.prefix(8).map { group in
                    OverviewView.DeadMix(
                        reason: group.reason,
                        reasonQuery: Self.query(group.reason),
                        count: grouped(group.count),
                        trap: group.trapID,
                        diedWith: Self.query(group.trapID ?? "none")
                    )
                },
                pauses: p.map { pause in
                    OverviewView.PauseRow(
                        credential: pause.credential ?? "any",
                        topic: pause.topic ?? "any",
                        credentialValue: pause.credential ?? "",
                        topicValue: pause.topic ?? "",
                        reason: pause.reason,
                        age: HumanText.duration(now.timeIntervalSince(pause.createdAt)) + " ago",
                        createdBy: pause.createdBy
                    )
                },
                limits: l.map { limit in
                    OverviewView.LimitRow(
                        credential: limit.credential ?? "any",
                        topic: limit.topic ?? "any",
                        perSecond: String(format: "%g", limit.perSecond),
                        burst: grouped(limit.burst),
                        available: grouped(limit.available)
                    )
                },
                workers: w.map { worker in
                    let silent = now.timeIntervalSince(worker.heartbeatAt)
                    let state = worker.stoppedAt != nil ? "stopped" : silent > 60 ? "stale" : "live"
                    return OverviewView.WorkerRow(
                        id: worker.workerID,
                        host: worker.host,
                        pid: worker.pid,
                        credentials: worker.credentials.joined(separator: ", "),
                        heartbeat: HumanText.duration(silent) + " ago",
                        state: state,
                        stateClass: state
                    )
                },
                hasDeadMix: !d.isEmpty,
                hasPauses: !p.isEmpty,
                hasLimits: !l.isEmpty,
                hasWorkers: !w.isEmpty
            )
            return self.render("overview", title: "Overview", page: view, frame: frame)
        }
    }

    // MARK: dead letters

    /// The dead-letter filter from a query string or form, as `dead list` takes it.
    func deadFilter(_ fields: [String: String], limit defaultLimit: Int = 50) throws -> DeadLetterFilter {
        func field(_ name: String) -> String? {
            guard let value = fields[name]?.trimmingCharacters(in: .whitespaces), !value.isEmpty else { return nil }
            return value
        }
        var filter = DeadLetterFilter(limit: defaultLimit)
        filter.trapID = field("trap")
        if let diedWith = field("died_with") { filter.lastTrap = .some(diedWith == "none" ? nil : diedWith) }
        filter.reason = field("reason")
        filter.topic = field("topic")
        if let since = field("since") {
            guard let seconds = parseDuration(since) else {
                throw ConsoleRefusal(
                    status: .badRequest,
                    message: "since must be a duration such as 30m, 24h or 7d, not “\(since)”."
                )
            }
            filter.since = self.queue.clock.wallNow.addingTimeInterval(-seconds)
        }
        if let limit = field("limit") {
            guard let n = Int(limit), (1...500).contains(n) else {
                throw ConsoleRefusal(status: .badRequest, message: "limit must be a number from 1 to 500.")
            }
            filter.limit = n
        }
        if let ids = field("ids") {
            let parsed = ids.split(whereSeparator: { $0 == "," || $0 == " " }).map { Int64($0) }
            guard !parsed.isEmpty, parsed.allSatisfy({ $0 != nil }) else {
                throw ConsoleRefusal(status: .badRequest, message: "ids must be job ids separated by commas.")
            }
            filter.ids = parsed.compactMap { $0 }
        }
        return filter
    }

    static func queryFields(_ request: Request) -> [String: String] {
        var fields: [String: String] = [:]
        for (name, value) in request.uri.queryParameters { fields[String(name)] = String(value) }
        return fields
    }

    static func query(_ value: String) -> String {
        value.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? value
    }

    /// `trap=…&reason=…` for the fields given.
    static func queryString(_ pairs: [(String, String?)]) -> String {
        pairs.compactMap { name, value in value.map { "\(name)=\(query($0))" } }.joined(separator: "&")
    }

    func deadLetters(_ request: Request) async throws -> Response {
        try await self.page(request) { frame in
            try self.requireReader(frame)
            let fields = Self.queryFields(request)
            let filter = try self.deadFilter(fields)
            var cursor: DeadLetterCursor?
            if let after = fields["after"], !after.isEmpty {
                guard let parsed = DeadLetterCursor(after) else {
                    throw ConsoleRefusal(
                        status: .badRequest,
                        message: "after is not a page cursor: follow the Older link."
                    )
                }
                cursor = parsed
            }
            var groupFilter = filter
            groupFilter.limit = 0
            // The groups head the first page only: later pages are the same groups, and each costs a pass
            // over the matching dead letters.
            async let groups =
                cursor == nil ? self.queue.operations.deadLetterGroups(matching: groupFilter) : [DeadLetterGroup]()
            async let letters = self.queue.operations.deadLetterPage(matching: filter, after: cursor)
            let (g, page) = try await (groups, letters)
            let filterQuery: [(String, String?)] = [
                ("ids", fields["ids"].flatMap { $0.isEmpty ? nil : $0 }), ("trap", filter.trapID),
                ("died_with", fields["died_with"].flatMap { $0.isEmpty ? nil : $0 }), ("reason", filter.reason),
                ("topic", filter.topic), ("since", fields["since"].flatMap { $0.isEmpty ? nil : $0 }),
            ]
            let next =
                page.count == filter.limit
                ? Self.queryString(
                    filterQuery + [("limit", String(filter.limit)), ("after", page.last?.cursor.description)]
                )
                : nil
            let since = fields["since"].flatMap { $0.isEmpty ? nil : $0 }
            let view = DeadLettersView(
                filter: DeadLettersView.Filter(
                    trap: filter.trapID ?? "",
                    reason: filter.reason ?? "",
                    topic: filter.topic ?? "",
                    since: fields["since"] ?? "",
                    limit: String(filter.limit),
                    diedWith: fields["died_with"].flatMap { $0.isEmpty ? nil : $0 },
                    ids: fields["ids"].flatMap { $0.isEmpty ? nil : $0 }
                ),
                filtered: !groupFilter.isUnrestricted,
                paged: cursor != nil,
                sampled: g.first?.sampledNewest.map {
                    "Counts are of the newest \(grouped($0)) matching dead letters."
                },
                groups: g.map { group in
                    DeadLettersView.Group(
                        count: grouped(group.count),
                        reason: group.reason,
                        trap: group.trapID ?? "",
                        newest: timestamp(group.newest),
                        example: group.example,
                        query: Self.queryString([
                            ("reason", group.reason), ("died_with", group.trapID ?? "none"), ("topic", filter.topic),
                            ("since", since),
                        ]),
                        advice: group.trapID.flatMap { trap in
                            TrapRunbook.entry(for: trap).map {
                                AdviceView(code: trap, title: $0.title, html: RunbookHTML.render($0.markdown))
                            }
                        }
                    )
                },
                letters: page.map { letter in
                    DeadLettersView.Letter(
                        id: letter.id,
                        deadAt: timestamp(letter.deadAt),
                        reason: letter.reason,
                        status: letter.status.map(String.init),
                        traps: letter.trapIDs.joined(separator: " "),
                        topic: letter.topic,
                        target: letter.target,
                        attempts: letter.attempts,
                        error: letter.error
                    )
                },
                next: next,
                hasGroups: !g.isEmpty,
                hasLetters: !page.isEmpty
            )
            return self.render("dead", title: "Dead letters", page: view, frame: frame)
        }
    }

    // MARK: one dead letter, one job

    func deadLetter(_ request: Request, id: Int64?) async throws -> Response {
        try await self.page(request) { frame in
            let session = try self.requireReader(frame)
            guard let id else { throw ConsoleRefusal(status: .badRequest, message: "A dead letter's id is a number.") }
            guard var letter = try await self.queue.operations.deadLetter(id: id) else {
                if try await self.queue.operations.job(id: id) != nil { return self.redirect("/jobs/\(id)") }
                throw ConsoleRefusal(
                    status: .notFound,
                    message: "No dead letter \(id) (nor job: it may have been purged)."
                )
            }
            let job = letter.job
            var facts: [(String, String)] = [
                ("Died", timestamp(letter.deadAt)),
                ("Reason", letter.reason + (letter.status.map { " (HTTP \($0))" } ?? "")),
                ("Trap ids", job.trapIDs.map(\.rawValue).joined(separator: " ")),
            ]
            facts += Self.jobFacts(job)
            if let unique = letter.apnsUniqueID { facts.append(("apns-unique-id", unique)) }
            // The request a replay would send: a replay starts the default expiry afresh.
            letter.job.firstAttemptAt = nil
            let showPayload = Self.queryFields(request)["payload"] == "1"
            if showPayload { self.logPayloadRead(session, "dead letter \(id)") }
            var view = self.detailView(
                job: letter.job,
                facts: facts,
                historyJSON: letter.historyJSON,
                showPayload: showPayload
            )
            view.error = letter.error
            view.id = id
            return self.render("letter", title: "Dead letter \(id)", page: view, frame: frame)
        }
    }

    func job(_ request: Request, id: Int64?) async throws -> Response {
        try await self.page(request) { frame in
            let session = try self.requireReader(frame)
            guard let id else { throw ConsoleRefusal(status: .badRequest, message: "A job id is a number.") }
            guard let details = try await self.queue.operations.job(id: id) else {
                if try await self.queue.operations.deadLetter(id: id) != nil { return self.redirect("/dead/\(id)") }
                throw ConsoleRefusal(
                    status: .notFound,
                    message: "No job \(id) in push.jobs or push.dead_jobs (retention may have pruned it)."
                )
            }
            var facts: [(String, String)] = [("State", details.state.rawValue)]
            if let status = details.status { facts.append(("Last status", String(status))) }
            if let reason = details.reason { facts.append(("Last reason", reason)) }
            if let delivered = details.deliveredAt { facts.append(("Delivered", timestamp(delivered))) }
            if let latency = details.latencyMs { facts.append(("Latency", "\(latency) ms")) }
            if let last = details.lastAttemptAt { facts.append(("Last attempt", timestamp(last))) }
            if let holder = details.lockedBy, details.state == .running {
                facts.append(("Held by", holder + " until " + timestamp(details.lockedUntil)))
            }
            if let newer = details.supersededBy { facts.append(("Superseded by", "job \(newer)")) }
            if !details.children.isEmpty {
                // A recipient's job that fanned out: its outcome is its children's, as counts, then each.
                let counts = Dictionary(grouping: details.children, by: \.state).mapValues(\.count)
                facts.append(
                    (
                        "Children",
                        "\(details.children.count): "
                            + counts.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", ")
                    )
                )
                for child in details.children.prefix(50) {
                    facts.append(
                        (
                            "Child job \(child.id)",
                            "\(child.state), device fingerprint \(child.tokenFingerprint), \(child.environment)"
                                + (child.state == "delivered" ? "" : child.reason.map { ", \($0)" } ?? "")
                        )
                    )
                }
            }
            if !details.job.trapIDs.isEmpty {
                facts.append(("Trap ids", details.job.trapIDs.map(\.rawValue).joined(separator: " ")))
            }
            facts += Self.jobFacts(details.job)
            if let unique = details.apnsUniqueID { facts.append(("apns-unique-id", unique)) }
            let showPayload = Self.queryFields(request)["payload"] == "1"
            if showPayload { self.logPayloadRead(session, "job \(id)") }
            let view = self.detailView(
                job: details.job,
                facts: facts,
                historyJSON: details.historyJSON,
                showPayload: showPayload
            )
            return self.render("job", title: "Job \(id)", page: view, frame: frame)
        }
    }

    func findJob(_ request: Request) async throws -> Response {
        try await self.page(request) { frame in
            try self.requireReader(frame)
            let text = Self.queryFields(request)["id"]?.trimmingCharacters(in: .whitespaces) ?? ""
            guard let id = Int64(text) else {
                throw ConsoleRefusal(status: .badRequest, message: "A job id is a number, not “\(text)”.")
            }
            return self.redirect("/jobs/\(id)")
        }
    }
}
