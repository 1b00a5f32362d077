import Foundation
import PostgresNIO
import PushConsole
import PushQueue
import PushQueueTesting
import Testing

/// The console against hostile input and stale forms: each case here was a way to crash it, read it from
/// another site, or make a confirm step do more than its preview showed.
@Suite(.serialized) struct ConsoleHardeningTests {
    @Test func hostileDurationsCursorsAndHostsAreRefusedNotCrashed() async throws {
        try await TestPostgres.withDatabase { db in
            try await ConsoleFixture.load(on: db.client, logger: db.logger)
            try await withConsole(db, token: consoleToken, publicHosts: ["ops.example.com"]) { port in
                for path in [
                    "/dead?since=1e13s", "/dead?since=infd", "/dead?since=nand", "/dead?since=-5h",
                    "/dead/purge?older_than=200000000d", "/dead/purge?older_than=infh",
                    "/dead/replay?trap=MS020&expires_in=1e300s", "/dead?after=9223372036854775807-1",
                    "/dead?after=-5-1", "/dead?after=abc", "/dead?limit=100000", "/dead?ids=1,x",
                ] {
                    let result = try await http("GET", port: port, path)
                    #expect(result.status == 400, "\(path): \(result.status) \(result.body.prefix(200))")
                    #expect(result.header("Content-Security-Policy") != nil)
                }
                // Still up.
                #expect(try await http("GET", port: port, "/").status == 200)

                // DNS rebinding: a page whose name resolves to 127.0.0.1 sends its own Host.
                let rebound = try await http("GET", port: port, "/dead/1?payload=1", headers: ["Host": "evil.example"])
                #expect(rebound.status == 421 && rebound.body.contains("--public-host"))
                #expect(rebound.header("Content-Security-Policy") != nil)
                let proxied = try await http("GET", port: port, "/", headers: ["Host": "ops.example.com"])
                #expect(proxied.status == 200)
                let local = try await http("GET", port: port, "/", headers: ["Host": "localhost:\(port)"])
                #expect(local.status == 200)
            }
        }
    }

