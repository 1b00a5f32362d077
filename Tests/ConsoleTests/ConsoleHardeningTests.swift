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
                let reader = try await viewer(port: port)
                for path in [
                    "/dead?since=1e13s", "/dead?since=infd", "/dead?since=nand", "/dead?since=-5h",
                    "/dead/purge?older_than=200000000d", "/dead/purge?older_than=infh",
                    "/dead/replay?trap=MS020&expires_in=1e300s", "/dead?after=9223372036854775807-1",
                    "/dead?after=-5-1", "/dead?after=abc", "/dead?limit=100000", "/dead?ids=1,x",
                ] {
                    let result = try await http("GET", port: port, path, headers: reader)
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
                let reader = try await viewer(port: port)
                var seen: [Int64] = []
                var next: String? = "/dead?limit=4"
                while let path = next {
                    let page = try await http(
                        "GET",
                        port: port,
                        path.replacingOccurrences(of: "&amp;", with: "&"),
                        headers: reader
                    )
                    #expect(page.status == 200)
                    seen += page.body.matches(of: /<a href="\/dead\/(\d+)">/).compactMap { Int64($0.1) }
                    next = page.body.firstMatch(of: /<a class="button" href="(\/dead\?[^"]*)">Older/).map {
                        String($0.1)
                    }
                    #expect(seen.count <= 30)
                }
                #expect(seen == (try await db.int64s("SELECT id FROM push.dead_jobs ORDER BY id DESC")))

                let dead = try await http("GET", port: port, "/dead", headers: reader)
                #expect(!dead.body.contains("<script>alert(1)"))
                #expect(!dead.body.contains("<img src=x"))
                #expect(!dead.body.contains("<b>Bad</b>"))
                #expect(dead.body.contains("&lt;script&gt;alert(1)&lt;/script&gt; &quot;quoted&quot; &amp; &lt;img"))
                #expect(dead.body.contains("&lt;b&gt;Bad&lt;/b&gt;"))
            }
        }
    }

    @Test func readsNeedASessionAndPayloadReadsAreLogged() async throws {
        try await TestPostgres.withDatabase { db in
            try await ConsoleFixture.load(on: db.client, logger: db.logger)
            let deadID = try await db.int64("SELECT min(id) FROM push.dead_jobs")
            let jobID = try await db.int64("SELECT min(id) FROM push.jobs WHERE state = 'delivered'")
            let logs = LogCapture()
            try await withConsole(db, token: consoleToken, logs: logs) { port in
                // Anyone who reaches the port: counts and the chart, no topic, reason, worker or sentence.
                let overview = try await http("GET", port: port, "/")
                #expect(overview.status == 200 && overview.body.contains("due now"))
                #expect(overview.body.contains("<svg class=\"chart\""))
                for secret in ["com.example.paused", "fixture pause", "worker-a", "Unregistered"] {
                    #expect(!overview.body.contains(secret), "the anonymous overview shows \(secret)")
                }
                for path in [
                    "/dead", "/dead?topic=com.example.app", "/dead/\(deadID)", "/dead/\(deadID)?payload=1",
                    "/jobs/\(jobID)", "/jobs/\(jobID)?payload=1", "/jobs?id=\(jobID)", "/dead/replay?trap=MS020",
                    "/dead/purge?older_than=1h",
                ] {
                    let page = try await http("GET", port: port, path)
                    #expect(page.status == 403 && page.body.contains("Sign in"), "\(path): \(page.status)")
                    #expect(!page.body.contains("Order shipped") && !page.body.contains("com.example"), "\(path)")
                }
                // A viewer reads, and a payload read is logged with the name.
                let reader = try await viewer(port: port)
                let payload = try await http("GET", port: port, "/dead/\(deadID)?payload=1", headers: reader)
                #expect(payload.status == 200 && payload.body.contains("Order shipped"))
                let read = logs.entries.filter { $0.message == "console payload read" }
                #expect(read.count == 1)
                #expect(read.first?.metadata["operator"]?.description == "vera")
                #expect(read.first?.metadata["of"]?.description == "dead letter \(deadID)")
                #expect(!logs.text.contains("Order shipped"))
            }
            // No token at all: counts only, and the refusal says how to allow reads.
            try await withConsole(db, viewerToken: nil) { port in
                let page = try await http("GET", port: port, "/jobs/\(jobID)")
                #expect(page.status == 403 && page.body.contains("--viewer-token-file"))
                let overview = try await http("GET", port: port, "/")
                #expect(overview.body.contains("counts only") && !overview.body.contains("worker-a"))
            }
        }
    }

    @Test func aViewerReadsButChangesNothing() async throws {
        try await TestPostgres.withDatabase { db in
            try await ConsoleFixture.load(on: db.client, logger: db.logger)
            try await withConsole(db, token: consoleToken) { port in
                let (cookie, csrf) = try await signIn(port: port, name: "vera", token: consoleViewerToken)
                let overview = try await http("GET", port: port, "/", headers: ["Cookie": cookie])
                #expect(overview.body.contains("worker-a") && overview.body.contains("vera (viewer)"))
                #expect(!overview.body.contains("action=\"/pause\""))
                for (path, form) in [
                    ("/pause", ["topic": "x", "reason": "r"]), ("/resume", ["topic": "com.example.paused"]),
                    ("/dead/replay", ["trap": "MS020", "confirm_ids": "1"]),
                    ("/dead/purge", ["older_than": "1h", "cutoff": "0"]),
                ] {
                    var signed = form
                    signed["csrf"] = csrf
                    let refused = try await http("POST", port: port, path, headers: ["Cookie": cookie], form: signed)
                    #expect(refused.status == 403 && refused.body.contains("viewer token"), "\(path)")
                }
                #expect(try await db.int64("SELECT count(*) FROM push.pauses WHERE topic = 'x'") == 0)
                #expect(try await db.int64("SELECT count(*) FROM push.dead_jobs") == 30)
                let out = try await http(
                    "POST",
                    port: port,
                    "/logout",
                    headers: ["Cookie": cookie],
                    form: ["csrf": csrf]
                )
                #expect(out.status == 303)
                #expect(try await http("GET", port: port, "/dead", headers: ["Cookie": cookie]).status == 403)
            }
        }
    }

    @Test func deliverOnceSaysWhatItDoes() async throws {
        try await TestPostgres.withDatabase { db in
            try await ConsoleFixture.load(on: db.client, logger: db.logger)
            let jobID = try await db.int64("SELECT min(id) FROM push.jobs WHERE state = 'delivered'")
            try await db.execute("UPDATE push.jobs SET deliver_once = true WHERE id = \(jobID)")
            try await withConsole(db) { port in
                let page = try await http("GET", port: port, "/jobs/\(jobID)", headers: try await viewer(port: port))
                #expect(page.status == 200)
                #expect(!page.body.contains("never sent twice"))
                #expect(
                    page.body.contains("apns-expiration: 0") && page.body.contains("can still reach the device twice")
                )
            }
        }
    }

    @Test func theSessionCookieIsSecureOverHTTPS() async throws {
        try await TestPostgres.withDatabase { db in
            try await withConsole(
                db,
                token: consoleToken,
                publicHosts: ["https://ops.example.com:8443", "plain.example"]
            ) {
                port in
                func cookie(_ headers: [String: String]) async throws -> String {
                    let login = try await http(
                        "POST",
                        port: port,
                        "/login",
                        headers: headers,
                        form: ["operator": "alice", "token": consoleToken]
                    )
                    #expect(login.status == 303)
                    return login.header("Set-Cookie") ?? ""
                }
                let loopback = try await cookie([:])
                let plain = try await cookie(["Host": "plain.example"])
                let declared = try await cookie(["Host": "ops.example.com:8443"])
                let forwarded = try await cookie(["Host": "plain.example", "X-Forwarded-Proto": "https"])
                #expect(!loopback.contains("Secure") && !plain.contains("Secure"))
                #expect(declared.contains("Secure") && forwarded.contains("Secure"))
            }
        }
    }

    @Test(
        "without a declared proxy, X-Forwarded-For is the client's own word: naming a new address in each attempt escapes no throttle"
    )
    func forwardedForIgnoredWithoutAProxy() async throws {
        try await TestPostgres.withDatabase { db in
            try await withConsole(db, token: consoleToken) { port in
                var statuses: [Int] = []
                for n in 1...15 {
                    statuses.append(
                        try await http(
                            "POST",
                            port: port,
                            "/login",
                            headers: ["X-Forwarded-For": "198.51.100.\(n)"],
                            form: ["operator": "mallory", "token": "guess-\(n)-0123456789abcdef"]
                        ).status
                    )
                }
                #expect(statuses == Array(repeating: 403, count: 10) + Array(repeating: 429, count: 5), "\(statuses)")
            }
        }
    }

    @Test func failedSignInsAreThrottled() async throws {
        try await TestPostgres.withDatabase { db in
            let logs = LogCapture()
            // Behind a declared reverse proxy (--public-host), the address it adds to X-Forwarded-For is the client.
            try await withConsole(db, token: consoleToken, publicHosts: ["ops.example.com"], logs: logs) { port in
                for n in 1...10 {
                    let wrong = try await http(
                        "POST",
                        port: port,
                        "/login",
                        form: ["operator": "mallory", "token": "guess-\(n)-0123456789abcdef"]
                    )
                    #expect(wrong.status == 403)
                }
                // The eleventh from that address is refused before the token is compared, even the right one.
                let right = try await http(
                    "POST",
                    port: port,
                    "/login",
                    form: ["operator": "alice", "token": consoleToken]
                )
                #expect(right.status == 429 && right.body.contains("Too many failed sign-ins"))
                #expect(right.sessionCookie == nil)
                #expect(logs.entries.filter { $0.message.contains("wrong token") }.count == 10)
                // Another client (behind a proxy on this machine, named by X-Forwarded-For) is not locked out.
                let elsewhere = try await http(
                    "POST",
                    port: port,
                    "/login",
                    headers: ["X-Forwarded-For": "203.0.113.7"],
                    form: ["operator": "alice", "token": consoleToken]
                )
                #expect(elsewhere.status == 303 && elsewhere.sessionCookie != nil)
                // A client that failed ten times is refused from then on, whatever it sends.
                var statuses: [Int] = []
                for n in 1...12 {
                    statuses.append(
                        try await http(
                            "POST",
                            port: port,
                            "/login",
                            headers: ["X-Forwarded-For": "198.51.100.9"],
                            form: ["operator": "mallory", "token": "guess-\(n)-0123456789abcdef"]
                        ).status
                    )
                }
                #expect(statuses == Array(repeating: 403, count: 10) + [429, 429])
            }
        }
    }

    @Test func deadLetterGroupsReadAtMostTheNewestCapAndSaySo() async throws {
        try await TestPostgres.withDatabase { db in
            try await ConsoleFixture.load(on: db.client, logger: db.logger, dead: 30)
            let all = try await db.queue.operations.deadLetterGroups(matching: DeadLetterFilter(limit: 0))
            #expect(all.reduce(0) { $0 + $1.count } == 30 && all.allSatisfy { $0.sampledNewest == nil })
            let capped = try await db.queue.operations.deadLetterGroups(
                matching: DeadLetterFilter(limit: 0),
                newest: 10
            )
            #expect(capped.reduce(0) { $0 + $1.count } == 10)
            #expect(capped.allSatisfy { $0.sampledNewest == 10 })
            // Exactly at the cap: exact.
            let exact = try await db.queue.operations.deadLetterGroups(matching: DeadLetterFilter(limit: 0), newest: 30)
            #expect(exact.allSatisfy { $0.sampledNewest == nil })
        }
    }
}
