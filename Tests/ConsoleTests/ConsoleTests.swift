import Foundation
import PostgresNIO
import PushConsole
import PushCore
import PushQueue
import PushQueueTesting
import Testing

@Suite(.serialized) struct ConsoleTests {
    /// The fixture's first due job's device token: no page may show it.
    let firstToken = String(repeating: "0", count: 63) + "1"

    @Test func overviewShowsEveryStateWorkersPausesAndLimits() async throws {
        try await TestPostgres.withDatabase { db in
            try await ConsoleFixture.load(on: db.client, logger: db.logger)
            try await withConsole(db) { port in
                let reader = try await viewer(port: port)
                let page = try await http("GET", port: port, "/", headers: reader)
                #expect(page.status == 200)
                #expect(
                    page.header("Content-Security-Policy")
                        == "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
                )
                #expect(page.header("X-Frame-Options") == "DENY")
                #expect(page.header("Cache-Control") == "no-store")
                for (figure, label) in [
                    ("5", "due now"), ("3", "scheduled"), ("2", "sending now"), ("40", "delivered (kept)"),
                    ("2", "superseded (kept)"), ("30", "dead letters"),
                ] {
                    #expect(
                        page.body.contains("<div class=\"figure\">\(figure)</div><div class=\"label\">\(label)"),
                        "\(label) should read \(figure)"
                    )
                }
                #expect(page.body.contains("40 delivered, 30 dead-lettered"))
                #expect(page.body.contains("<svg class=\"chart\""))
                #expect(page.body.contains("com.example.paused") && page.body.contains("fixture pause"))
                #expect(page.body.contains("<td class=\"n\">500</td><td class=\"n\">100</td>"))
                #expect(page.body.contains("worker-a") && page.body.contains(">live<"))
                #expect(page.body.contains("worker-b") && page.body.contains(">stopped<"))
                // A viewer: no change form, and it says who is signed in.
                #expect(page.body.contains("vera (viewer)"))
                #expect(!page.body.contains("action=\"/pause\"") && !page.body.contains("action=\"/resume\""))
                #expect(!page.body.contains(self.firstToken))
                let css = try await http("GET", port: port, "/assets/console.css", headers: reader)
                #expect(css.status == 200 && css.header("Content-Type")?.hasPrefix("text/css") == true)
            }
        }
    }

    @Test func deadLettersAreGroupedWithTheRunbookAndPagedByKeyset() async throws {
        try await TestPostgres.withDatabase { db in
            try await ConsoleFixture.load(on: db.client, logger: db.logger, dead: 30)
            try await withConsole(db) { port in
                let reader = try await viewer(port: port)
                let page = try await http("GET", port: port, "/dead", headers: reader)
                #expect(page.status == 200)
                // Six kinds in rotation: five of each, each group with its advice or its sentence.
                for kind in ConsoleFixture.deadKinds {
                    #expect(page.body.contains(">\(kind.reason)</a></td><td>\(kind.trap ?? "")</td>"), "\(kind.reason)")
                }
                #expect(page.body.contains("<td class=\"n\">5</td><td><a"))
                let advice = try #require(TrapRunbook.entry(for: "MS020"))
                #expect(page.body.contains("<strong>\(advice.title)</strong>"))
                #expect(page.body.contains("<code>410 Unregistered</code>"))
                #expect(page.body.contains("APNs answered Expired: see the runbook for this reason."))
                #expect(!page.body.contains(String(repeating: "0", count: 56) + "02faf081"))

                // A filter as in `dead list`.
                let filtered = try await http("GET", port: port, "/dead?trap=MS020", headers: reader)
                #expect(filtered.body.contains("Unregistered"))
                #expect(!filtered.body.contains(">BadDeviceToken<"))

                // Keyset pages of 7: every dead letter once, newest first, whatever the depth.
                var seen: [Int64] = []
                var next: String? = "/dead?limit=7"
                var pages = 0
                while let path = next {
                    let result = try await http(
                        "GET",
                        port: port,
                        path.replacingOccurrences(of: "&amp;", with: "&"),
                        headers: reader
                    )
                    #expect(result.status == 200)
                    let ids = result.body.matches(of: /<a href="\/dead\/(\d+)">/).compactMap { Int64($0.1) }
                    seen += ids
                    next = result.body.firstMatch(of: /<a class="button" href="(\/dead\?[^"]*)">Older/).map {
                        String($0.1)
                    }
                    pages += 1
                    #expect(pages < 10)
                }
                #expect(seen.count == 30)
                #expect(Set(seen).count == 30)
                let order = try await db.int64s("SELECT id FROM push.dead_jobs ORDER BY dead_at DESC, id DESC")
                #expect(seen == order)
            }
        }
    }

    @Test("a recipient's job page shows its outcome as its children's counts, each child by fingerprint, no token")
    func recipientJobPage() async throws {
        try await TestPostgres.withDatabase { db in
            let tokens = [String(repeating: "a1", count: 32), String(repeating: "b2", count: 32)]
            for token in tokens {
                try await db.execute(
                    "INSERT INTO push.devices (recipient, topic, token) VALUES ('user:9', 'com.example.app', '\(token)')"
                )
            }
            let id = try await db.int64(
                "INSERT INTO push.jobs (topic, recipient, payload) VALUES ('com.example.app', 'user:9', '{\"aps\":{\"alert\":\"hi\"}}') RETURNING id"
            )
            let claimed = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60))
            _ = try await db.queue.fanOut(claimed, workerID: "w")
            try await db.execute(
                "UPDATE push.jobs SET state = 'delivered', delivered_at = now() WHERE device_token = '\(tokens[0])'"
            )
            try await withConsole(db) { port in
                let reader = try await viewer(port: port)
                let page = try await http("GET", port: port, "/jobs/\(id)", headers: reader)
                #expect(page.status == 200)
                #expect(page.body.contains("<dt>State</dt><dd>fanned_out</dd>"))
                #expect(page.body.contains("<dt>Children</dt><dd>2: 1 delivered, 1 pending</dd>"))
                #expect(page.body.contains("recipient user:9: one child job per live device"))
                #expect(page.body.contains("device fingerprint \(tokenFingerprint(tokens[1]))"))
                #expect(!tokens.contains { page.body.contains($0) })
            }
        }
    }

    @Test(
        "a Live Activity's page: its state, target and budget, every event in order with what became of it, each linking to its job; the overview counts its channel against Apple's 10,000"
    )
    func activityPage() async throws {
        try await TestPostgres.withDatabase { db in
            let token = String(repeating: "c3", count: 32)
            try await db.execute(
                "INSERT INTO push.devices (recipient, topic, token, kind, activity_id) VALUES ('user:9', 'com.example.app', '\(token)', 'activity', 'order-7')"
            )
            try await db.execute(
                "INSERT INTO push.activities (topic, activity_id, recipient) VALUES ('com.example.app', 'order-7', 'user:9')"
            )
            try await db.execute(
                "INSERT INTO push.activities (topic, activity_id, channel_id) VALUES ('com.example.app', 'match-1', 'Y2hhbm5lbC0x')"
            )
            var ids: [Int64] = []
            for (event, ts) in [("update", 100), ("update", 90)] {
                ids.append(
                    try await db.int64(
                        "INSERT INTO push.jobs (topic, activity_id, push_type, payload) VALUES ('com.example.app', 'order-7', 'liveactivity', '{\"aps\":{\"event\":\"\(unescaped: event)\",\"timestamp\":\(unescaped: String(ts))}}') RETURNING id"
                    )
                )
            }
            let claimed = try await db.queue.claim(limit: 10, workerID: "w", lease: .seconds(60))
            _ = try await db.queue.routeActivities(claimed, workerID: "w")
            let first = ids[0]
            try await withConsole(db) { port in
                let reader = try await viewer(port: port)
                let page = try await http("GET", port: port, "/activities/1", headers: reader)
                #expect(page.status == 200)
                #expect(page.body.contains("<dt>State</dt><dd>started</dd>"))
                #expect(page.body.contains("<dt>Target</dt><dd>recipient user:9</dd>"))
                #expect(page.body.contains("sent: 0 of 1 delivered"))
                #expect(page.body.contains("StaleTimestamp"))
                #expect(page.body.contains("/jobs/\(first)\">\(first)</a>"))
                #expect(!page.body.contains(token))
                let missing = try await http("GET", port: port, "/activities/99", headers: reader)
                #expect(missing.status == 404)
                let overview = try await http("GET", port: port, "/", headers: reader)
                #expect(overview.body.contains("Live Activity channels (production, of 10,000)"))
            }
        }
    }

    @Test("an Android job's page names the platform and shows the FCM request, never the registration token")
    func fcmJobPage() async throws {
        try await TestPostgres.withDatabase { db in
            let token = "fKx9Secret:APA91bH-registration-token"
            let id = try await db.int64(
                "INSERT INTO push.jobs (platform, topic, device_token, payload) VALUES ('fcm', 'com.example.app', '\(unescaped: token)', '{\"notification\":{\"title\":\"Order shipped\"}}') RETURNING id"
            )
            try await withConsole(db) { port in
                let reader = try await viewer(port: port)
                let page = try await http("GET", port: port, "/jobs/\(id)", headers: reader)
                #expect(page.status == 200)
                #expect(page.body.contains("FCM (Android)"))
                #expect(
                    page.body.contains("POST https://fcm.googleapis.com/v1/projects/&lt;project_id&gt;/messages:send")
                )
                #expect(!page.body.contains(token))
                let withPayload = try await http("GET", port: port, "/jobs/\(id)?payload=1", headers: reader)
                #expect(withPayload.body.contains("Order shipped") && withPayload.body.contains("push_id"))
                #expect(!withPayload.body.contains(token))
            }
        }
    }

    @Test func detailPagesShowHistoryAndTheRequestButNotTheToken() async throws {
        try await TestPostgres.withDatabase { db in
            try await ConsoleFixture.load(on: db.client, logger: db.logger)
            let deadID = try await db.int64("SELECT min(id) FROM push.dead_jobs WHERE reason = 'Unregistered'")
            let deadToken = try await db.strings("SELECT device_token FROM push.dead_jobs WHERE id = \(deadID)")[0]
            let deliveredID = try await db.int64("SELECT min(id) FROM push.jobs WHERE state = 'delivered'")
            try await withConsole(db) { port in
                let reader = try await viewer(port: port)
                let letter = try await http("GET", port: port, "/dead/\(deadID)", headers: reader)
                #expect(letter.status == 200)
                #expect(letter.body.contains("Dead letter \(deadID)"))
                #expect(letter.body.contains("MS020: tokens rotate"))
                #expect(letter.body.contains("<td>dead</td>"))
                #expect(
                    letter.body.contains(
                        "POST https://api.push.apple.com/3/device/&lt;token fp \(tokenFingerprint(deadToken))&gt;"
                    )
                )
                #expect(letter.body.contains("apns-push-type: alert"))
                #expect(!letter.body.contains(deadToken))
                // The payload only on request.
                #expect(!letter.body.contains("Order shipped"))
                let withPayload = try await http("GET", port: port, "/dead/\(deadID)?payload=1", headers: reader)
                #expect(withPayload.body.contains("Order shipped"))
                #expect(!withPayload.body.contains(deadToken))

                let job = try await http("GET", port: port, "/jobs/\(deliveredID)", headers: reader)
                #expect(job.status == 200)
                #expect(job.body.contains("<dt>State</dt><dd>delivered</dd>"))
                #expect(job.body.contains("<dt>Latency</dt><dd>40 ms</dd>"))

                // Each id finds its page, and a missing one says so.
                let moved = try await http("GET", port: port, "/jobs/\(deadID)", headers: reader)
                #expect(moved.status == 303 && moved.header("Location") == "/dead/\(deadID)")
                let found = try await http("GET", port: port, "/jobs?id=\(deliveredID)", headers: reader)
                #expect(found.status == 303 && found.header("Location") == "/jobs/\(deliveredID)")
                let missing = try await http("GET", port: port, "/jobs/999999999999", headers: reader)
                #expect(missing.status == 404 && missing.body.contains("No job 999999999999"))
                let bad = try await http("GET", port: port, "/jobs?id=abc", headers: reader)
                #expect(bad.status == 400)
            }
        }
    }

    @Test func everyChangeIsRefusedWithoutTokenSessionOrCSRF() async throws {
        try await TestPostgres.withDatabase { db in
            try await ConsoleFixture.load(on: db.client, logger: db.logger)
            let deadID = try await db.int64("SELECT min(id) FROM push.dead_jobs")
            let before = try await db.int64("SELECT count(*) FROM push.dead_jobs")
            // Read-only: no token file.
            try await withConsole(db) { port in
                let replay = try await http(
                    "POST",
                    port: port,
                    "/dead/replay",
                    form: ["ids": "\(deadID)", "csrf": "x"]
                )
                #expect(replay.status == 403 && replay.body.contains("read-only"))
                let login = try await http(
                    "POST",
                    port: port,
                    "/login",
                    form: ["operator": "eve", "token": consoleToken]
                )
                #expect(login.status == 403)
                let pause = try await http("POST", port: port, "/pause", form: ["reason": "x"])
                #expect(pause.status == 403)
            }
            let logs = LogCapture()
            try await withConsole(db, token: consoleToken, logs: logs) { port in
                // No session.
                let anonymous = try await http("POST", port: port, "/dead/replay", form: ["ids": "\(deadID)"])
                #expect(anonymous.status == 403 && anonymous.body.contains("sign in"))
                // Wrong token, and a name that cannot go into a log line.
                let wrong = try await http(
                    "POST",
                    port: port,
                    "/login",
                    form: ["operator": "eve", "token": "guess-guess-guess"]
                )
                #expect(wrong.status == 403 && wrong.body.contains("Wrong token") && wrong.sessionCookie == nil)
                let badName = try await http(
                    "POST",
                    port: port,
                    "/login",
                    form: ["operator": "a\nb", "token": consoleToken]
                )
                #expect(badName.status == 400)
                // A forged cookie.
                let forged = try await http(
                    "POST",
                    port: port,
                    "/dead/replay",
                    headers: ["Cookie": "pushworker_session=abc.1.YWxpY2U.def"],
                    form: ["ids": "\(deadID)", "csrf": "abc"]
                )
                #expect(forged.status == 403 && forged.body.contains("sign in"))

                let (cookie, csrf) = try await signIn(port: port)
                // Session but no CSRF, or a wrong one: a cross-site form.
                let noCSRF = try await http(
                    "POST",
                    port: port,
                    "/dead/replay",
                    headers: ["Cookie": cookie],
                    form: ["ids": "\(deadID)"]
                )
                #expect(noCSRF.status == 403 && noCSRF.body.contains("CSRF"))
                let wrongCSRF = try await http(
                    "POST",
                    port: port,
                    "/dead/replay",
                    headers: ["Cookie": cookie],
                    form: ["ids": "\(deadID)", "csrf": String(repeating: "0", count: 64)]
                )
                #expect(wrongCSRF.status == 403 && wrongCSRF.body.contains("CSRF"))
                let crossSite = try await http(
                    "POST",
                    port: port,
                    "/dead/replay",
                    headers: ["Cookie": cookie, "Origin": "https://evil.example"],
                    form: ["ids": "\(deadID)", "csrf": csrf]
                )
                #expect(crossSite.status == 403 && crossSite.body.contains("evil.example"))
                #expect(try await db.int64("SELECT count(*) FROM push.dead_jobs") == before)

                // Everything right: it moves.
                let done = try await http(
                    "POST",
                    port: port,
                    "/dead/replay",
                    headers: ["Cookie": cookie, "Origin": "http://127.0.0.1:\(port)"],
                    form: ["ids": "\(deadID)", "confirm_ids": "\(deadID)", "csrf": csrf]
                )
                #expect(done.status == 200 && done.body.contains("Replayed 1 dead letter"))
                #expect(try await db.int64("SELECT count(*) FROM push.dead_jobs") == before - 1)
                #expect(
                    try await db.int64("SELECT count(*) FROM push.jobs WHERE id = \(deadID) AND state = 'pending'") == 1
                )
                // Who did what is logged; a wrong token too; the token itself never.
                let change = try #require(logs.entries.first { $0.message.hasPrefix("console change: replayed") })
                #expect(change.message == "console change: replayed 1 dead letter(s)")
                #expect(change.metadata["operator"] == "alice")
                #expect(change.metadata["selection"] == "ids=\(deadID)")
                #expect(logs.entries.contains { $0.message.contains("wrong token") && $0.level == .warning })
                #expect(logs.entries.contains { $0.message == "console sign-in" && $0.metadata["operator"] == "alice" })
                #expect(!logs.text.contains(consoleToken) && !logs.text.contains(csrf))
            }
        }
    }

    @Test func replayPreviewShowsConflictsAndMovesNothingUntilConfirmed() async throws {
        try await TestPostgres.withDatabase { db in
            try await ConsoleFixture.load(on: db.client, logger: db.logger)
            let ids = try await db.int64s("SELECT id FROM push.dead_jobs WHERE reason = 'Unregistered' ORDER BY id")
            let conflicted = ids[0]
            // A job already in the queue with the dead letter's id: a replay must not overwrite it.
            try await db.client.withTransaction(logger: db.logger) { connection in
                try await connection.query("SELECT set_config('push.internal_insert', 'on', true)", logger: db.logger)
                try await connection.query(
                    """
                    INSERT INTO push.jobs (id, topic, device_token, payload) OVERRIDING SYSTEM VALUE
                    VALUES (\(conflicted), 'com.example.app', \(String(repeating: "ab", count: 32)), '{"aps":{"alert":"x"}}')
                    """,
                    logger: db.logger
                )
            }
            try await withConsole(db, token: consoleToken) { port in
                let (cookie, csrf) = try await signIn(port: port)
                let preview = try await http("GET", port: port, "/dead/replay?trap=MS020", headers: ["Cookie": cookie])
                #expect(preview.status == 200)
                #expect(
                    preview.body.contains("Dry run: nothing has moved. \(ids.count - 1) dead letter(s) would go back")
                )
                #expect(preview.body.contains("Conflicts: stay dead"))
                #expect(preview.body.contains("<li><a href=\"/dead/\(conflicted)\">\(conflicted)</a></li>"))
                #expect(preview.body.contains("Replay these \(ids.count - 1) now"))
                let confirmIDs = try #require(
                    preview.body.firstMatch(of: /name="confirm_ids" value="([0-9,]+)"/).map { String($0.1) }
                )
                #expect(confirmIDs.split(separator: ",").map(String.init) == ids.dropFirst().map(String.init))
                #expect(
                    try await db.int64("SELECT count(*) FROM push.dead_jobs WHERE 'MS020' = ANY (trap_ids)")
                        == Int64(ids.count)
                )
                // An unrestricted replay needs all=1.
                let unrestricted = try await http("GET", port: port, "/dead/replay", headers: ["Cookie": cookie])
                #expect(unrestricted.status == 400 && unrestricted.body.contains("all=1"))

                let done = try await http(
                    "POST",
                    port: port,
                    "/dead/replay",
                    headers: ["Cookie": cookie],
                    form: ["trap": "MS020", "confirm_ids": confirmIDs, "csrf": csrf]
                )
                #expect(done.status == 200)
                #expect(done.body.contains("Replayed \(ids.count - 1) dead letter(s)"))
                #expect(
                    try await db.int64s("SELECT id FROM push.dead_jobs WHERE 'MS020' = ANY (trap_ids)") == [conflicted]
                )
            }
        }
    }

    @Test func pauseResumeAndPurgeFromForms() async throws {
        try await TestPostgres.withDatabase { db in
            try await ConsoleFixture.load(on: db.client, logger: db.logger)
            try await db.execute(
                "UPDATE push.dead_jobs SET dead_at = now() - interval '40 days' WHERE id IN (SELECT id FROM push.dead_jobs ORDER BY id LIMIT 3)"
            )
            try await withConsole(db, token: consoleToken) { port in
                let (cookie, csrf) = try await signIn(port: port, name: "bob")
                let paused = try await http(
                    "POST",
                    port: port,
                    "/pause",
                    headers: ["Cookie": cookie],
                    form: ["credential": "default", "topic": "", "reason": "APNs incident", "csrf": csrf]
                )
                #expect(paused.status == 303)
                let reasons = try await db.strings("SELECT reason FROM push.pauses WHERE credential = 'default'")
                #expect(reasons == ["APNs incident (console: bob)"])
                let noReason = try await http(
                    "POST",
                    port: port,
                    "/pause",
                    headers: ["Cookie": cookie],
                    form: ["topic": "x", "reason": " ", "csrf": csrf]
                )
                #expect(noReason.status == 400)
                let resumed = try await http(
                    "POST",
                    port: port,
                    "/resume",
                    headers: ["Cookie": cookie],
                    form: ["credential": "default", "csrf": csrf]
                )
                #expect(resumed.status == 303)
                #expect(try await db.int64("SELECT count(*) FROM push.pauses WHERE credential = 'default'") == 0)

                let preview = try await http(
                    "GET",
                    port: port,
                    "/dead/purge?older_than=30d",
                    headers: ["Cookie": cookie]
                )
                #expect(preview.body.contains("Dry run: nothing is deleted. 3 dead letter(s)"))
                let cutoff = try #require(
                    preview.body.firstMatch(of: /name="cutoff" value="([0-9]+)"/).map { String($0.1) }
                )
                #expect(try await db.int64("SELECT count(*) FROM push.dead_jobs") == 30)
                let tooShort = try await http(
                    "GET",
                    port: port,
                    "/dead/purge?older_than=5m",
                    headers: ["Cookie": cookie]
                )
                #expect(tooShort.status == 400)
                let purged = try await http(
                    "POST",
                    port: port,
                    "/dead/purge",
                    headers: ["Cookie": cookie],
                    form: ["older_than": "30d", "cutoff": cutoff, "csrf": csrf]
                )
                #expect(purged.status == 200 && purged.body.contains("Deleted 3 dead letter(s)"))
                #expect(try await db.int64("SELECT count(*) FROM push.dead_jobs") == 27)
                // Signing out ends the session: its cookie no longer changes anything.
                let out = try await http(
                    "POST",
                    port: port,
                    "/logout",
                    headers: ["Cookie": cookie],
                    form: ["csrf": csrf]
                )
                #expect(out.status == 303 && out.header("Set-Cookie")?.contains("Max-Age=0") == true)
            }
        }
    }

    @Test func servesUnderABasePath() async throws {
        try await TestPostgres.withDatabase { db in
            try await ConsoleFixture.load(on: db.client, logger: db.logger)
            try await withConsole(db, token: consoleToken, basePath: "/push/") { port in
                let page = try await http("GET", port: port, "/push")
                #expect(page.status == 200)
                #expect(
                    page.body.contains("href=\"/push/dead\"") && page.body.contains("href=\"/push/assets/console.css\"")
                )
                #expect(try await http("GET", port: port, "/push/dead").status == 403)
                let reader = try await viewer(port: port, base: "/push")
                #expect(try await http("GET", port: port, "/push/dead", headers: reader).status == 200)
                #expect(try await http("GET", port: port, "/push/assets/console.css").status == 200)
                #expect(try await http("GET", port: port, "/dead").status == 404)
                let login = try await http(
                    "POST",
                    port: port,
                    "/push/login",
                    form: ["operator": "carol", "token": consoleToken]
                )
                #expect(login.status == 303 && login.header("Location") == "/push/")
                #expect(login.header("Set-Cookie")?.contains("Path=/push") == true)
                #expect(login.header("Set-Cookie")?.contains("SameSite=Strict") == true)
                #expect(login.header("Set-Cookie")?.contains("HttpOnly") == true)
            }
        }
    }

    /// docs/runbook.md's "Runbook: trap ids" is the console's advice, word for word.
    @Test func runbookInTheDocsIsTheConsolesRunbook() throws {
        let docs = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("docs/runbook.md")
        let text = try String(contentsOf: docs, encoding: .utf8)
        let section = try #require(text.range(of: "## Runbook: trap ids"))
        let rest = text[section.lowerBound...]
        let end = rest.dropFirst(3).range(of: "\n## ")?.lowerBound ?? rest.endIndex
        let documented = String(rest[..<end]).trimmingCharacters(in: .newlines)
        #expect(
            documented == TrapRunbook.markdown.trimmingCharacters(in: .newlines),
            "docs/runbook.md and Sources/PushCore/TrapRunbook.swift differ: edit TrapRunbook and copy its markdown into the docs"
        )
        // Every trap id the worker records has advice.
        for trap in TrapID.all + TrapID.warnings + TrapID.fcm {
            #expect(TrapRunbook.entry(for: trap.rawValue) != nil, "no runbook entry for \(trap)")
        }
    }
}

extension TestDatabase {
    func int64s(_ sql: String) async throws -> [Int64] { try await self.int64s(PostgresQuery(unsafeSQL: sql)) }
    func int64(_ sql: String) async throws -> Int64 { try await self.int64(PostgresQuery(unsafeSQL: sql)) }

    func strings(_ sql: String) async throws -> [String] {
        var values: [String] = []
        for try await value in try await self.client.query(PostgresQuery(unsafeSQL: sql), logger: self.logger)
            .decode(String.self)
        {
            values.append(value)
        }
        return values
    }
}