    @Test func everyChangeEndpointNeedsTheCSRFTokenAndTheSameSite() async throws {
        try await TestPostgres.withDatabase { db in
            try await ConsoleFixture.load(on: db.client, logger: db.logger)
            let logs = LogCapture()
            try await withConsole(db, token: consoleToken, logs: logs) { port in
                let (cookie, csrf) = try await signIn(port: port)
                let forms: [(String, [String: String])] = [
                    ("/dead/replay", ["trap": "MS020", "confirm_ids": "1"]),
                    ("/dead/purge", ["older_than": "1h", "cutoff": "0"]),
                    ("/pause", ["topic": "x", "reason": "r"]), ("/resume", ["topic": "x"]), ("/logout", [:]),
                ]
                for (path, form) in forms {
                    let missing = try await http("POST", port: port, path, headers: ["Cookie": cookie], form: form)
                    #expect(missing.status == 403 && missing.body.contains("CSRF"), "\(path) without CSRF")
                    var signed = form
                    signed["csrf"] = csrf
                    let crossSite = try await http(
                        "POST",
                        port: port,
                        path,
                        headers: ["Cookie": cookie, "Sec-Fetch-Site": "cross-site"],
                        form: signed
                    )
                    #expect(crossSite.status == 403, "\(path) from another site")
                }
                #expect(try await db.int64("SELECT count(*) FROM push.pauses WHERE topic = 'x'") == 0)
                #expect(try await db.int64("SELECT count(*) FROM push.dead_jobs") == 30)

                // A pause of everything must be meant.
                let blank = try await http(
                    "POST",
                    port: port,
                    "/pause",
                    headers: ["Cookie": cookie],
                    form: ["reason": "incident", "csrf": csrf]
                )
                #expect(blank.status == 400 && blank.body.contains("every job"))
                let everything = try await http(
                    "POST",
                    port: port,
                    "/pause",
                    headers: ["Cookie": cookie],
                    form: ["reason": "incident\nconsole change: forged line", "everything": "1", "csrf": csrf]
                )
                #expect(everything.status == 303)
                #expect(
                    try await db.int64("SELECT count(*) FROM push.pauses WHERE credential IS NULL AND topic IS NULL")
                        == 1
                )
                // The reason's newline is escaped in the log: it cannot start a line of its own.
                let pauseLine = try #require(logs.entries.first { $0.message.hasPrefix("console change: paused") })
                #expect(pauseLine.metadata["reason"] == "incident\\nconsole change: forged line")
                #expect(!logs.entries.contains { $0.message == "console change: forged line" })

                // Signing out ends the session for whoever still holds the cookie.
                let out = try await http(
                    "POST",
                    port: port,
                    "/logout",
                    headers: ["Cookie": cookie],
                    form: ["csrf": csrf]
                )
                #expect(out.status == 303)
                let replayed = try await http(
                    "POST",
                    port: port,
                    "/resume",
                    headers: ["Cookie": cookie],
                    form: ["everything": "1", "csrf": csrf]
                )
                #expect(replayed.status == 403 && replayed.body.contains("sign in"))
                #expect(try await db.int64("SELECT count(*) FROM push.pauses") == 2)
            }
        }
    }

    @Test func confirmStepsDoOnlyWhatThePreviewShowed() async throws {
        try await TestPostgres.withDatabase { db in
            try await ConsoleFixture.load(on: db.client, logger: db.logger)
            try await withConsole(db, token: consoleToken) { port in
                let (cookie, csrf) = try await signIn(port: port)
                let preview = try await http(
                    "GET",
                    port: port,
                    "/dead/replay?died_with=MS020",
                    headers: ["Cookie": cookie]
                )
                let confirmIDs = try #require(
                    preview.body.firstMatch(of: /name="confirm_ids" value="([0-9,]+)"/).map { String($0.1) }
                )
                let previewed = confirmIDs.split(separator: ",").compactMap { Int64($0) }
                #expect(previewed.count == 5)
                // An incident goes on: another MS020 dead letter arrives after the preview.
                try await db.execute(
                    """
                    INSERT INTO push.dead_jobs (id, topic, device_token, payload, push_type, environment, credential, run_at,
                                                apns_id, attempts, status, reason, trap_ids, created_at, error)
                    VALUES (2000000000, 'com.example.app', '\(String(repeating: "cd", count: 32))', '{}', 'alert', 'production',
                            'default', now(), gen_random_uuid(), 1, 410, 'Unregistered', '{MS020}', now(), 'late')
                    """
                )
                let noIDs = try await http(
                    "POST",
                    port: port,
                    "/dead/replay",
                    headers: ["Cookie": cookie],
                    form: ["died_with": "MS020", "csrf": csrf]
                )
                #expect(noIDs.status == 400)
                let done = try await http(
                    "POST",
                    port: port,
                    "/dead/replay",
                    headers: ["Cookie": cookie],
                    form: ["died_with": "MS020", "confirm_ids": confirmIDs, "csrf": csrf]
                )
                #expect(done.status == 200 && done.body.contains("Replayed 5 dead letter(s)"))
                #expect(
                    try await db.int64s("SELECT id FROM push.dead_jobs WHERE 'MS020' = ANY (trap_ids)") == [
                        2_000_000_000
                    ]
                )

                // Purge: the preview's cut-off, not the confirm's clock.
                try await db.execute(
                    "UPDATE push.dead_jobs SET dead_at = now() - interval '40 days' WHERE id <> 2000000000"
                )
                let purgePreview = try await http(
                    "GET",
                    port: port,
                    "/dead/purge?older_than=30d",
                    headers: ["Cookie": cookie]
                )
                let cutoff = try #require(
                    purgePreview.body.firstMatch(of: /name="cutoff" value="([0-9]+)"/).map { String($0.1) }
                )
                let before = try await db.int64("SELECT count(*) FROM push.dead_jobs WHERE id <> 2000000000")
                #expect(purgePreview.body.contains("\(before) dead letter(s) died more than 30d ago"))
                // One that crosses the line after the preview (died a second after its cut-off) stays.
                try await db.execute(
                    "UPDATE push.dead_jobs SET dead_at = timestamptz 'epoch' + (\(cutoff) + 1000000) * interval '1 microsecond' WHERE id = 2000000000"
                )
                let purged = try await http(
                    "POST",
                    port: port,
                    "/dead/purge",
                    headers: ["Cookie": cookie],
                    form: ["older_than": "30d", "cutoff": cutoff, "csrf": csrf]
                )
                #expect(purged.status == 200 && purged.body.contains("Deleted \(before) dead letter(s)"))
                #expect(try await db.int64s("SELECT id FROM push.dead_jobs") == [2_000_000_000])
            }
        }
    }

    @Test func hostileStringsAreEscapedAndTiedDeadLettersPageOnce() async throws {
        try await TestPostgres.withDatabase { db in
            try await ConsoleFixture.load(on: db.client, logger: db.logger)
            // Every dead letter died in the same microsecond (one batch does that): the keyset's id
            // tie-break must still give each exactly once.
            try await db.execute("UPDATE push.dead_jobs SET dead_at = now() - interval '5 minutes'")
            try await db.execute(
                """
                UPDATE push.dead_jobs SET error = '<script>alert(1)</script> "quoted" & <img src=x onerror=alert(2)>',
                       reason = '<b>Bad</b>'
                 WHERE id = (SELECT min(id) FROM push.dead_jobs)
                """
            )
            try await withConsole(db) { port in
                var seen: [Int64] = []
                var next: String? = "/dead?limit=4"
                while let path = next {
                    let page = try await http("GET", port: port, path.replacingOccurrences(of: "&amp;", with: "&"))
                    #expect(page.status == 200)
                    seen += page.body.matches(of: /<a href="\/dead\/(\d+)">/).compactMap { Int64($0.1) }
                    next = page.body.firstMatch(of: /<a class="button" href="(\/dead\?[^"]*)">Older/).map {
                        String($0.1)
                    }
                    #expect(seen.count <= 30)
                }
                #expect(seen == (try await db.int64s("SELECT id FROM push.dead_jobs ORDER BY id DESC")))

                let dead = try await http("GET", port: port, "/dead")
                #expect(!dead.body.contains("<script>alert(1)"))
                #expect(!dead.body.contains("<img src=x"))
                #expect(!dead.body.contains("<b>Bad</b>"))
                #expect(dead.body.contains("&lt;script&gt;alert(1)&lt;/script&gt; &quot;quoted&quot; &amp; &lt;img"))
                #expect(dead.body.contains("&lt;b&gt;Bad&lt;/b&gt;"))
            }
        }
    }
}
